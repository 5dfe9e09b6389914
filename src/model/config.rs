//! Hyper-parameters of a Qwen3.5 model, read from GGUF metadata exactly as spec/MODEL.md §2 says.

use crate::backend::{AttnDims, GdnDims};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Value};

/// Which Qwen3.5 variant a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Dense SwiGLU FFN (`qwen35`).
    Qwen35,
    /// Routed experts + sigmoid-gated shared expert (`qwen35moe`).
    Qwen35Moe,
}

impl Arch {
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
        }
    }
}

/// Mixture-of-experts hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    /// Multiplier on the renormalised routing weights (1.0 unless the file says otherwise).
    pub weights_scale: f32,
}

/// Everything the executor needs to know about the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub name: String,
    pub n_embd: usize,
    /// Trunk depth: `block_count - nextn_predict_layers` (MTP blocks are never run).
    pub n_layer: usize,
    pub n_vocab: usize,
    /// Trained context length (informational; the session's context is chosen by the user).
    pub context_length: usize,
    pub eps: f32,
    /// `is_linear[i]`: layer i is Gated DeltaNet (else gated full attention).
    pub is_linear: Vec<bool>,
    pub gdn: GdnDims,
    pub conv_kernel: usize,
    pub attn: AttnDims,
    /// Rotated dims per head (partial NeoX RoPE).
    pub n_rot: usize,
    pub rope_theta: f32,
    /// Dense FFN width (0 for MoE).
    pub n_ff: usize,
    pub moe: Option<MoeConfig>,
}

fn key(arch: &str, k: &str) -> String {
    format!("{arch}.{k}")
}

fn meta_err(msg: impl Into<String>) -> Error {
    Error::Metadata(msg.into())
}

/// A non-negative integer from one metadata value, or a message saying what it is instead.
fn non_negative(k: &str, v: &Value) -> Result<u64> {
    if let Some(x) = v.as_u64() {
        return Ok(x);
    }
    Err(meta_err(match v.as_i64() {
        Some(x) => format!("'{k}' = {x} is negative"),
        None => format!("'{k}' has type {}, expected an integer", v.type_name()),
    }))
}

/// An integer key that may be a scalar or a per-layer array whose trunk entries must agree.
fn int_key(f: &GgufFile, k: &str, n_layer: Option<usize>) -> Result<Option<u64>> {
    let Some(v) = f.get(k) else { return Ok(None) };
    let Some(arr) = v.as_array() else {
        return non_negative(k, v).map(Some);
    };
    let take = n_layer.unwrap_or(arr.len()).min(arr.len());
    let mut first = None;
    for (i, x) in arr.iter().take(take).enumerate() {
        let x = non_negative(&format!("{k}[{i}]"), &x)?;
        match first {
            None => first = Some(x),
            Some(f) if f != x => {
                return Err(meta_err(format!(
                    "'{k}' differs between layers ({f} and {x}); rill needs one value for all layers"
                )))
            }
            Some(_) => {}
        }
    }
    first
        .map(Some)
        .ok_or_else(|| meta_err(format!("'{k}' is an empty array")))
}

fn req_int(f: &GgufFile, k: &str, n_layer: Option<usize>) -> Result<usize> {
    let v = int_key(f, k, n_layer)?.ok_or_else(|| meta_err(format!("missing required key '{k}'")))?;
    usize::try_from(v).map_err(|_| meta_err(format!("'{k}' = {v} is too large")))
}

fn opt_int(f: &GgufFile, k: &str, n_layer: Option<usize>) -> Result<Option<usize>> {
    match int_key(f, k, n_layer)? {
        None => Ok(None),
        Some(v) => usize::try_from(v)
            .map(Some)
            .map_err(|_| meta_err(format!("'{k}' = {v} is too large"))),
    }
}

fn opt_f32(f: &GgufFile, k: &str) -> Result<Option<f32>> {
    match f.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_f32()
            .map(Some)
            .ok_or_else(|| meta_err(format!("'{k}' has type {}, expected a float", v.type_name()))),
    }
}

/// Upper bound on any single dimension; rejects absurd metadata before it sizes an allocation.
const MAX_DIM: usize = 1 << 24;

fn check_dim(name: &str, v: usize) -> Result<usize> {
    if v == 0 || v > MAX_DIM {
        return Err(meta_err(format!("{name} = {v} is out of range")));
    }
    Ok(v)
}

/// Every `blk.N.*` tensor must belong to one of the `block_count` blocks: a file with more
/// layers than its `block_count` says would otherwise run as a silently truncated model.
fn check_layer_tensors(f: &GgufFile, block_count: usize) -> Result<()> {
    let beyond = f.tensors.iter().find_map(|t| {
        let rest = t.name.strip_prefix("blk.")?;
        let layer: usize = rest.split('.').next()?.parse().ok()?;
        (layer >= block_count).then_some((layer, &t.name))
    });
    match beyond {
        Some((layer, name)) => Err(meta_err(format!(
            "block_count is {block_count} but tensor '{name}' belongs to layer {layer}; \
             the file has more layers than its metadata says"
        ))),
        None => Ok(()),
    }
}

impl Config {
    /// Read and validate the hyper-parameters. `n_vocab` comes from `token_embd.weight`.
    pub fn from_gguf(f: &GgufFile) -> Result<Config> {
        let arch_value = f
            .get("general.architecture")
            .ok_or_else(|| meta_err("missing 'general.architecture'"))?;
        let arch_name = arch_value.as_str().ok_or_else(|| {
            meta_err(format!(
                "'general.architecture' has type {}, expected a string",
                arch_value.type_name()
            ))
        })?;
        let arch = match arch_name {
            "qwen35" => Arch::Qwen35,
            "qwen35moe" => Arch::Qwen35Moe,
            other => return Err(Error::UnsupportedArch(other.to_string())),
        };
        let a = arch.gguf_name();
        let name = f.get("general.name").and_then(Value::as_str).unwrap_or(a).to_string();

        let block_count = check_dim("block_count", req_int(f, &key(a, "block_count"), None)?)?;
        let nextn = opt_int(f, &key(a, "nextn_predict_layers"), None)?.unwrap_or(0);
        let n_layer = block_count.checked_sub(nextn).filter(|&n| n > 0).ok_or_else(|| {
            meta_err(format!(
                "nextn_predict_layers {nextn} leaves no trunk layers of {block_count}"
            ))
        })?;
        let nl = Some(n_layer);
        check_layer_tensors(f, block_count)?;

        let n_embd = check_dim("embedding_length", req_int(f, &key(a, "embedding_length"), nl)?)?;
        let context_length = opt_int(f, &key(a, "context_length"), nl)?.unwrap_or(4096);
        let n_head = check_dim("attention.head_count", req_int(f, &key(a, "attention.head_count"), nl)?)?;
        let n_head_kv = check_dim(
            "attention.head_count_kv",
            req_int(f, &key(a, "attention.head_count_kv"), nl)?,
        )?;
        let head_dim = check_dim("attention.key_length", req_int(f, &key(a, "attention.key_length"), nl)?)?;
        let value_len = req_int(f, &key(a, "attention.value_length"), nl)?;
        if value_len != head_dim {
            return Err(meta_err(format!(
                "attention.value_length {value_len} != key_length {head_dim}"
            )));
        }
        if n_head % n_head_kv != 0 {
            return Err(meta_err(format!(
                "head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        let eps = opt_f32(f, &key(a, "attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| meta_err(format!("missing required key '{a}.attention.layer_norm_rms_epsilon'")))?;
        // Comparisons are false for NaN, so NaN fails too.
        if !(eps > 0.0 && eps < 1.0) {
            return Err(meta_err(format!(
                "attention.layer_norm_rms_epsilon {eps} must be a number in (0, 1)"
            )));
        }
        let n_rot = req_int(f, &key(a, "rope.dimension_count"), nl)?;
        if n_rot == 0 || n_rot % 2 != 0 || n_rot > head_dim {
            return Err(meta_err(format!(
                "rope.dimension_count {n_rot} must be even and <= head dim {head_dim}"
            )));
        }
        let rope_theta = opt_f32(f, &key(a, "rope.freq_base"))?.unwrap_or(10_000.0);
        if !(rope_theta > 1.0 && rope_theta.is_finite()) {
            return Err(meta_err(format!(
                "rope.freq_base {rope_theta} must be a finite number > 1"
            )));
        }
        if let Some(t) = f.get(&key(a, "rope.scaling.type")).and_then(Value::as_str) {
            if t != "none" {
                return Err(meta_err(format!("rope.scaling.type '{t}' is not supported")));
            }
        }

        let conv_kernel = check_dim("ssm.conv_kernel", req_int(f, &key(a, "ssm.conv_kernel"), nl)?)?;
        let dk = check_dim("ssm.state_size", req_int(f, &key(a, "ssm.state_size"), nl)?)?;
        let hk = check_dim("ssm.group_count", req_int(f, &key(a, "ssm.group_count"), nl)?)?;
        let hv = check_dim("ssm.time_step_rank", req_int(f, &key(a, "ssm.time_step_rank"), nl)?)?;
        let inner = check_dim("ssm.inner_size", req_int(f, &key(a, "ssm.inner_size"), nl)?)?;
        if inner % hv != 0 {
            return Err(meta_err(format!(
                "ssm.inner_size {inner} is not a multiple of time_step_rank {hv}"
            )));
        }
        let dv = inner / hv;
        if dk != dv {
            return Err(meta_err(format!(
                "delta-net key dim {dk} != value dim {dv} (rill requires dk == dv)"
            )));
        }
        if hv % hk != 0 {
            return Err(meta_err(format!("value heads {hv} not a multiple of key heads {hk}")));
        }

        let is_linear = match f.get(&key(a, "attention.recurrent_layers")) {
            Some(v) => {
                let arr = v.as_array().ok_or_else(|| {
                    meta_err(format!(
                        "attention.recurrent_layers has type {}, expected an array",
                        v.type_name()
                    ))
                })?;
                // One entry per block, MTP blocks included (spec/MODEL.md §2).
                if arr.len() != block_count {
                    return Err(meta_err(format!(
                        "attention.recurrent_layers has {} entries but block_count is {block_count}",
                        arr.len()
                    )));
                }
                arr.iter()
                    .take(n_layer)
                    .enumerate()
                    .map(|(i, x)| {
                        x.as_bool().or_else(|| x.as_u64().map(|i| i != 0)).ok_or_else(|| {
                            meta_err(format!(
                                "attention.recurrent_layers[{i}] has type {}, expected bool",
                                x.type_name()
                            ))
                        })
                    })
                    .collect::<Result<Vec<bool>>>()?
            }
            None => {
                let interval = opt_int(f, &key(a, "full_attention_interval"), nl)?.unwrap_or(4);
                if interval == 0 {
                    return Err(meta_err("full_attention_interval is 0"));
                }
                (0..n_layer).map(|i| (i + 1) % interval != 0).collect()
            }
        };

        let (n_ff, moe) = match arch {
            Arch::Qwen35 => (
                check_dim("feed_forward_length", req_int(f, &key(a, "feed_forward_length"), nl)?)?,
                None,
            ),
            Arch::Qwen35Moe => {
                let n_expert = check_dim("expert_count", req_int(f, &key(a, "expert_count"), nl)?)?;
                let n_expert_used = check_dim("expert_used_count", req_int(f, &key(a, "expert_used_count"), nl)?)?;
                if n_expert_used > n_expert {
                    return Err(meta_err(format!(
                        "expert_used_count {n_expert_used} > expert_count {n_expert}"
                    )));
                }
                let n_ff = opt_int(f, &key(a, "feed_forward_length"), nl)?.unwrap_or(0);
                let n_ff_exp = match opt_int(f, &key(a, "expert_feed_forward_length"), nl)? {
                    Some(v) => v,
                    None => n_ff / n_expert_used,
                };
                let n_ff_shexp = opt_int(f, &key(a, "expert_shared_feed_forward_length"), nl)?.unwrap_or(n_ff);
                // 0 (or absent) means "not set" in converted files.
                let scale = opt_f32(f, &key(a, "expert_weights_scale"))?.unwrap_or(0.0);
                if !(scale.is_finite() && scale >= 0.0) {
                    return Err(meta_err(format!(
                        "expert_weights_scale {scale} must be a finite number >= 0 (0 = unset)"
                    )));
                }
                let weights_scale = if scale == 0.0 { 1.0 } else { scale };
                (
                    0,
                    Some(MoeConfig {
                        n_expert,
                        n_expert_used,
                        n_ff_exp: check_dim("expert_feed_forward_length", n_ff_exp)?,
                        n_ff_shexp: check_dim("expert_shared_feed_forward_length", n_ff_shexp)?,
                        weights_scale,
                    }),
                )
            }
        };

        let embd = f
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::tensor("token_embd.weight", "missing"))?;
        if embd.ne.len() != 2 || embd.ne[0] != n_embd as u64 {
            return Err(Error::tensor(
                "token_embd.weight",
                format!("shape {:?}, expected [{n_embd}, n_vocab]", embd.ne),
            ));
        }
        let n_vocab = check_dim("n_vocab", embd.ne[1] as usize)?;

        Ok(Config {
            arch,
            name,
            n_embd,
            n_layer,
            n_vocab,
            context_length,
            eps,
            is_linear,
            gdn: GdnDims { hk, hv, dk, dv },
            conv_kernel,
            attn: AttnDims {
                n_head,
                n_head_kv,
                head_dim,
            },
            n_rot,
            rope_theta,
            n_ff,
            moe,
        })
    }

    /// The tokenizer must have exactly one token per embedding row: fewer, and ids the model
    /// generates could not be decoded (they would vanish from the output); more, and the
    /// tokenizer could produce ids the model cannot embed.
    pub fn check_tokenizer_size(&self, n_tokens: usize) -> Result<()> {
        if n_tokens == self.n_vocab {
            return Ok(());
        }
        let consequence = if n_tokens < self.n_vocab {
            "ids it cannot decode could be generated"
        } else {
            "it could produce ids the model cannot embed"
        };
        Err(Error::Tokenizer(format!(
            "the tokenizer has {n_tokens} tokens but token_embd.weight has {} rows; {consequence}",
            self.n_vocab
        )))
    }

    pub fn n_linear_layers(&self) -> usize {
        self.is_linear.iter().filter(|&&l| l).count()
    }
}
