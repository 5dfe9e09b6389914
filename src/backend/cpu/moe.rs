//! MoE routing and the routed experts (spec/MODEL.md §7.2).

use super::linear::gemm_t;
use super::{read_f32s, read_u32s, read_weight, silu, write_f32s, write_u32s, WeightRef};
use crate::backend::{check, shape_err, Tensor};
use crate::error::Result;

/// Lower bound of the top-k probability sum before renormalising (llama.cpp's clamp).
const MIN_ROUTE_SUM: f32 = 6.1035e-5;

/// Softmax over all experts, top-k (ties -> lower index), renormalise, × scale.
pub(crate) fn moe_route(logits: &Tensor, k: usize, scale: f32, ids: &Tensor, weights: &Tensor) -> Result<()> {
    let op = "moe_route";
    let (_, e) = check::moe_route(logits, k, ids, weights)?;
    let ls = read_f32s(logits, op)?;
    let mut is = write_u32s(ids, op)?;
    let mut ws = write_f32s(weights, op)?;
    let mut p = vec![0f32; e];
    let mut taken = vec![false; e];
    for ((l, id), w) in ls
        .chunks_exact(e)
        .zip(is.chunks_exact_mut(k))
        .zip(ws.chunks_exact_mut(k))
    {
        let mx = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for (pi, &li) in p.iter_mut().zip(l) {
            *pi = (li - mx).exp();
            sum += *pi;
        }
        p.iter_mut().for_each(|x| *x /= sum);
        // Top-k by repeated selection: strict '>' in index order keeps the lower index on ties;
        // NaN never wins against a number.
        taken.fill(false);
        let mut sel_sum = 0f32;
        for j in 0..k {
            let mut best: Option<usize> = None;
            for (i, &pi) in p.iter().enumerate() {
                if taken[i] {
                    continue;
                }
                best = match best {
                    None => Some(i),
                    Some(b) if (p[b].is_nan() && !pi.is_nan()) || pi > p[b] => Some(i),
                    keep => keep,
                };
            }
            // k <= e, so an untaken expert always exists.
            let b = best.unwrap_or(0);
            taken[b] = true;
            id[j] = b as u32;
            w[j] = p[b];
            sel_sum += p[b];
        }
        let norm = scale / sel_sum.max(MIN_ROUTE_SUM);
        w.iter_mut().for_each(|x| *x *= norm);
    }
    Ok(())
}

/// `out[t] = Σ_j weights[t][j] · down_e(silu(gate_e x[t]) ⊙ up_e x[t])`, `e = ids[t][j]`.
///
/// Tokens are grouped by expert so that every expert weight row is read once per call (a batched
/// GEMM over the expert's tokens); experts are visited in increasing id order and each one's
/// contribution is added to `out` in that order, so the result does not depend on threading.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_experts(
    x: &Tensor,
    gate_exps: &Tensor,
    up_exps: &Tensor,
    down_exps: &Tensor,
    ids: &Tensor,
    weights: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let op = "moe_experts";
    let check::MoeDims {
        t: t_len,
        d,
        n_exp,
        n_ff,
        k,
    } = check::moe_experts(x, gate_exps, up_exps, down_exps, ids, weights, out)?;

    let xs = read_f32s(x, op)?;
    let is = read_u32s(ids, op)?;
    let ws = read_f32s(weights, op)?;
    let (gg, ug, dg) = (
        read_weight(gate_exps, op)?,
        read_weight(up_exps, op)?,
        read_weight(down_exps, op)?,
    );
    let (gr, ur, dr) = (gg.as_ref(d, op)?, ug.as_ref(d, op)?, dg.as_ref(n_ff, op)?);
    if let Some(&bad) = is.iter().find(|&&e| e as usize >= n_exp) {
        return Err(shape_err(op, format!("expert id {bad} out of range ({n_exp} experts)")));
    }
    let mut os = write_f32s(out, op)?;
    os.fill(0.0);
    if t_len == 0 || k == 0 || d == 0 || n_ff == 0 {
        return Ok(());
    }

    // Assignments per expert, in token order: (token, routing weight).
    let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_exp];
    for t in 0..t_len {
        for j in 0..k {
            per_expert[is[t * k + j] as usize].push((t, ws[t * k + j]));
        }
    }

    let mut xe = Vec::new();
    let mut gt = Vec::new();
    let mut upt = Vec::new();
    let mut h = Vec::new();
    let mut yt = Vec::new();
    for (e, toks) in per_expert.iter().enumerate() {
        let n = toks.len();
        if n == 0 {
            continue;
        }
        // Gather this expert's input rows.
        xe.clear();
        for &(t, _) in toks {
            xe.extend_from_slice(&xs[t * d..(t + 1) * d]);
        }
        // gate/up: [n_ff][n] each.
        gt.resize(n_ff * n, 0.0);
        upt.resize(n_ff * n, 0.0);
        gemm_t(expert(gr, e, n_ff, d), d, &xe, n, &mut gt)?;
        gemm_t(expert(ur, e, n_ff, d), d, &xe, n, &mut upt)?;
        // h[i][f] = silu(gate) * up, token-major for the down projection.
        h.resize(n * n_ff, 0.0);
        for f in 0..n_ff {
            for i in 0..n {
                h[i * n_ff + f] = silu(gt[f * n + i]) * upt[f * n + i];
            }
        }
        // down: [d][n].
        yt.resize(d * n, 0.0);
        gemm_t(expert(dr, e, d, n_ff), n_ff, &h, n, &mut yt)?;
        for (i, &(t, w)) in toks.iter().enumerate() {
            let orow = &mut os[t * d..(t + 1) * d];
            for (o, dst) in orow.iter_mut().enumerate() {
                *dst += w * yt[o * n + i];
            }
        }
    }
    Ok(())
}

/// Expert `e` of a 3-D weight `[E, rows, cols]`: it starts at byte `e * rows * row_size(cols)`.
fn expert(w: WeightRef<'_>, e: usize, rows: usize, cols: usize) -> WeightRef<'_> {
    match w {
        WeightRef::F32(f) => WeightRef::F32(&f[e * rows * cols..(e + 1) * rows * cols]),
        WeightRef::Quant { ty, bytes, row_bytes } => WeightRef::Quant {
            ty,
            bytes: &bytes[e * rows * row_bytes..(e + 1) * rows * row_bytes],
            row_bytes,
        },
    }
}
