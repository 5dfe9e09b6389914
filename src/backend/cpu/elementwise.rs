//! Elementwise ops, the delta-rule gates, the q/gate split and argmax.

use rayon::prelude::*;

use super::{min_rows, read_f32s, sigmoid, silu, write_f32s, write_u32s, PAR_MIN_ELEMS};
use crate::backend::{check, Tensor, NON_FINITE};
use crate::error::Result;

/// `acc += x`.
pub(crate) fn add_assign(acc: &Tensor, x: &Tensor) -> Result<()> {
    let op = "add_assign";
    check::add_assign(acc, x)?;
    let xs = read_f32s(x, op)?;
    let mut a = write_f32s(acc, op)?;
    a.par_chunks_mut(PAR_MIN_ELEMS)
        .zip(xs.par_chunks(PAR_MIN_ELEMS))
        .for_each(|(a, x)| a.iter_mut().zip(x).for_each(|(a, x)| *a += x));
    Ok(())
}

/// `out = silu(gate) * up`.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
    let op = "swiglu";
    check::swiglu(gate, up, out)?;
    let g = read_f32s(gate, op)?;
    let u = read_f32s(up, op)?;
    let mut y = write_f32s(out, op)?;
    y.par_chunks_mut(PAR_MIN_ELEMS)
        .zip(g.par_chunks(PAR_MIN_ELEMS).zip(u.par_chunks(PAR_MIN_ELEMS)))
        .for_each(|(y, (g, u))| {
            for ((y, g), u) in y.iter_mut().zip(g).zip(u) {
                *y = silu(*g) * u;
            }
        });
    Ok(())
}

/// `x *= sigmoid(gate)`.
pub(crate) fn sigmoid_mul_assign(x: &Tensor, gate: &Tensor) -> Result<()> {
    let op = "sigmoid_mul_assign";
    check::sigmoid_mul_assign(x, gate)?;
    let g = read_f32s(gate, op)?;
    let mut xs = write_f32s(x, op)?;
    xs.par_chunks_mut(PAR_MIN_ELEMS)
        .zip(g.par_chunks(PAR_MIN_ELEMS))
        .for_each(|(x, g)| x.iter_mut().zip(g).for_each(|(x, g)| *x *= sigmoid(*g)));
    Ok(())
}

/// `acc[t] += sigmoid(gate_logit[t]) * x[t]`; one gate scalar per row.
pub(crate) fn sigmoid_scale_add(acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()> {
    let op = "sigmoid_scale_add";
    let (_, d) = check::sigmoid_scale_add(acc, x, gate_logit)?;
    let xs = read_f32s(x, op)?;
    let gl = read_f32s(gate_logit, op)?;
    let mut a = write_f32s(acc, op)?;
    if d == 0 {
        return Ok(());
    }
    a.par_chunks_mut(d)
        .zip(xs.par_chunks(d))
        .zip(gl.par_iter())
        .with_min_len(min_rows(d))
        .for_each(|((a, x), g)| {
            let s = sigmoid(*g);
            a.iter_mut().zip(x).for_each(|(a, x)| *a += s * x);
        });
    Ok(())
}

/// `softplus(x) = ln(1 + e^x)`, returning x itself above 20 (PyTorch's threshold) so e^x never
/// overflows.
#[inline]
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `beta = sigmoid(b)`, `g = ssm_a * softplus(a + dt_bias)` per (token, value head).
pub(crate) fn gdn_gates(
    a: &Tensor,
    b: &Tensor,
    ssm_a: &Tensor,
    dt_bias: &Tensor,
    g_out: &Tensor,
    beta_out: &Tensor,
) -> Result<()> {
    let op = "gdn_gates";
    let (_, hv) = check::gdn_gates(a, b, ssm_a, dt_bias, g_out, beta_out)?;
    let (av, bv, sa, dt) = (
        read_f32s(a, op)?,
        read_f32s(b, op)?,
        read_f32s(ssm_a, op)?,
        read_f32s(dt_bias, op)?,
    );
    let mut go = write_f32s(g_out, op)?;
    let mut bo = write_f32s(beta_out, op)?;
    for (((go, bo), a), b) in go
        .chunks_exact_mut(hv)
        .zip(bo.chunks_exact_mut(hv))
        .zip(av.chunks_exact(hv))
        .zip(bv.chunks_exact(hv))
    {
        for j in 0..hv {
            go[j] = sa[j] * softplus(a[j] + dt[j]);
            bo[j] = sigmoid(b[j]);
        }
    }
    Ok(())
}

/// `[q_0|gate_0|q_1|gate_1|...]` -> q, gate.
pub(crate) fn split_qgate(qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<()> {
    let op = "split_qgate";
    check::split_qgate(qg, head_dim, q, gate)?;
    let d = head_dim;
    let src = read_f32s(qg, op)?;
    let mut qs = write_f32s(q, op)?;
    let mut gs = write_f32s(gate, op)?;
    for ((pair, qh), gh) in src
        .chunks_exact(2 * d)
        .zip(qs.chunks_exact_mut(d))
        .zip(gs.chunks_exact_mut(d))
    {
        qh.copy_from_slice(&pair[..d]);
        gh.copy_from_slice(&pair[d..]);
    }
    Ok(())
}

/// Row-wise argmax by the sampler's rule: the first index of the largest value, NaN and -inf
/// never chosen; `NON_FINITE` when the row has nothing else.
pub(crate) fn argmax(logits: &Tensor, out: &Tensor) -> Result<()> {
    let op = "argmax";
    let (_, v) = check::argmax(logits, out)?;
    let l = read_f32s(logits, op)?;
    let mut o = write_u32s(out, op)?;
    for (row, o) in l.chunks_exact(v).zip(o.iter_mut()) {
        let mut best: Option<(usize, f32)> = None;
        for (i, &x) in row.iter().enumerate() {
            if x.is_nan() || x == f32::NEG_INFINITY {
                continue;
            }
            // Strict '>' keeps the first index on ties.
            if best.is_none_or(|(_, b)| x > b) {
                best = Some((i, x));
            }
        }
        *o = best.map_or(NON_FINITE, |(i, _)| i as u32);
    }
    Ok(())
}
