//! Elementwise ops, the delta-rule gates, the q/gate split and argmax (kernels-cuda/elementwise.cu).

use super::{grid_u32, stride_blocks, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::op::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, Tensor};
use crate::error::Result;

/// A grid-stride kernel over `n` elements.
pub(crate) fn stride(
    inner: &Inner,
    name: &'static str,
    n: usize,
    args: Args,
    phase: Phase,
    uses: &[&Tensor],
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    inner.kernel(
        Launch {
            name: (name, ""),
            grid: [stride_blocks(inner, n), 1, 1],
            block: 256,
            smem: 0,
            args,
            phase,
        },
        uses,
    )
}

pub(crate) fn add_assign(inner: &Inner, acc: &Tensor, x: &Tensor) -> Result<()> {
    let n = check::add_assign(acc, x)?;
    let mut a = Args::default();
    a.p[0] = ptr(acc, "add_assign")?;
    a.p[1] = ptr(x, "add_assign")?;
    a.n[0] = n as i64;
    stride(inner, "add_assign", n, a, Phase::Norms, &[acc, x])
}

pub(crate) fn swiglu(inner: &Inner, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
    let n = check::swiglu(gate, up, out)?;
    let mut a = Args::default();
    a.p[0] = ptr(gate, "swiglu")?;
    a.p[1] = ptr(up, "swiglu")?;
    a.p[2] = ptr(out, "swiglu")?;
    a.n[0] = n as i64;
    stride(inner, "swiglu", n, a, Phase::FfnMoe, &[gate, up, out])
}

pub(crate) fn sigmoid_scale_add(inner: &Inner, acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()> {
    let (t, d) = check::sigmoid_scale_add(acc, x, gate_logit)?;
    let mut a = Args::default();
    a.p[0] = ptr(acc, "sigmoid_scale_add")?;
    a.p[1] = ptr(x, "sigmoid_scale_add")?;
    a.p[2] = ptr(gate_logit, "sigmoid_scale_add")?;
    a.n[0] = (t * d) as i64;
    a.n[1] = d.max(1) as i64;
    stride(
        inner,
        "sigmoid_scale_add",
        t * d,
        a,
        Phase::FfnMoe,
        &[acc, x, gate_logit],
    )
}

pub(crate) fn gdn_gates(
    inner: &Inner,
    av: &Tensor,
    b: &Tensor,
    ssm_a: &Tensor,
    dt_bias: &Tensor,
    g_out: &Tensor,
    beta_out: &Tensor,
) -> Result<()> {
    let op = "gdn_gates";
    let (n, hv) = check::gdn_gates(av, b, ssm_a, dt_bias, g_out, beta_out)?;
    let mut a = Args::default();
    a.p[0] = ptr(av, op)?;
    a.p[1] = ptr(b, op)?;
    a.p[2] = ptr(ssm_a, op)?;
    a.p[3] = ptr(dt_bias, op)?;
    a.p[4] = ptr(g_out, op)?;
    a.p[5] = ptr(beta_out, op)?;
    a.n[0] = n as i64;
    a.n[1] = hv as i64;
    stride(
        inner,
        "gdn_gates",
        n,
        a,
        Phase::Conv,
        &[av, b, ssm_a, dt_bias, g_out, beta_out],
    )
}

pub(crate) fn split_qgate(inner: &Inner, qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<()> {
    let op = "split_qgate";
    let n = check::split_qgate(qg, head_dim, q, gate)?;
    let mut a = Args::default();
    a.p[0] = ptr(qg, op)?;
    a.p[1] = ptr(q, op)?;
    a.p[2] = ptr(gate, op)?;
    a.n[0] = n as i64;
    a.n[1] = head_dim as i64;
    stride(inner, "split_qgate", n, a, Phase::Attention, &[qg, q, gate])
}

/// Elements of a row one block of `argmax_partial` scans.
const ARGMAX_CHUNK: usize = 4096;

pub(crate) fn argmax(inner: &Inner, logits: &Tensor, out: &Tensor) -> Result<()> {
    let op = "argmax";
    let (t, v) = check::argmax(logits, out)?;
    if t == 0 {
        return Ok(());
    }
    // Blocks per row: enough to spread a 248k-entry vocabulary over the GPU, at most 1024.
    let parts = v.div_ceil(ARGMAX_CHUNK).clamp(1, 1024);
    let chunk = v.div_ceil(parts);
    // The partials' workspace stays locked until the final pass is submitted.
    let lock = inner.workspaces()?;
    let ws = lock.get("argmax", t * parts * 8)?;
    let mut a = Args::default();
    a.p[0] = ptr(logits, op)?;
    a.p[1] = ws;
    a.n[0] = v as i64;
    a.n[1] = chunk as i64;
    let rows = grid_u32(op, "rows", t)?;
    inner.kernel(
        Launch {
            name: ("argmax_partial", ""),
            grid: [parts as u32, rows, 1],
            block: 256,
            smem: 0,
            args: a,
            phase: Phase::Head,
        },
        &[logits],
    )?;
    let mut b = Args::default();
    b.p[0] = ws;
    b.p[1] = ptr(out, op)?;
    b.n[0] = parts as i64;
    inner.kernel(
        Launch {
            name: ("argmax_final", ""),
            grid: [rows, 1, 1],
            block: 32,
            smem: 0,
            args: b,
            phase: Phase::Head,
        },
        &[out],
    )
}
