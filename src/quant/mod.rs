//! Block formats: dequantization (the reference every backend is tested against), the CPU
//! GEMV inner product, and quantizers.
//!
//! Layouts and operation order follow spec/GGUF.md §3 and ggml's reference C code. One file per
//! family: `float` (F32/F16/BF16), `legacy` (32-element Q4_0..Q8_0, MXFP4), `kquants`
//! (Q2_K..Q6_K), `iq4` (IQ4_NL, IQ4_XS), each with its block decoders and, for the common types,
//! fused decode-and-dot kernels; `search` holds the K-quant scale searches, `blocks` the row
//! drivers and `dot` the f32 accumulator.

mod blocks;
mod dot;
mod float;
mod iq4;
mod kquants;
mod legacy;
mod search;
pub(crate) mod simd;

use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use blocks::{dequantize_blocks, dot_blocks, dot_fused, quantize_blocks};

fn unsupported(ty: GgmlType) -> Error {
    Error::UnsupportedType {
        tensor: String::new(),
        type_name: ty.name().to_string(),
        type_id: ty.id(),
    }
}

/// Check that `bytes` holds exactly `n` elements of `ty` (`n` a whole number of blocks).
fn check_len(op: &str, ty: GgmlType, bytes: usize, n: usize) -> Result<()> {
    let need = ty
        .row_size(n as u64)
        .ok_or_else(|| Error::InvalidArgument(format!("{n} elements is not a whole number of {ty} blocks")))?;
    if bytes as u64 != need {
        return Err(Error::InvalidArgument(format!(
            "{op} {ty}: {bytes} bytes for {n} elements, expected {need}"
        )));
    }
    Ok(())
}

/// Whether [`dequantize`] and [`vec_dot`] handle `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | Bf16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Iq4Nl | Iq4Xs | Mxfp4
    )
}

/// Whether [`quantize`] handles `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | Bf16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4K | Q5K | Q6K
    )
}

/// Dequantize `dst.len()` elements (a multiple of the block size) from `src`, which must hold
/// exactly `dst.len() / block_size * type_size` bytes.
///
/// Bit-identical to ggml's `dequantize_row_*` (same f32 operations in the same order).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    if !can_dequantize(ty) {
        return Err(unsupported(ty));
    }
    check_len("dequantize", ty, src.len(), dst.len())?;
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time just above).
        let ok = unsafe { dequantize_avx2(ty, src, dst) };
        return if ok { Ok(()) } else { Err(unsupported(ty)) };
    }
    if dequantize_any(ty, src, dst) {
        Ok(())
    } else {
        Err(unsupported(ty))
    }
}

/// The same code compiled with AVX2 enabled (wider auto-vectorisation; Rust never contracts to FMA,
/// so results are bit-identical to the baseline build).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dequantize_avx2(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    dequantize_any(ty, src, dst)
}

/// `$driver(row, x, kernel)` with `kernel` wrapped in an `#[inline(always)]` closure. A function
/// item passed as `impl Fn` is called through a shim that LLVM does not inline into the driver's
/// loop; the kernel then stays an out-of-line call compiled once, without AVX2, for both paths.
macro_rules! inlined {
    ($driver:ident, $row:expr, $x:expr, |$($arg:ident),*| $kernel:path) => {
        $driver(
            $row,
            $x,
            #[inline(always)]
            |$($arg),*| $kernel($($arg),*),
        )
    };
}

/// Dispatch on the type; `false` for a type without a dequantizer. Lengths are already checked.
#[inline(always)]
fn dequantize_any(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    use GgmlType::*;
    match ty {
        F32 => float::dequantize_f32(src, dst),
        F16 => float::dequantize_f16(src, dst),
        Bf16 => float::dequantize_bf16(src, dst),
        Q4_0 => inlined!(dequantize_blocks, src, dst, |b, y| legacy::deq_q4_0),
        Q4_1 => inlined!(dequantize_blocks, src, dst, |b, y| legacy::deq_q4_1),
        Q5_0 => inlined!(dequantize_blocks, src, dst, |b, y| legacy::deq_q5_0),
        Q5_1 => inlined!(dequantize_blocks, src, dst, |b, y| legacy::deq_q5_1),
        Q8_0 => inlined!(dequantize_blocks, src, dst, |b, y| legacy::deq_q8_0),
        Mxfp4 => inlined!(dequantize_blocks, src, dst, |b, y| legacy::deq_mxfp4),
        Iq4Nl => inlined!(dequantize_blocks, src, dst, |b, y| iq4::deq_iq4_nl),
        Iq4Xs => inlined!(dequantize_blocks, src, dst, |b, y| iq4::deq_iq4_xs),
        Q2K => inlined!(dequantize_blocks, src, dst, |b, y| kquants::deq_q2_k),
        Q3K => inlined!(dequantize_blocks, src, dst, |b, y| kquants::deq_q3_k),
        Q4K => inlined!(dequantize_blocks, src, dst, |b, y| kquants::deq_q4_k),
        Q5K => inlined!(dequantize_blocks, src, dst, |b, y| kquants::deq_q5_k),
        Q6K => inlined!(dequantize_blocks, src, dst, |b, y| kquants::deq_q6_k),
        _ => return false,
    }
    true
}

/// `dot(dequantize(row), x)` without materialising the row; `x.len()` elements.
///
/// Every product is `y_i·x_i` with `y_i` bit-identical to `dequantize` (the fused kernels of
/// Q4_0..Q8_0 and Q4_K..Q6_K recompute each element in registers with the same f32 operations;
/// the other types decode a block into a stack buffer), accumulated in 16 f32 lanes (element `i`
/// of a row in lane `i % 16`) and reduced pairwise. The result therefore equals the dot product
/// of the dequantized row up to f32 summation-order rounding, `|error| <= γ_(n/16+5)·Σ|y_i·x_i|`,
/// and is the same with and without AVX2.
pub fn vec_dot(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32> {
    if !can_dequantize(ty) {
        return Err(unsupported(ty));
    }
    check_len("vec_dot", ty, row.len(), x.len())?;
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time just above).
        return unsafe { vec_dot_avx2(ty, row, x) }.ok_or_else(|| unsupported(ty));
    }
    vec_dot_any(ty, row, x).ok_or_else(|| unsupported(ty))
}

/// `vec_dot_any` compiled with AVX2 enabled (bit-identical results, wider vectors).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn vec_dot_avx2(ty: GgmlType, row: &[u8], x: &[f32]) -> Option<f32> {
    vec_dot_any(ty, row, x)
}

/// Dispatch on the type; `None` for a type without a dequantizer. Lengths are already checked.
#[inline(always)]
fn vec_dot_any(ty: GgmlType, row: &[u8], x: &[f32]) -> Option<f32> {
    use GgmlType::*;
    Some(match ty {
        F32 => dot_plain(row, x, 4, float::dequantize_f32),
        F16 => dot_plain(row, x, 2, float::dequantize_f16),
        Bf16 => dot_plain(row, x, 2, float::dequantize_bf16),
        Q4_0 => inlined!(dot_fused, row, x, |b, xs, acc| legacy::dot_q4_0),
        Q4_1 => inlined!(dot_fused, row, x, |b, xs, acc| legacy::dot_q4_1),
        Q5_0 => inlined!(dot_fused, row, x, |b, xs, acc| legacy::dot_q5_0),
        Q5_1 => inlined!(dot_fused, row, x, |b, xs, acc| legacy::dot_q5_1),
        Q8_0 => inlined!(dot_fused, row, x, |b, xs, acc| legacy::dot_q8_0),
        Mxfp4 => inlined!(dot_blocks, row, x, |b, y| legacy::deq_mxfp4),
        Iq4Nl => inlined!(dot_blocks, row, x, |b, y| iq4::deq_iq4_nl),
        Iq4Xs => inlined!(dot_blocks, row, x, |b, y| iq4::deq_iq4_xs),
        Q2K => inlined!(dot_blocks, row, x, |b, y| kquants::deq_q2_k),
        Q3K => inlined!(dot_blocks, row, x, |b, y| kquants::deq_q3_k),
        Q4K => inlined!(dot_fused, row, x, |b, xs, acc| kquants::dot_q4_k),
        Q5K => inlined!(dot_fused, row, x, |b, xs, acc| kquants::dot_q5_k),
        Q6K => inlined!(dot_fused, row, x, |b, xs, acc| kquants::dot_q6_k),
        _ => return None,
    })
}

/// Dot product for the one-element-per-"block" float formats, decoding 256 at a time.
#[inline(always)]
fn dot_plain(row: &[u8], x: &[f32], elem_bytes: usize, decode: impl Fn(&[u8], &mut [f32])) -> f32 {
    const CHUNK: usize = 256;
    let mut acc = dot::Acc::new();
    let mut buf = [0f32; CHUNK];
    for (b, xs) in row.chunks(CHUNK * elem_bytes).zip(x.chunks(CHUNK)) {
        let y = &mut buf[..xs.len()];
        decode(b, y);
        acc.add(y, xs);
    }
    acc.sum()
}

/// Quantize `src` (a multiple of the block size) into `dst` (exactly the row size in bytes).
///
/// Legacy formats and F16/BF16 reproduce ggml's `quantize_row_*_ref` blocks bit for bit; the
/// K-quants run ggml's scale search with a vectorised summation order (see `search.rs`).
/// Single-threaded; see [`quantize_rows_par`] for whole tensors.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    if !can_quantize(ty) {
        return Err(unsupported(ty));
    }
    check_len("quantize", ty, dst.len(), src.len())?;
    use GgmlType::*;
    match ty {
        F32 => float::quantize_f32(src, dst),
        F16 => float::quantize_f16(src, dst),
        Bf16 => float::quantize_bf16(src, dst),
        Q4_0 => quantize_blocks(src, dst, legacy::quant_q4_0),
        Q4_1 => quantize_blocks(src, dst, legacy::quant_q4_1),
        Q5_0 => quantize_blocks(src, dst, legacy::quant_q5_0),
        Q5_1 => quantize_blocks(src, dst, legacy::quant_q5_1),
        Q8_0 => quantize_blocks(src, dst, legacy::quant_q8_0),
        Q4K => quantize_blocks(src, dst, kquants::quant_q4_k),
        Q5K => quantize_blocks(src, dst, kquants::quant_q5_k),
        Q6K => quantize_blocks(src, dst, kquants::quant_q6_k),
        _ => return Err(unsupported(ty)),
    }
    Ok(())
}

/// Quantize a row-major matrix of rows of `row_len` elements in parallel (rayon, one task per
/// group of rows). `src.len()` must be a multiple of `row_len`, `dst` exactly the tensor size.
#[cfg(not(target_arch = "wasm32"))]
pub fn quantize_rows_par(ty: GgmlType, src: &[f32], row_len: usize, dst: &mut [u8]) -> Result<()> {
    use rayon::prelude::*;
    if !can_quantize(ty) {
        return Err(unsupported(ty));
    }
    if row_len == 0 || !src.len().is_multiple_of(row_len) {
        return Err(Error::InvalidArgument(format!(
            "quantize {ty}: {} elements is not a whole number of rows of {row_len}",
            src.len()
        )));
    }
    let row_bytes = ty.row_size(row_len as u64).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "row of {row_len} elements is not a whole number of {ty} blocks"
        ))
    })? as usize;
    let n_rows = src.len() / row_len;
    if dst.len() != n_rows * row_bytes {
        return Err(Error::InvalidArgument(format!(
            "quantize {ty}: {} bytes for {n_rows} rows, expected {}",
            dst.len(),
            n_rows * row_bytes
        )));
    }
    // About 64K elements per task keeps scheduling overhead negligible for small rows.
    let rows_per_task = (65_536 / row_len).max(1);
    src.par_chunks(rows_per_task * row_len)
        .zip(dst.par_chunks_mut(rows_per_task * row_bytes))
        .try_for_each(|(s, d)| quantize(ty, s, d))
}
