//! Hyper-parameters of the model shapes `rill synth` can write: the published Qwen3.5 text
//! configurations and the two tiny test fixtures. One table, one source note per row.

use crate::error::{Error, Result};

/// Everything needed to lay out a Qwen3.5 GGUF (names as in spec/MODEL.md §2).
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeParams {
    /// GGUF architecture: `qwen35` (dense) or `qwen35moe`.
    pub arch: &'static str,
    pub n_embd: usize,
    /// Trunk layers (no MTP blocks are written).
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Full-attention head dim `D` (key_length = value_length).
    pub head_dim: usize,
    /// Dense FFN width; 0 for MoE shapes (the converter writes no `feed_forward_length` there).
    pub n_ff: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    /// Delta-net key heads / value heads / key head dim / value head dim.
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    pub conv_kernel: usize,
    pub n_vocab: usize,
    /// Tied embeddings: no `output.weight`, the LM head is `token_embd`.
    pub tied: bool,
    pub rope_theta: f32,
    pub context_length: usize,
    /// Where the numbers come from.
    pub source: &'static str,
}

impl ShapeParams {
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }
    /// Layer `i` is a full-attention layer iff `(i + 1) % 4 == 0` (every Qwen3.5 config uses
    /// `full_attention_interval` 4; MODEL.md §2.1).
    pub fn is_full_attention(&self, i: usize) -> bool {
        (i + 1).is_multiple_of(FULL_ATTENTION_INTERVAL)
    }
    pub fn key_dim(&self) -> usize {
        self.hk * self.dk
    }
    pub fn value_dim(&self) -> usize {
        self.hv * self.dv
    }
    /// Channels of the causal conv: `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

/// The interval of full-attention layers (every 4th layer).
pub const FULL_ATTENTION_INTERVAL: usize = 4;
/// RMSNorm epsilon of every Qwen3.5 config.
pub const RMS_EPS: f32 = 1e-6;
/// Rotated dims per head: `head_dim * partial_rotary_factor` = 256 × 0.25.
pub const ROPE_DIMS: usize = 64;
/// M-RoPE sections as the converter writes them (`mrope_section` + a trailing 0).
pub const ROPE_SECTIONS: [i32; 4] = [11, 11, 10, 0];

/// Padded vocabulary of every released Qwen3.5 checkpoint (HF `vocab_size`).
const QWEN35_VOCAB: usize = 248_320;
/// Native context of the released checkpoints (`max_position_embeddings`).
const QWEN35_CTX: usize = 262_144;

/// Defaults shared by every row; each row overrides what differs.
const BASE: ShapeParams = ShapeParams {
    arch: "qwen35",
    n_embd: 0,
    n_layer: 0,
    n_head: 0,
    n_head_kv: 0,
    head_dim: 256,
    n_ff: 0,
    n_expert: 0,
    n_expert_used: 0,
    n_ff_exp: 0,
    n_ff_shexp: 0,
    hk: 16,
    hv: 16,
    dk: 128,
    dv: 128,
    conv_kernel: 4,
    n_vocab: QWEN35_VOCAB,
    tied: false,
    rope_theta: 10_000_000.0,
    context_length: QWEN35_CTX,
    source: "",
};

/// The shape table. `name` is what `--shape` takes.
const SHAPES: &[(&str, ShapeParams)] = &[
    (
        "qwen3.5-0.8b",
        ShapeParams {
            n_embd: 1024,
            n_layer: 24,
            n_head: 8,
            n_head_kv: 2,
            n_ff: 3584,
            hk: 16,
            hv: 16,
            tied: true,
            source: "HF Qwen/Qwen3.5-0.8B config.json text_config as quoted in public code \
                     (hidden 1024, 24 layers, inter 3584, heads 8/2, head_dim 256, linear heads \
                     16/16 dims 128, tie_word_embeddings true, rope_theta 1e7, ctx 262144); \
                     llama.cpp size switch: 24 layers + n_embd 1024 = 0.8B",
            ..BASE
        },
    ),
    (
        "qwen3.5-2b",
        ShapeParams {
            n_embd: 2048,
            n_layer: 24,
            n_head: 8,
            n_head_kv: 2,
            n_ff: 6144,
            hk: 16,
            hv: 16,
            tied: true,
            source: "HF Qwen/Qwen3.5-2B(-Base) config.json as quoted in public code (hidden 2048, \
                     24 layers, inter 6144, heads 8/2, head_dim 256, linear heads 16/16); \
                     tie_word_embeddings NOT confirmed, assumed true like 0.8B/4B",
            ..BASE
        },
    ),
    (
        "qwen3.5-4b",
        ShapeParams {
            n_embd: 2560,
            n_layer: 32,
            n_head: 16,
            n_head_kv: 4,
            n_ff: 9216,
            hk: 16,
            hv: 32,
            tied: true,
            source: "HF Qwen/Qwen3.5-4B(-Base) config.json as quoted in public code (hidden 2560, \
                     32 layers, inter 9216, heads 16/4, head_dim 256, linear heads 16/32, \
                     tie_word_embeddings true, rope_theta 1e7)",
            ..BASE
        },
    ),
    (
        "qwen3.5-9b",
        ShapeParams {
            n_embd: 4096,
            n_layer: 32,
            n_head: 16,
            n_head_kv: 4,
            n_ff: 12288,
            hk: 16,
            hv: 32,
            tied: false,
            source: "spec/MODEL.md §10 (HF Qwen3_5TextConfig defaults, '9B style'); untied; \
                     rope_theta 1e7 and ctx 262144 from the published config",
            ..BASE
        },
    ),
    (
        "qwen3.5-27b",
        ShapeParams {
            n_embd: 5120,
            n_layer: 64,
            n_head: 24,
            n_head_kv: 4,
            n_ff: 17408,
            hk: 16,
            hv: 48,
            tied: false,
            source: "spec/MODEL.md §10 (llama.cpp quant snapshot: 5120, 64 layers, heads 24/4, \
                     ff 17408) + HF Qwen/Qwen3.5-27B config.json as quoted in public code (head_dim \
                     256, linear heads 16/48 dims 128, tie_word_embeddings false)",
            ..BASE
        },
    ),
    (
        "qwen3.5-35b-a3b",
        ShapeParams {
            arch: "qwen35moe",
            n_embd: 2048,
            n_layer: 40,
            n_head: 16,
            n_head_kv: 2,
            n_expert: 256,
            n_expert_used: 8,
            n_ff_exp: 512,
            n_ff_shexp: 512,
            hk: 16,
            hv: 32,
            tied: false,
            source: "spec/MODEL.md §10 (HF Qwen3_5MoeTextConfig defaults, '35B-A3B style'); \
                     rope_theta 1e7 and ctx 262144 from the published config",
            ..BASE
        },
    ),
    (
        "tiny-dense",
        ShapeParams {
            n_embd: 64,
            n_layer: 8,
            n_head: 2,
            n_head_kv: 1,
            n_ff: 128,
            hk: 2,
            hv: 4,
            n_vocab: 8192,
            tied: true,
            context_length: 4096,
            source: "tests/fixtures/tiny-dense.config.json / tiny-dense.F16.gguf",
            ..BASE
        },
    ),
    (
        "tiny-moe",
        ShapeParams {
            arch: "qwen35moe",
            n_embd: 64,
            n_layer: 8,
            n_head: 2,
            n_head_kv: 1,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 64,
            n_ff_shexp: 64,
            hk: 2,
            hv: 4,
            n_vocab: 8192,
            tied: false,
            context_length: 4096,
            source: "tests/fixtures/tiny-moe.config.json / tiny-moe.F16.gguf",
            ..BASE
        },
    ),
];

/// Names accepted by `--shape`, in table order.
pub fn shape_names() -> &'static [&'static str] {
    const NAMES: [&str; SHAPES.len()] = {
        let mut out = [""; SHAPES.len()];
        let mut i = 0;
        while i < SHAPES.len() {
            out[i] = SHAPES[i].0;
            i += 1;
        }
        out
    };
    &NAMES
}

/// Look up a shape by name (case-insensitive).
pub fn shape(name: &str) -> Result<ShapeParams> {
    SHAPES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, p)| p.clone())
        .ok_or_else(|| Error::InvalidArgument(format!("unknown shape '{name}' (known: {})", shape_names().join(", "))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for name in shape_names() {
            let p = shape(name).unwrap();
            assert!(p.hv.is_multiple_of(p.hk), "{name}: Hv must be a multiple of Hk");
            assert_eq!(p.dk, p.dv, "{name}");
            assert_eq!(p.is_moe(), p.arch == "qwen35moe", "{name}");
            assert_eq!(p.is_moe(), p.n_ff == 0, "{name}");
            assert_eq!(p.n_layer % FULL_ATTENTION_INTERVAL, 0, "{name}");
            assert!(!p.source.is_empty(), "{name}");
        }
        assert!(shape("nope").is_err());
    }
}
