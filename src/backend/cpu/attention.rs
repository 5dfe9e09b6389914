//! Partial NeoX RoPE and causal GQA softmax attention (spec/MODEL.md §6).

use rayon::prelude::*;

use super::{axpy, dot, read_f32s, write_f32s};
use crate::backend::{check, AttnDims, Pos, Tensor};
use crate::error::Result;

/// In place NeoX RoPE on the first `n_rot` dims of every head of x `[T, nh*D]`.
///
/// The angle `pos · θ^(−2i/n_rot)` and its cos/sin are computed in f64 and rounded once to f32,
/// so the reference carries no angle error even at large positions.
pub(crate) fn rope_neox(x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, pos: Pos) -> Result<()> {
    let op = "rope_neox";
    let t_len = check::rope_neox(x, head_dim, n_rot, theta, pos)?.t;
    let (cols, pos0) = (x.cols(), pos.host);
    let half = n_rot / 2;
    if half == 0 {
        return Ok(());
    }
    // cos/sin table [T][half].
    let mut cs = vec![(0f32, 0f32); t_len * half];
    for t in 0..t_len {
        let pos = (pos0 + t) as f64;
        for i in 0..half {
            let freq = (theta as f64).powf(-2.0 * i as f64 / n_rot as f64);
            let (s, c) = (pos * freq).sin_cos();
            cs[t * half + i] = (c as f32, s as f32);
        }
    }
    let mut xs = write_f32s(x, op)?;
    if cols == 0 {
        return Ok(());
    }
    xs.par_chunks_mut(cols).enumerate().for_each(|(t, row)| {
        let tab = &cs[t * half..(t + 1) * half];
        for head in row.chunks_exact_mut(head_dim) {
            let (lo, hi) = head[..n_rot].split_at_mut(half);
            for ((x0, x1), &(c, s)) in lo.iter_mut().zip(hi.iter_mut()).zip(tab) {
                let (a, b) = (*x0, *x1);
                *x0 = a * c - b * s;
                *x1 = a * s + b * c;
            }
        }
    });
    Ok(())
}

/// Causal GQA attention of T queries at positions `pos0..pos0+T` against cache rows
/// `0..=pos0+t` (`pos0 = pos.host`). q `[T, H*D]`, caches `[ctx, Hkv*D]`, out `[T, H*D]`.
pub(crate) fn attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
    dims: AttnDims,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    let op = "attention";
    let t_len = check::attention(q, k_cache, v_cache, pos, dims, out)?;
    let AttnDims {
        n_head: nh,
        n_head_kv: nkv,
        head_dim: d,
    } = dims;
    let pos0 = pos.host;
    let group = nh / nkv;
    let (qs, ks, vs) = (read_f32s(q, op)?, read_f32s(k_cache, op)?, read_f32s(v_cache, op)?);
    let mut os = write_f32s(out, op)?;
    let kvw = nkv * d;

    // One task per (token, head): out rows are [T][H][D], so chunk index = t*H + h.
    os.par_chunks_mut(d).enumerate().for_each_init(
        || Vec::with_capacity(pos0 + t_len),
        |scores: &mut Vec<f32>, (idx, o)| {
            let (t, h) = (idx / nh, idx % nh);
            let kvh = h / group;
            let qh = &qs[t * nh * d + h * d..t * nh * d + (h + 1) * d];
            let n = pos0 + t + 1; // causal: rows 0..=pos0+t
            scores.clear();
            let mut mx = f32::NEG_INFINITY;
            for s in 0..n {
                let sc = dot(qh, &ks[s * kvw + kvh * d..s * kvw + (kvh + 1) * d]) * scale;
                mx = mx.max(sc);
                scores.push(sc);
            }
            // Softmax with the max subtracted so exp never overflows.
            let mut sum = 0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - mx).exp();
                sum += *sc;
            }
            let inv = 1.0 / sum;
            o.fill(0.0);
            for (s, &p) in scores.iter().enumerate() {
                axpy(p * inv, &vs[s * kvw + kvh * d..s * kvw + (kvh + 1) * d], o);
            }
        },
    );
    Ok(())
}
