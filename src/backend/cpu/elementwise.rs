//! Elementwise ops, the delta-rule gates, the q/gate split and argmax.

use rayon::prelude::*;

use super::{
    check_dtype, check_f32_in, check_numel, min_rows, no_alias, read_f32s, sigmoid, silu, write_f32s, write_u32s,
    PAR_MIN_ELEMS,
};
use crate::backend::{shape_err, DType, Tensor};
use crate::error::Result;

/// `acc += x`.
pub(crate) fn add_assign(acc: &Tensor, x: &Tensor) -> Result<()> {
    let op = "add_assign";
    check_dtype(op, "acc", acc, DType::F32)?;
    check_f32_in(op, "x", x)?;
    check_numel(op, "x", x, acc.numel())?;
    no_alias(op, &[acc], &[x])?;
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
    check_dtype(op, "gate", gate, DType::F32)?;
    check_dtype(op, "up", up, DType::F32)?;
    check_dtype(op, "out", out, DType::F32)?;
    check_numel(op, "up", up, gate.numel())?;
    check_numel(op, "out", out, gate.numel())?;
    no_alias(op, &[out], &[gate, up])?;
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
    check_dtype(op, "x", x, DType::F32)?;
    check_dtype(op, "gate", gate, DType::F32)?;
    check_numel(op, "gate", gate, x.numel())?;
    no_alias(op, &[x], &[gate])?;
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
    check_dtype(op, "acc", acc, DType::F32)?;
    check_dtype(op, "x", x, DType::F32)?;
    check_dtype(op, "gate_logit", gate_logit, DType::F32)?;
    let (t_len, d) = (acc.rows(), acc.cols());
    check_numel(op, "x", x, t_len * d)?;
    check_numel(op, "gate_logit", gate_logit, t_len)?;
    no_alias(op, &[acc], &[x, gate_logit])?;
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
    check_dtype(op, "a", a, DType::F32)?;
    check_dtype(op, "b", b, DType::F32)?;
    check_f32_in(op, "ssm_a", ssm_a)?;
    check_f32_in(op, "dt_bias", dt_bias)?;
    check_dtype(op, "g_out", g_out, DType::F32)?;
    check_dtype(op, "beta_out", beta_out, DType::F32)?;
    let hv = ssm_a.numel();
    if hv == 0 || a.cols() != hv {
        return Err(shape_err(op, format!("a {:?} vs ssm_a {:?}", a.shape, ssm_a.shape)));
    }
    let n = a.numel();
    check_numel(op, "b", b, n)?;
    check_numel(op, "dt_bias", dt_bias, hv)?;
    check_numel(op, "g_out", g_out, n)?;
    check_numel(op, "beta_out", beta_out, n)?;
    no_alias(op, &[g_out, beta_out], &[a, b, ssm_a, dt_bias])?;
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
    check_dtype(op, "qg", qg, DType::F32)?;
    check_dtype(op, "q", q, DType::F32)?;
    check_dtype(op, "gate", gate, DType::F32)?;
    let d = head_dim;
    if d == 0 || !qg.numel().is_multiple_of(2 * d) {
        return Err(shape_err(op, format!("qg {:?} is not whole heads of 2*{d}", qg.shape)));
    }
    check_numel(op, "q", q, qg.numel() / 2)?;
    check_numel(op, "gate", gate, qg.numel() / 2)?;
    no_alias(op, &[q, gate], &[qg])?;
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

/// Row-wise argmax, first index on ties, NaN treated as smaller than every number.
pub(crate) fn argmax(logits: &Tensor, out: &Tensor) -> Result<()> {
    let op = "argmax";
    check_dtype(op, "logits", logits, DType::F32)?;
    check_dtype(op, "out", out, DType::U32)?;
    let (t_len, v) = (logits.rows(), logits.cols());
    check_numel(op, "out", out, t_len)?;
    if v == 0 || v > u32::MAX as usize {
        return Err(shape_err(op, format!("cannot take argmax over rows of {v}")));
    }
    let l = read_f32s(logits, op)?;
    let mut o = write_u32s(out, op)?;
    for (row, o) in l.chunks_exact(v).zip(o.iter_mut()) {
        let mut best_i = 0usize;
        let mut best = f32::NAN;
        for (i, &x) in row.iter().enumerate() {
            // Strict '>' keeps the first index on ties; NaN never wins against a number.
            if (best.is_nan() && !x.is_nan()) || x > best {
                best = x;
                best_i = i;
            }
        }
        *o = best_i as u32;
    }
    Ok(())
}
