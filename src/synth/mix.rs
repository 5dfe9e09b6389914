//! Which ggml type each tensor gets for a `--quant` choice: the mix that llama.cpp's converter
//! (f16, bf16, q8_0) or `llama-quantize` (q4_k_m, q6_k) would produce (spec/GGUF.md §5).

use crate::error::{Error, Result};
use crate::gguf::GgmlType;

/// A file type `rill synth` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quant {
    F16,
    Bf16,
    Q8_0,
    Q4KM,
    Q6K,
}

const QUANTS: [(&str, Quant); 5] = [
    ("f16", Quant::F16),
    ("bf16", Quant::Bf16),
    ("q8_0", Quant::Q8_0),
    ("q4_k_m", Quant::Q4KM),
    ("q6_k", Quant::Q6K),
];

/// Names accepted by `--quant`.
pub fn quant_names() -> &'static [&'static str] {
    &["f16", "bf16", "q8_0", "q4_k_m", "q6_k"]
}

impl Quant {
    /// Parse a `--quant` value (case-insensitive; `Q4_K_M` and `q4_k_m` both work).
    pub fn parse(s: &str) -> Result<Quant> {
        QUANTS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s))
            .map(|(_, q)| *q)
            .ok_or_else(|| Error::InvalidArgument(format!("unknown quant '{s}' (known: {})", quant_names().join(", "))))
    }

    pub fn name(self) -> &'static str {
        QUANTS.iter().find(|(_, q)| *q == self).map(|(n, _)| *n).unwrap_or("?")
    }

    /// `general.file_type` (llama ftype, spec/GGUF.md §4).
    pub fn file_type(self) -> u32 {
        match self {
            Quant::F16 => 1,
            Quant::Bf16 => 32,
            Quant::Q8_0 => 7,
            Quant::Q4KM => 15,
            Quant::Q6K => 18,
        }
    }

    /// The ftype's base type, before any per-tensor rule.
    fn base(self) -> GgmlType {
        match self {
            Quant::F16 => GgmlType::F16,
            Quant::Bf16 => GgmlType::Bf16,
            Quant::Q8_0 => GgmlType::Q8_0,
            Quant::Q4KM => GgmlType::Q4K,
            Quant::Q6K => GgmlType::Q6K,
        }
    }
}

/// What the type rules need to know about one tensor and its model.
#[derive(Debug, Clone, Copy)]
pub struct TensorCtx<'a> {
    pub name: &'a str,
    pub ne: &'a [u64],
    /// Block index for `blk.N.*` tensors.
    pub layer: Option<usize>,
    pub n_layer: usize,
    /// No `output.weight`: `token_embd` doubles as the LM head.
    pub tied: bool,
    pub n_expert: usize,
}

/// llama.cpp's `use_more_bits`: first and last eighth of the layers and every third in between.
pub fn use_more_bits(i: usize, n: usize) -> bool {
    // `i - n / 8` cannot underflow: the first test short-circuits.
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Tensors that neither the converter nor the quantizer ever store below F32 (GGUF.md §5.1).
fn always_f32(t: &TensorCtx) -> bool {
    t.ne.len() == 1
        || t.name.ends_with(".ssm_conv1d.weight")
        || t.name.ends_with(".ffn_gate_inp.weight")
        || t.name.ends_with(".ffn_gate_inp_shexp.weight")
}

/// The suffix after `blk.N.`, e.g. `attn_v.weight`.
fn block_suffix(name: &str) -> &str {
    name.strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
        .map(|(_, s)| s)
        .unwrap_or(name)
}

/// The ggml type of one tensor.
pub fn tensor_type(q: Quant, t: &TensorCtx) -> GgmlType {
    if always_f32(t) {
        return GgmlType::F32;
    }
    let wanted = match q {
        // Converter outputs: one type for every matrix.
        Quant::F16 | Quant::Bf16 | Quant::Q8_0 => q.base(),
        Quant::Q4KM | Quant::Q6K => quantizer_type(q, t),
    };
    fallback(wanted, t.ne.first().copied().unwrap_or(0))
}

/// `llama-quantize`'s per-tensor choice (llama-quant.cpp, as observed in the Qwen3.5 snapshots
/// and in tests/fixtures/tiny-dense.Q4_K_M.gguf).
fn quantizer_type(q: Quant, t: &TensorCtx) -> GgmlType {
    let is_output = t.name == "output.weight" || (t.tied && t.name == "token_embd.weight");
    if is_output {
        return GgmlType::Q6K;
    }
    let suffix = block_suffix(t.name);
    let layer = t.layer.unwrap_or(0);
    let more_bits = use_more_bits(layer, t.n_layer);
    // The 8-expert special case (written for Mixtral, it fires for any n_expert == 8 model,
    // e.g. tiny-moe): attn_k/attn_v go to Q8_0, attn_output to Q5_K in Q4_K_M.
    let eight_experts = t.n_expert == 8;
    match suffix {
        "attn_k.weight" | "attn_v.weight" if eight_experts => GgmlType::Q8_0,
        "attn_output.weight" if eight_experts && q == Quant::Q4KM => GgmlType::Q5K,
        // Linear-attention attn_qkv and full-attention attn_v form one class with one tensor
        // per layer, so the class counter equals the layer index.
        "attn_qkv.weight" | "attn_v.weight" if q == Quant::Q4KM && more_bits => GgmlType::Q6K,
        "ffn_down.weight" | "ffn_down_exps.weight" | "ffn_down_shexp.weight" if q == Quant::Q4KM && more_bits => {
            GgmlType::Q6K
        }
        _ => q.base(),
    }
}

/// GGUF.md §5.4: when a row is not a whole number of blocks, llama-quantize falls back to a
/// 32-block type of similar size, and to F16 when even that does not fit.
pub fn fallback(ty: GgmlType, ne0: u64) -> GgmlType {
    if ne0.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let alt = match ty {
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        _ => GgmlType::F16,
    };
    if ne0.is_multiple_of(alt.block_size()) {
        alt
    } else {
        GgmlType::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx<'a>(name: &'a str, ne: &'a [u64], layer: Option<usize>) -> TensorCtx<'a> {
        TensorCtx {
            name,
            ne,
            layer,
            n_layer: 8,
            tied: true,
            n_expert: 0,
        }
    }

    #[test]
    fn more_bits_layers() {
        let v: Vec<usize> = (0..8).filter(|&i| use_more_bits(i, 8)).collect();
        assert_eq!(v, [0, 3, 6, 7]);
        let v: Vec<usize> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(v, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
    }

    /// The types llama-quantize gave tests/fixtures/tiny-dense.Q4_K_M.gguf (n_embd 64).
    #[test]
    fn matches_tiny_dense_q4_k_m_fixture() {
        let q = Quant::Q4KM;
        let t = |name: &str, ne: &[u64], l: Option<usize>| tensor_type(q, &ctx(name, ne, l));
        assert_eq!(t("token_embd.weight", &[64, 8192], None), GgmlType::Q8_0);
        assert_eq!(t("output_norm.weight", &[64], None), GgmlType::F32);
        assert_eq!(t("blk.0.attn_qkv.weight", &[64, 1024], Some(0)), GgmlType::Q8_0);
        assert_eq!(t("blk.1.attn_qkv.weight", &[64, 1024], Some(1)), GgmlType::Q5_0);
        assert_eq!(t("blk.3.attn_v.weight", &[64, 256], Some(3)), GgmlType::Q8_0);
        assert_eq!(t("blk.3.attn_k.weight", &[64, 256], Some(3)), GgmlType::Q5_0);
        assert_eq!(t("blk.6.ffn_down.weight", &[128, 64], Some(6)), GgmlType::Q8_0);
        assert_eq!(t("blk.5.ffn_down.weight", &[128, 64], Some(5)), GgmlType::Q5_0);
        assert_eq!(t("blk.5.ssm_out.weight", &[512, 64], Some(5)), GgmlType::Q4K);
        assert_eq!(t("blk.7.attn_output.weight", &[512, 64], Some(7)), GgmlType::Q4K);
        assert_eq!(t("blk.0.ssm_conv1d.weight", &[4, 1024], Some(0)), GgmlType::F32);
        assert_eq!(t("blk.0.ssm_alpha.weight", &[64, 4], Some(0)), GgmlType::Q5_0);
    }

    #[test]
    fn parse_names() {
        for n in quant_names() {
            assert_eq!(Quant::parse(n).unwrap().name(), *n);
        }
        assert_eq!(Quant::parse("Q4_K_M").unwrap(), Quant::Q4KM);
        assert!(Quant::parse("q3_k").is_err());
    }
}
