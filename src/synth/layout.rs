//! The tensor list of a shape: names, ggml `ne` and initialisation, in the order llama.cpp's
//! converter writes them (compare tests/fixtures/tiny-*.F16.gguf).

use super::shapes::ShapeParams;
use super::weights::Init;

/// One tensor to synthesize.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    /// ggml `ne`: `ne[0]` is the row length.
    pub ne: Vec<u64>,
    pub init: Init,
    /// Block index of `blk.N.*` tensors.
    pub layer: Option<usize>,
}

impl TensorSpec {
    pub fn row_len(&self) -> usize {
        self.ne.first().copied().unwrap_or(0) as usize
    }
    pub fn n_rows(&self) -> usize {
        self.ne.iter().skip(1).product::<u64>() as usize
    }
}

/// RMSNorm weights are stored as `1 + w` with HF's zero-centred `w ~ U(-0.25, 0.25)`.
const NORM: Init = Init::Uniform { lo: 0.75, hi: 1.25 };

/// A linear layer `[out, in]` initialised N(0, 1/sqrt(in)) (the fixture recipe).
fn linear(fan_in: usize) -> Init {
    Init::Normal {
        std: 1.0 / (fan_in as f32).sqrt(),
    }
}

/// Every tensor of the model, in converter order.
pub fn tensors(p: &ShapeParams) -> Vec<TensorSpec> {
    let mut out = Vec::new();
    let mut push = |name: String, ne: &[usize], init: Init, layer: Option<usize>| {
        out.push(TensorSpec {
            name,
            ne: ne.iter().map(|&d| d as u64).collect(),
            init,
            layer,
        })
    };
    let e = p.n_embd;
    // Tied models keep a smaller embedding (N(0, 0.5)); untied ones pair N(0, 1) embeddings
    // with an N(0, 0.5) LM head. Embedding scale does not matter (RMSNorm follows).
    let embd_init = Init::Normal {
        std: if p.tied { 0.5 } else { 1.0 },
    };
    // HF's `lm_head` sorts before `model.*`, so the converter writes it first.
    if !p.tied {
        push("output.weight".into(), &[e, p.n_vocab], Init::Normal { std: 0.5 }, None);
    }
    push("token_embd.weight".into(), &[e, p.n_vocab], embd_init, None);

    for i in 0..p.n_layer {
        let b = |s: &str| format!("blk.{i}.{s}");
        let l = Some(i);
        push(b("attn_norm.weight"), &[e], NORM, l);
        if !p.is_full_attention(i) {
            // Gated DeltaNet, HF `linear_attn.*` in name order: A_log, conv1d, dt_bias,
            // in_proj_a, in_proj_b, in_proj_qkv, in_proj_z, norm, out_proj.
            push(b("ssm_a"), &[p.hv], Init::Uniform { lo: -4.0, hi: -0.02 }, l);
            push(
                b("ssm_conv1d.weight"),
                &[p.conv_kernel, p.conv_dim()],
                Init::Uniform { lo: -0.6, hi: 0.6 },
                l,
            );
            push(b("ssm_dt.bias"), &[p.hv], Init::Uniform { lo: -1.0, hi: 1.0 }, l);
            push(b("ssm_alpha.weight"), &[e, p.hv], linear(e), l);
            push(b("ssm_beta.weight"), &[e, p.hv], linear(e), l);
            push(b("attn_qkv.weight"), &[e, p.conv_dim()], linear(e), l);
            push(b("attn_gate.weight"), &[e, p.value_dim()], linear(e), l);
            // The gated norm is used as-is (not 1 + w), initialised around 1.
            push(b("ssm_norm.weight"), &[p.dv], NORM, l);
            push(b("ssm_out.weight"), &[p.value_dim(), e], linear(p.value_dim()), l);
        }
        if p.is_moe() {
            let (x, f, s) = (p.n_expert, p.n_ff_exp, p.n_ff_shexp);
            push(b("ffn_down_exps.weight"), &[f, e, x], linear(f), l);
            push(b("ffn_gate_exps.weight"), &[e, f, x], linear(e), l);
            push(b("ffn_up_exps.weight"), &[e, f, x], linear(e), l);
            let router = Init::Normal {
                std: 2.0 / (e as f32).sqrt(),
            };
            push(b("ffn_gate_inp.weight"), &[e, x], router, l);
            push(b("ffn_down_shexp.weight"), &[s, e], linear(s), l);
            push(b("ffn_gate_shexp.weight"), &[e, s], linear(e), l);
            push(b("ffn_up_shexp.weight"), &[e, s], linear(e), l);
            push(b("ffn_gate_inp_shexp.weight"), &[e, 1], linear(e), l);
        } else {
            push(b("ffn_down.weight"), &[p.n_ff, e], linear(p.n_ff), l);
            push(b("ffn_gate.weight"), &[e, p.n_ff], linear(e), l);
            push(b("ffn_up.weight"), &[e, p.n_ff], linear(e), l);
        }
        push(b("post_attention_norm.weight"), &[e], NORM, l);
        if p.is_full_attention(i) {
            // HF `self_attn.*` sorts after `post_attention_layernorm`.
            let d = p.head_dim;
            let kv = p.n_head_kv * d;
            push(b("attn_k_norm.weight"), &[d], NORM, l);
            push(b("attn_k.weight"), &[e, kv], linear(e), l);
            push(b("attn_output.weight"), &[p.n_head * d, e], linear(p.n_head * d), l);
            push(b("attn_q_norm.weight"), &[d], NORM, l);
            // Query and output gate interleaved per head: 2 * n_head * D rows.
            push(b("attn_q.weight"), &[e, 2 * p.n_head * d], linear(e), l);
            push(b("attn_v.weight"), &[e, kv], linear(e), l);
        }
    }
    push("output_norm.weight".into(), &[e], NORM, None);
    out
}
