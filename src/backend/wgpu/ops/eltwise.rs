//! Elementwise ops, the delta-rule gates, the q/gate split and argmax.

use super::u32_of;
use crate::backend::wgpu::encoder::Bind;
use crate::backend::wgpu::kernels::{Kernel, ARGMAX_CHUNK, ELT_WG};
use crate::backend::wgpu::WgpuBackend;
use crate::backend::{check, DType, Tensor};
use crate::error::Result;

/// Dispatch an elementwise kernel over `n` items, ELT_WG per workgroup, split over a 2-D grid.
fn linear(be: &WgpuBackend, kernel: Kernel, params: &[u32], binds: &[Bind<'_>], n: u32) -> Result<()> {
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(n.div_ceil(ELT_WG));
    enc.run(kernel, None, params, binds, [gx, gy, 1])
}

pub(crate) fn add_assign(be: &WgpuBackend, acc: &Tensor, x: &Tensor) -> Result<()> {
    let n = u32_of("add_assign", "elements", check::add_assign(acc, x)?)?;
    linear(be, Kernel::AddAssign, &[n], &[acc.into(), x.into()], n)
}

/// `out = silu(gate) * up`.
pub(crate) fn swiglu(be: &WgpuBackend, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
    let n = u32_of("swiglu", "elements", check::swiglu(gate, up, out)?)?;
    linear(be, Kernel::Swiglu, &[n], &[gate.into(), up.into(), out.into()], n)
}

/// `x *= sigmoid(gate)` (in place).
pub(crate) fn sigmoid_mul_assign(be: &WgpuBackend, x: &Tensor, gate: &Tensor) -> Result<()> {
    let n = u32_of("sigmoid_mul_assign", "elements", check::sigmoid_mul_assign(x, gate)?)?;
    linear(be, Kernel::SigmoidMulAssign, &[n], &[x.into(), gate.into()], n)
}

/// `acc[t] += sigmoid(gate_logit[t]) * x[t]`; acc, x `[T, d]`, gate_logit `[T, 1]`.
pub(crate) fn sigmoid_scale_add(be: &WgpuBackend, acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()> {
    let (t_len, d) = check::sigmoid_scale_add(acc, x, gate_logit)?;
    let n = u32_of("sigmoid_scale_add", "elements", t_len * d)?;
    linear(
        be,
        Kernel::SigmoidScaleAdd,
        &[n, d as u32],
        &[acc.into(), x.into(), gate_logit.into()],
        n,
    )
}

/// `[q_0|gate_0|q_1|gate_1|...]` (each `head_dim` wide) -> q, gate.
pub(crate) fn split_qgate(be: &WgpuBackend, qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<()> {
    let half = check::split_qgate(qg, head_dim, q, gate)?;
    u32_of("split_qgate", "elements", qg.numel())?;
    let n = half as u32;
    linear(
        be,
        Kernel::SplitQgate,
        &[n, head_dim as u32],
        &[qg.into(), q.into(), gate.into()],
        n,
    )
}

/// Row-wise argmax of `logits` `[T, V]` into U32 `out` `[T]`: one workgroup per row, or for rows
/// longer than `ARGMAX_CHUNK` (the LM head's) one per chunk and then one per row over the chunks'
/// results (a single workgroup reading a 1 MB row would leave the GPU idle).
pub(crate) fn argmax(be: &WgpuBackend, logits: &Tensor, out: &Tensor) -> Result<()> {
    let (t_len, v) = check::argmax(logits, out)?;
    u32_of("argmax", "elements", logits.numel())?;
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(t_len as u32);
    let chunks = v.div_ceil(ARGMAX_CHUNK as usize);
    if chunks <= 1 || chunks > be.caps.max_workgroups_per_dim as usize {
        return enc.run(
            Kernel::Argmax,
            None,
            &[v as u32],
            &[logits.into(), out.into()],
            [gx, gy, 1],
        );
    }
    let part = enc.scratch("argmax_part", DType::U32, &[t_len, chunks, 2])?;
    enc.run(
        Kernel::ArgmaxSplit,
        None,
        &[v as u32, chunks as u32],
        &[logits.into(), (&part).into()],
        [gx, gy, chunks as u32],
    )?;
    enc.run(
        Kernel::ArgmaxCombine,
        None,
        &[chunks as u32],
        &[(&part).into(), out.into()],
        [gx, gy, 1],
    )
}

/// `beta = sigmoid(b)`, `g = ssm_a * softplus(a + dt_bias)` per (token, value head).
pub(crate) fn gdn_gates(
    be: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    ssm_a: &Tensor,
    dt_bias: &Tensor,
    g_out: &Tensor,
    beta_out: &Tensor,
) -> Result<()> {
    let (n, hv) = check::gdn_gates(a, b, ssm_a, dt_bias, g_out, beta_out)?;
    let n = u32_of("gdn_gates", "elements", n)?;
    linear(
        be,
        Kernel::GdnGates,
        &[n, hv as u32],
        &[
            a.into(),
            b.into(),
            ssm_a.into(),
            dt_bias.into(),
            g_out.into(),
            beta_out.into(),
        ],
        n,
    )
}
