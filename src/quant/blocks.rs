//! Row drivers: apply a per-block kernel over a row of blocks.
//!
//! Kernels take fixed-size arrays so that their indexing needs no bounds checks; the drivers get
//! those arrays from `chunks_exact`, whose chunk length is exactly the array length (the
//! `first_chunk` calls therefore never fail, and nothing here can panic).

use super::dot::Acc;

/// Decode every block of `src` into the matching `QK` elements of `dst`.
#[inline(always)]
pub(crate) fn dequantize_blocks<const BS: usize, const QK: usize>(
    src: &[u8],
    dst: &mut [f32],
    kernel: impl Fn(&[u8; BS], &mut [f32; QK]),
) {
    for (b, y) in src.chunks_exact(BS).zip(dst.chunks_exact_mut(QK)) {
        if let (Some(b), Some(y)) = (b.first_chunk::<BS>(), y.first_chunk_mut::<QK>()) {
            kernel(b, y);
        }
    }
}

/// `dot(dequantize(row), x)`, decoding one block at a time into a stack buffer.
#[inline(always)]
pub(crate) fn dot_blocks<const BS: usize, const QK: usize>(
    row: &[u8],
    x: &[f32],
    kernel: impl Fn(&[u8; BS], &mut [f32; QK]),
) -> f32 {
    let mut acc = Acc::new();
    let mut buf = [0f32; QK];
    for (b, xs) in row.chunks_exact(BS).zip(x.chunks_exact(QK)) {
        if let Some(b) = b.first_chunk::<BS>() {
            kernel(b, &mut buf);
            acc.add(&buf, xs);
        }
    }
    acc.sum()
}

/// `dot(dequantize(row), x)` with a fused kernel that accumulates one block straight from its
/// bytes (the dequantized values never leave registers).
#[inline(always)]
pub(crate) fn dot_fused<const BS: usize, const QK: usize>(
    row: &[u8],
    x: &[f32],
    kernel: impl Fn(&[u8; BS], &[f32; QK], &mut Acc),
) -> f32 {
    let mut acc = Acc::new();
    for (b, xs) in row.chunks_exact(BS).zip(x.chunks_exact(QK)) {
        if let (Some(b), Some(xs)) = (b.first_chunk::<BS>(), xs.first_chunk::<QK>()) {
            kernel(b, xs, &mut acc);
        }
    }
    acc.sum()
}

/// Encode every `QK` elements of `src` into one block of `dst`.
#[inline(always)]
pub(crate) fn quantize_blocks<const BS: usize, const QK: usize>(
    src: &[f32],
    dst: &mut [u8],
    kernel: impl Fn(&[f32; QK], &mut [u8; BS]),
) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BS)) {
        if let (Some(x), Some(b)) = (x.first_chunk::<QK>(), b.first_chunk_mut::<BS>()) {
            kernel(x, b);
        }
    }
}
