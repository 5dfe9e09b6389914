//! `embed` and `matmul` (and the row-parallel GEMM that `moe_experts` reuses).

use rayon::prelude::*;

use super::{dot, dot_2x2, read_f32s, read_u32s, read_weight, write_f32s, WeightRef};
use crate::backend::{check, shape_err, Tensor};
use crate::error::Result;
use crate::quant;

/// Output rows per rayon task when T == 1 (decode): enough work to amortise scheduling.
const ROWS_PER_TASK_GEMV: usize = 32;
/// Output rows per rayon task when T > 1: these rows are dequantized once into scratch, then
/// each input row x[t] is loaded once and dotted with all of them (x reuse across rows).
const ROWS_PER_TASK_GEMM: usize = 8;

/// Row-parallel product with a transposed result: `yt[o * n + t] = dot(W[o], x[t])` for every
/// weight row `o` (`yt.len() / n` rows) and every input row `t` of `x` (`n` rows of `cols`).
///
/// Every weight row is read exactly once per call. For n == 1 the row is consumed directly by
/// `quant::vec_dot`; for n > 1 it is dequantized once into per-task scratch and reused for all n
/// input rows.
pub(crate) fn gemm_t(w: WeightRef<'_>, cols: usize, x: &[f32], n: usize, yt: &mut [f32]) -> Result<()> {
    debug_assert_eq!(x.len(), n * cols);
    if n == 0 || cols == 0 {
        yt.fill(0.0);
        return Ok(());
    }
    match w {
        WeightRef::F32(wf) => {
            // Already f32: no scratch needed, dot rows in place.
            yt.par_chunks_mut(ROWS_PER_TASK_GEMM * n)
                .enumerate()
                .for_each(|(blk, ych)| {
                    let o0 = blk * ROWS_PER_TASK_GEMM;
                    let nr = ych.len() / n;
                    dot_block(&wf[o0 * cols..(o0 + nr) * cols], cols, x, n, ych);
                });
            Ok(())
        }
        WeightRef::Quant { ty, bytes, row_bytes } => {
            if n == 1 {
                yt.par_chunks_mut(ROWS_PER_TASK_GEMV)
                    .enumerate()
                    .try_for_each(|(blk, ych)| -> Result<()> {
                        let o0 = blk * ROWS_PER_TASK_GEMV;
                        for (r, y) in ych.iter_mut().enumerate() {
                            let o = o0 + r;
                            *y = quant::vec_dot(ty, &bytes[o * row_bytes..(o + 1) * row_bytes], x)?;
                        }
                        Ok(())
                    })
            } else {
                yt.par_chunks_mut(ROWS_PER_TASK_GEMM * n).enumerate().try_for_each_init(
                    || vec![0f32; ROWS_PER_TASK_GEMM * cols],
                    |scratch, (blk, ych)| -> Result<()> {
                        let o0 = blk * ROWS_PER_TASK_GEMM;
                        let nr = ych.len() / n;
                        // Dequantize this task's weight rows once.
                        for r in 0..nr {
                            let o = o0 + r;
                            quant::dequantize(
                                ty,
                                &bytes[o * row_bytes..(o + 1) * row_bytes],
                                &mut scratch[r * cols..(r + 1) * cols],
                            )?;
                        }
                        // Then stream the inputs past them, two rows by two inputs at a time.
                        dot_block(&scratch[..nr * cols], cols, x, n, ych);
                        Ok(())
                    },
                )
            }
        }
    }
}

/// `yt[r * n + t] = dot(w[r], x[t])` for the `w.len() / cols` rows of `w` and the `n` rows of `x`,
/// with 2x2 register tiles (bit-identical to plain `dot`).
fn dot_block(w: &[f32], cols: usize, x: &[f32], n: usize, yt: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd::avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time just above).
        return unsafe { dot_block_avx2(w, cols, x, n, yt) };
    }
    dot_block_any(w, cols, x, n, yt)
}

/// `dot_block_any` compiled with AVX2 enabled (bit-identical results: Rust never contracts to FMA).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_block_avx2(w: &[f32], cols: usize, x: &[f32], n: usize, yt: &mut [f32]) {
    dot_block_any(w, cols, x, n, yt)
}

#[inline(always)]
fn dot_block_any(w: &[f32], cols: usize, x: &[f32], n: usize, yt: &mut [f32]) {
    #[inline(always)]
    fn row(m: &[f32], cols: usize, i: usize) -> &[f32] {
        &m[i * cols..(i + 1) * cols]
    }
    let nr = w.len() / cols;
    let mut r = 0;
    while r + 1 < nr {
        let (w0, w1) = (row(w, cols, r), row(w, cols, r + 1));
        let mut t = 0;
        while t + 1 < n {
            let o = dot_2x2(w0, w1, row(x, cols, t), row(x, cols, t + 1));
            yt[r * n + t] = o[0][0];
            yt[r * n + t + 1] = o[0][1];
            yt[(r + 1) * n + t] = o[1][0];
            yt[(r + 1) * n + t + 1] = o[1][1];
            t += 2;
        }
        if t < n {
            yt[r * n + t] = dot(w0, row(x, cols, t));
            yt[(r + 1) * n + t] = dot(w1, row(x, cols, t));
        }
        r += 2;
    }
    if r < nr {
        for t in 0..n {
            yt[r * n + t] = dot(row(w, cols, r), row(x, cols, t));
        }
    }
}

/// `out[t][o] = dot(W[o], x[t])`.
pub(crate) fn matmul(w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
    let op = "matmul";
    let check::MatmulDims { t: t_len, n_in, n_out } = check::matmul(w, x, out)?;
    let wg = read_weight(w, op)?;
    let wr = wg.as_ref(n_in, op)?;
    let xs = read_f32s(x, op)?;
    let mut ys = write_f32s(out, op)?;
    if t_len == 1 {
        return gemm_t(wr, n_in, &xs, 1, &mut ys);
    }
    // Compute [n_out][T] (contiguous per weight row, so tasks own disjoint slices), then transpose.
    let mut yt = vec![0f32; n_out * t_len];
    gemm_t(wr, n_in, &xs, t_len, &mut yt)?;
    ys.par_chunks_mut(n_out).enumerate().for_each(|(t, yrow)| {
        for (o, y) in yrow.iter_mut().enumerate() {
            *y = yt[o * t_len + t];
        }
    });
    Ok(())
}

/// `out[t] = dequant(table[ids[t]])`.
pub(crate) fn embed(table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()> {
    let op = "embed";
    let check::EmbedDims { vocab, d, .. } = check::embed(table, ids, out)?;
    let tg = read_weight(table, op)?;
    let tr = tg.as_ref(d, op)?;
    let ids = read_u32s(ids, op)?;
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(shape_err(op, format!("token id {bad} out of range (vocab {vocab})")));
    }
    let mut ys = write_f32s(out, op)?;
    if d == 0 {
        return Ok(());
    }
    ys.par_chunks_mut(d)
        .zip(ids.par_iter())
        .try_for_each(|(row, &id)| -> Result<()> {
            let id = id as usize;
            match tr {
                WeightRef::F32(tf) => row.copy_from_slice(&tf[id * d..(id + 1) * d]),
                WeightRef::Quant { ty, bytes, row_bytes } => {
                    quant::dequantize(ty, &bytes[id * row_bytes..(id + 1) * row_bytes], row)?
                }
            }
            Ok(())
        })
}
