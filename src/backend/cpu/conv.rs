//! Causal depthwise conv1d + SiLU with a rolling state (spec/MODEL.md §5.3).

use rayon::prelude::*;

use super::{min_rows, read_f32s, silu, write_f32s};
use crate::backend::{check, Tensor};
use crate::error::Result;

/// x `[T, C]`, w `[C, K]` (tap K-1 = newest token), state `[K-1, C]` oldest first, out `[T, C]`.
///
/// Conceptually: `X = concat(state, x)` along time (K-1+T rows), `out[t][c] =
/// silu(Σ_j w[c][j] · X[t+j][c])`, and the new state is the last K-1 rows of `X`.
pub(crate) fn conv1d_causal_silu(x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<()> {
    let op = "conv1d_causal_silu";
    let check::ConvDims { t: t_len, c, k } = check::conv1d(x, w, state, out)?;

    let xs = read_f32s(x, op)?;
    let ws = read_f32s(w, op)?;
    let mut st = write_f32s(state, op)?;
    let mut ys = write_f32s(out, op)?;
    if c == 0 {
        return Ok(());
    }

    // X = [state | x] as one time-major buffer, and the taps transposed to [K][C] so that both
    // inner loops run over contiguous channels.
    let mut xx = Vec::with_capacity((k - 1 + t_len) * c);
    xx.extend_from_slice(&st);
    xx.extend_from_slice(&xs);
    let mut wt = vec![0f32; k * c];
    for (ch, taps) in ws.chunks_exact(k).enumerate() {
        for (j, &tap) in taps.iter().enumerate() {
            wt[j * c + ch] = tap;
        }
    }

    ys.par_chunks_mut(c)
        .enumerate()
        .with_min_len(min_rows(c * k))
        .for_each(|(t, y)| {
            y.fill(0.0);
            // Token t sees X rows t..t+K (tap j multiplies X[t+j]).
            for j in 0..k {
                let xr = &xx[(t + j) * c..(t + j + 1) * c];
                let wr = &wt[j * c..(j + 1) * c];
                for ((y, x), w) in y.iter_mut().zip(xr).zip(wr) {
                    *y += w * x;
                }
            }
            y.iter_mut().for_each(|v| *v = silu(*v));
        });

    // New state: last K-1 rows of X (still holds old state rows when T < K-1).
    let total = xx.len();
    st.copy_from_slice(&xx[total - (k - 1) * c..]);
    Ok(())
}
