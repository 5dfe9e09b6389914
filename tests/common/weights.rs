//! Weights in every GGUF format rill runs, for the op tests.

use rill::backend::{Backend, Tensor, WeightData};
use rill::gguf::{GgmlType, TensorBytes};
use rill::quant;

use super::Rng;

/// Every weight format rill dequantizes (and so every format `matmul`, `embed` and
/// `moe_experts` must run).
pub const WEIGHT_TYPES: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
    GgmlType::Mxfp4,
];

/// The weight formats rill dequantizes but does not write.
pub const DEQUANTIZE_ONLY: [GgmlType; 5] = [
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
    GgmlType::Mxfp4,
];

/// The formats rill's quantizer writes (`quant::quantize`): every weight format but
/// `DEQUANTIZE_ONLY`, in the order of `WEIGHT_TYPES`.
pub fn quantizable() -> impl Iterator<Item = GgmlType> {
    WEIGHT_TYPES.into_iter().filter(|ty| !DEQUANTIZE_ONLY.contains(ty))
}

/// Byte offsets of the f16 scale fields (`d`, and `m`/`dmin` where the format has one) in one
/// block of `ty`; none for the plain floats and MXFP4 (whose scale is an E8M0 byte at 0).
pub fn f16_scale_offsets(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        F32 | F16 | Bf16 | Mxfp4 => &[],
        Q4_0 | Q5_0 | Q8_0 | Iq4Nl | Iq4Xs => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        other => panic!("no block layout for {other}"),
    }
}

/// A small normal f16 (about 0.002..0.01), little-endian.
fn small_f16(rng: &mut Rng) -> [u8; 2] {
    half::f16::from_f32((0.002 + 0.008 * rng.uniform()) as f32)
        .to_bits()
        .to_le_bytes()
}

/// `rows` rows of `cols` values in format `ty`: random normals of standard deviation `scale`,
/// quantized, where rill has a quantizer for `ty`; otherwise random blocks whose scale fields
/// are set to small sane values (`scale` is then unused).
pub fn random_weight(ty: GgmlType, rows: usize, cols: usize, scale: f32, rng: &mut Rng) -> Vec<u8> {
    let row_bytes = ty.row_size(cols as u64).expect("whole blocks") as usize;
    if quant::can_quantize(ty) {
        let src = rng.normals(rows * cols, scale);
        let mut dst = vec![0u8; row_bytes * rows];
        quant::quantize_rows_par(ty, &src, cols, &mut dst).expect("quantize");
        return dst;
    }
    let mut b: Vec<u8> = (0..row_bytes * rows).map(|_| rng.next_u64() as u8).collect();
    for blk in b.chunks_exact_mut(ty.type_size() as usize) {
        for &at in f16_scale_offsets(ty) {
            blk[at..at + 2].copy_from_slice(&small_f16(rng));
        }
        if ty == GgmlType::Mxfp4 {
            // E8M0 exponent near 2^0: values up to about +-12 * 2^-4.
            blk[0] = 118 + (rng.next_u64() % 8) as u8;
        }
    }
    b
}

/// Upload `bytes` of format `ty` and shape `shape` as a weight.
pub fn upload(be: &dyn Backend, ty: GgmlType, shape: &[usize], bytes: &[u8]) -> Tensor {
    be.upload_weight(&WeightData {
        name: format!("w.{ty}"),
        ggml_type: ty,
        shape: shape.to_vec(),
        bytes: TensorBytes::from_vec(bytes.to_vec()),
    })
    .unwrap_or_else(|e| panic!("{}: upload {ty}: {e}", be.name()))
}

/// The values the kernels see: `n` values of `bytes` dequantized.
pub fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    quant::dequantize(ty, bytes, &mut y).expect("dequantize");
    y
}

/// The error allowed in a product `Σ_i w_i x_i` computed by `be`, relative to the CPU's:
/// `rel · Σ|w_i x_i| + floor · (Σ|w_i| + Σ|x_i|)`.
///
/// Exact tier: f32 summation-order differences, `1e-5 Σ|w x|` (plus a tiny absolute floor).
/// Fast tier (tensor cores): w and x rounded to f16 before an exact f16 product and an f32 sum.
/// Rounding to f16 moves a value by at most 2^-11 of itself in f16's normal range (|v| >= 2^-14)
/// and by at most 2^-25 below it, so `|f16(w) f16(x) - w x| <= (2^-10 + 2^-22) |w x| +
/// 2^-25 (1 + 2^-11) (|w| + |x|)`; with the f32 sum's `1e-5` that is `rel = 2^-10 + 1e-5` and
/// `floor = 2^-24`. (BF16 weights are exact in f16 in that range.)
pub fn product_tolerance(be: &dyn Backend) -> (f64, f64) {
    if super::is_fast(be) {
        (2f64.powi(-10) + 1e-5, 2f64.powi(-24))
    } else {
        (1e-5, 0.0)
    }
}

/// Compare device and CPU `matmul` outputs per output: within `product_tolerance` of the terms'
/// magnitudes.
pub fn check_matmul(be: &dyn Backend, what: &str, got: &[f32], want: &[f32], w: &[f32], x: &[f32], n_in: usize) {
    let (rel, floor) = product_tolerance(be);
    let n_out = w.len() / n_in;
    let n_tok = x.len() / n_in;
    assert_eq!(got.len(), n_tok * n_out, "{what}: length");
    let abs_sum = |v: &[f32]| -> f64 { v.iter().map(|a| a.abs() as f64).sum() };
    let w_abs: Vec<f64> = (0..n_out).map(|o| abs_sum(&w[o * n_in..(o + 1) * n_in])).collect();
    for t in 0..n_tok {
        let xr = &x[t * n_in..(t + 1) * n_in];
        let x_abs = abs_sum(xr);
        for o in 0..n_out {
            let row = &w[o * n_in..(o + 1) * n_in];
            let mag: f64 = row.iter().zip(xr).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let tol = rel * mag + floor * (w_abs[o] + x_abs) + 1e-30;
            let (g, c) = (got[t * n_out + o], want[t * n_out + o]);
            assert!(
                ((g - c) as f64).abs() <= tol,
                "{what} [t {t}, o {o}]: device {g} cpu {c} (sum |w x| {mag}, tol {tol:.3e})"
            );
        }
    }
}
