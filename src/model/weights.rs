//! Binding of GGUF tensors to the model's weights (spec/MODEL.md §3), checked once at load.
//!
//! Matrices are uploaded in their block format (kernels dequantize); vectors, the conv taps and
//! the MoE routers are small, so they are dequantized to f32 on the host (whatever their type).

use std::sync::Arc;

use crate::backend::{Backend, Tensor, WeightData};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorBytes, TensorInfo};
use crate::model::config::{Arch, Config};
use crate::model::source::TensorSource;

/// Weights of a Gated DeltaNet mixer.
pub struct GdnWeights {
    pub qkv: Tensor,
    pub gate: Tensor,
    pub beta: Tensor,
    pub alpha: Tensor,
    /// F32 `[conv_dim, K]`.
    pub conv1d: Tensor,
    pub dt_bias: Tensor,
    pub ssm_a: Tensor,
    pub ssm_norm: Tensor,
    pub out: Tensor,
}

/// Weights of a gated full-attention mixer.
pub struct AttnWeights {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub q_norm: Tensor,
    pub k_norm: Tensor,
    pub out: Tensor,
}

pub enum Mixer {
    Gdn(GdnWeights),
    Attn(AttnWeights),
}

#[allow(clippy::large_enum_variant)] // one per layer; boxing buys nothing
pub enum Ffn {
    Dense {
        gate: Tensor,
        up: Tensor,
        down: Tensor,
    },
    Moe {
        /// F32 `[n_expert, n_embd]`.
        router: Tensor,
        gate_exps: Tensor,
        up_exps: Tensor,
        down_exps: Tensor,
        /// F32 `[1, n_embd]`: one logit per token for the shared expert's sigmoid gate.
        shexp_gate: Tensor,
        gate_sh: Tensor,
        up_sh: Tensor,
        down_sh: Tensor,
    },
}

pub struct Layer {
    pub attn_norm: Tensor,
    pub post_norm: Tensor,
    pub mixer: Mixer,
    pub ffn: Ffn,
}

pub struct Weights {
    pub token_embd: Tensor,
    pub output_norm: Tensor,
    /// `output.weight`, or `token_embd.weight` when the embeddings are tied.
    pub output: Tensor,
    pub layers: Vec<Layer>,
}

/// Loads tensors one by one, checking names, shapes and types, and reports progress.
struct Binder<'a> {
    file: &'a GgufFile,
    /// Where the tensor bytes come from (usually `file` itself).
    src: &'a dyn TensorSource,
    backend: &'a Arc<dyn Backend>,
    on_bytes: &'a mut dyn FnMut(u64),
}

/// Look up a tensor and check its shape (`ne`, ggml order) and that rill supports its type.
fn checked_info<'f>(file: &'f GgufFile, name: &str, ne: &[usize]) -> Result<&'f TensorInfo> {
    let t = file.tensor(name).ok_or_else(|| Error::tensor(name, "missing"))?;
    let want: Vec<u64> = ne.iter().map(|&x| x as u64).collect();
    // A one-row 2-D tensor may also be stored 1-D (ffn_gate_inp_shexp).
    let same = t.ne == want || (want.len() == 2 && want[1] == 1 && t.ne == want[..1]);
    if !same {
        return Err(Error::tensor(name, format!("shape {:?}, expected {:?}", t.ne, want)));
    }
    if !t.ggml_type.is_supported() {
        return Err(Error::UnsupportedType {
            tensor: name.to_string(),
            type_name: t.ggml_type.name().to_string(),
            type_id: t.ggml_type.id(),
        });
    }
    Ok(t)
}

/// Where a tensor's bytes lie in the file: absolute start and length.
fn byte_range(file: &GgufFile, t: &TensorInfo) -> Result<(u64, usize)> {
    let start = file.data_start.checked_add(t.offset);
    let len = usize::try_from(t.n_bytes).ok();
    match (start, len) {
        (Some(start), Some(len)) => Ok((start, len)),
        _ => Err(Error::tensor(
            &t.name,
            format!("{} bytes do not fit in memory", t.n_bytes),
        )),
    }
}

impl Binder<'_> {
    /// A matrix kept in its block format. `ne` in ggml order.
    async fn matrix(&mut self, name: &str, ne: &[usize]) -> Result<Tensor> {
        let t = checked_info(self.file, name, ne)?;
        let shape: Vec<usize> = ne.iter().rev().copied().collect();
        let (start, len) = byte_range(self.file, t)?;
        // Pieces are whole u32 words so they land at aligned device offsets.
        let piece = (self.src.max_read() & !3).max(4);
        if len <= piece {
            let w = WeightData {
                name: name.to_string(),
                ggml_type: t.ggml_type,
                shape,
                bytes: self.src.read(start, len).await?,
            };
            let out = self.backend.upload_weight(&w)?;
            (self.on_bytes)(t.n_bytes);
            return Ok(out);
        }
        let mut upload = self.backend.begin_weight(name, t.ggml_type, &shape)?;
        // Without a streaming path the backend needs the whole tensor: collect the pieces.
        let mut collected = match upload {
            Some(_) => Vec::new(),
            None => crate::alloc::vec_with_capacity(len, name)?,
        };
        let mut done = 0;
        while done < len {
            let n = piece.min(len - done);
            let bytes = self.src.read(start + done as u64, n).await?;
            match upload.as_mut() {
                Some(u) => u.write(bytes.as_slice())?,
                None => collected.extend_from_slice(bytes.as_slice()),
            }
            done += n;
            (self.on_bytes)(n as u64);
        }
        match upload {
            Some(u) => u.finish(),
            None => self.backend.upload_weight(&WeightData {
                name: name.to_string(),
                ggml_type: t.ggml_type,
                shape,
                bytes: TensorBytes::from_vec(collected),
            }),
        }
    }

    /// A small tensor dequantized to f32 on the host. `ne` in ggml order.
    async fn f32(&mut self, name: &str, ne: &[usize]) -> Result<Tensor> {
        let t = checked_info(self.file, name, ne)?;
        // The shape matched the config's, whose dimensions fit in memory individually; the
        // product may not, so the buffer is allocated fallibly.
        let n = usize::try_from(t.n_elements).map_err(|_| Error::tensor(name, "too many elements"))?;
        let (start, len) = byte_range(self.file, t)?;
        let bytes = self.src.read(start, len).await?;
        let mut v = crate::alloc::vec_filled(n, 0f32, name)?;
        crate::quant::dequantize(t.ggml_type, bytes.as_slice(), &mut v)
            .map_err(|e| Error::tensor(name, e.to_string()))?;
        let shape: Vec<usize> = if ne.len() == 2 && ne[1] == 1 && t.ne.len() == 1 {
            vec![1, ne[0]]
        } else {
            ne.iter().rev().copied().collect()
        };
        let out = self.backend.upload_f32(&v, &shape)?;
        (self.on_bytes)(t.n_bytes);
        Ok(out)
    }
}

impl Weights {
    /// Bind and upload every trunk tensor of `file`, reading the bytes from `src` (the file itself
    /// when it is mapped) and awaiting each read. `on_bytes(n)` is called as tensor bytes are
    /// uploaded, with the count just done.
    pub async fn load_from(
        file: &GgufFile,
        src: &dyn TensorSource,
        cfg: &Config,
        backend: &Arc<dyn Backend>,
        on_bytes: &mut dyn FnMut(u64),
    ) -> Result<Weights> {
        // Every tensor against the device's limits first: a model that cannot run fails before
        // gigabytes are uploaded, naming the tensor and the limit.
        for t in &file.tensors {
            backend.check_weight_fits(&t.name, t.ggml_type, &t.shape(), t.n_bytes)?;
        }
        let mut b = Binder {
            file,
            src,
            backend,
            on_bytes,
        };
        let d = cfg.n_embd;
        let v = cfg.n_vocab;
        let token_embd = b.matrix("token_embd.weight", &[d, v]).await?;
        let output_norm = b.f32("output_norm.weight", &[d]).await?;
        let output = if file.tensor("output.weight").is_some() {
            b.matrix("output.weight", &[d, v]).await?
        } else {
            token_embd.clone()
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            layers.push(load_layer(&mut b, cfg, i).await?);
        }
        Ok(Weights {
            token_embd,
            output_norm,
            output,
            layers,
        })
    }
}

async fn load_layer(b: &mut Binder<'_>, cfg: &Config, i: usize) -> Result<Layer> {
    let d = cfg.n_embd;
    let p = |s: &str| format!("blk.{i}.{s}");
    let attn_norm = b.f32(&p("attn_norm.weight"), &[d]).await?;
    let post_norm = b.f32(&p("post_attention_norm.weight"), &[d]).await?;
    let mixer = if cfg.is_linear[i] {
        let g = cfg.gdn;
        let (kd, vd, cd) = (g.key_dim(), g.value_dim(), g.conv_dim());
        debug_assert_eq!(cd, 2 * kd + vd);
        Mixer::Gdn(GdnWeights {
            qkv: b.matrix(&p("attn_qkv.weight"), &[d, cd]).await?,
            gate: b.matrix(&p("attn_gate.weight"), &[d, vd]).await?,
            beta: b.matrix(&p("ssm_beta.weight"), &[d, g.hv]).await?,
            alpha: b.matrix(&p("ssm_alpha.weight"), &[d, g.hv]).await?,
            conv1d: b.f32(&p("ssm_conv1d.weight"), &[cfg.conv_kernel, cd]).await?,
            dt_bias: b.f32(&p("ssm_dt.bias"), &[g.hv]).await?,
            ssm_a: b.f32(&p("ssm_a"), &[g.hv]).await?,
            ssm_norm: b.f32(&p("ssm_norm.weight"), &[g.dv]).await?,
            out: b.matrix(&p("ssm_out.weight"), &[vd, d]).await?,
        })
    } else {
        let a = cfg.attn;
        let hd = a.head_dim;
        Mixer::Attn(AttnWeights {
            q: b.matrix(&p("attn_q.weight"), &[d, 2 * a.n_head * hd]).await?,
            k: b.matrix(&p("attn_k.weight"), &[d, a.n_head_kv * hd]).await?,
            v: b.matrix(&p("attn_v.weight"), &[d, a.n_head_kv * hd]).await?,
            q_norm: b.f32(&p("attn_q_norm.weight"), &[hd]).await?,
            k_norm: b.f32(&p("attn_k_norm.weight"), &[hd]).await?,
            out: b.matrix(&p("attn_output.weight"), &[a.n_head * hd, d]).await?,
        })
    };
    let ffn = match (cfg.arch, &cfg.moe) {
        (Arch::Qwen35Moe, Some(m)) => {
            if b.file.tensor(&p("ffn_gate_up_exps.weight")).is_some()
                && b.file.tensor(&p("ffn_gate_exps.weight")).is_none()
            {
                return Err(Error::tensor(
                    p("ffn_gate_up_exps.weight"),
                    "fused gate/up expert tensors are not supported yet (convert without expert fusion)",
                ));
            }
            Ffn::Moe {
                router: b.f32(&p("ffn_gate_inp.weight"), &[d, m.n_expert]).await?,
                gate_exps: b
                    .matrix(&p("ffn_gate_exps.weight"), &[d, m.n_ff_exp, m.n_expert])
                    .await?,
                up_exps: b.matrix(&p("ffn_up_exps.weight"), &[d, m.n_ff_exp, m.n_expert]).await?,
                down_exps: b
                    .matrix(&p("ffn_down_exps.weight"), &[m.n_ff_exp, d, m.n_expert])
                    .await?,
                shexp_gate: b.f32(&p("ffn_gate_inp_shexp.weight"), &[d, 1]).await?,
                gate_sh: b.matrix(&p("ffn_gate_shexp.weight"), &[d, m.n_ff_shexp]).await?,
                up_sh: b.matrix(&p("ffn_up_shexp.weight"), &[d, m.n_ff_shexp]).await?,
                down_sh: b.matrix(&p("ffn_down_shexp.weight"), &[m.n_ff_shexp, d]).await?,
            }
        }
        _ => Ffn::Dense {
            gate: b.matrix(&p("ffn_gate.weight"), &[d, cfg.n_ff]).await?,
            up: b.matrix(&p("ffn_up.weight"), &[d, cfg.n_ff]).await?,
            down: b.matrix(&p("ffn_down.weight"), &[cfg.n_ff, d]).await?,
        },
    };
    Ok(Layer {
        attn_norm,
        post_norm,
        mixer,
        ffn,
    })
}
