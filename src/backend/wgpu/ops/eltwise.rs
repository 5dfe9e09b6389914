//! Elementwise ops, the delta-rule gates, the q/gate split and argmax.

use crate::backend::wgpu::WgpuBackend;
use crate::backend::{check, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[
    ("add_assign", include_str!("../../../../shaders-wgsl/add_assign.wgsl")),
    ("swiglu", include_str!("../../../../shaders-wgsl/swiglu.wgsl")),
    (
        "sigmoid_mul_assign",
        include_str!("../../../../shaders-wgsl/sigmoid_mul_assign.wgsl"),
    ),
    (
        "sigmoid_scale_add",
        include_str!("../../../../shaders-wgsl/sigmoid_scale_add.wgsl"),
    ),
    ("split_qgate", include_str!("../../../../shaders-wgsl/split_qgate.wgsl")),
    ("argmax", include_str!("../../../../shaders-wgsl/argmax.wgsl")),
    ("gdn_gates", include_str!("../../../../shaders-wgsl/gdn_gates.wgsl")),
];

/// Threads per workgroup of the one-invocation-per-element kernels.
const WG: u32 = 256;

pub(crate) fn add_assign(be: &WgpuBackend, acc: &Tensor, x: &Tensor) -> Result<()> {
    let op = "add_assign";
    let n = check::u32_index(op, "elements", check::add_assign(acc, x)?)?;
    dispatch_linear(be, op, &[n], &[acc, x], n)
}

/// Dispatch an elementwise kernel over `n` items, WG per workgroup, split over a 2-D grid.
fn dispatch_linear(be: &WgpuBackend, shader: &str, params: &[u32], bindings: &[&Tensor], n: u32) -> Result<()> {
    let [gx, gy] = be.grid(n.div_ceil(WG));
    be.dispatch(shader, "", params, bindings, [gx, gy, 1])
}

/// `out = silu(gate) * up`.
pub(crate) fn swiglu(be: &WgpuBackend, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
    let op = "swiglu";
    let n = check::u32_index(op, "elements", check::swiglu(gate, up, out)?)?;
    dispatch_linear(be, op, &[n], &[gate, up, out], n)
}

/// `x *= sigmoid(gate)` (in place).
pub(crate) fn sigmoid_mul_assign(be: &WgpuBackend, x: &Tensor, gate: &Tensor) -> Result<()> {
    let op = "sigmoid_mul_assign";
    let n = check::u32_index(op, "elements", check::sigmoid_mul_assign(x, gate)?)?;
    dispatch_linear(be, op, &[n], &[x, gate], n)
}

/// `acc[t] += sigmoid(gate_logit[t]) * x[t]`; acc, x `[T, d]`, gate_logit `[T, 1]`.
pub(crate) fn sigmoid_scale_add(be: &WgpuBackend, acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()> {
    let op = "sigmoid_scale_add";
    let (t_len, d) = check::sigmoid_scale_add(acc, x, gate_logit)?;
    let n = check::u32_index(op, "elements", t_len * d)?;
    dispatch_linear(be, op, &[n, d as u32], &[acc, x, gate_logit], n)
}

/// `[q_0|gate_0|q_1|gate_1|...]` (each `head_dim` wide) -> q, gate.
pub(crate) fn split_qgate(be: &WgpuBackend, qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<()> {
    let op = "split_qgate";
    let half = check::split_qgate(qg, head_dim, q, gate)?;
    check::u32_index(op, "elements", qg.numel())?;
    let n = half as u32;
    dispatch_linear(be, op, &[n, head_dim as u32], &[qg, q, gate], n)
}

/// Row-wise argmax of `logits` `[T, V]` into U32 `out` `[T]`: one workgroup per row.
pub(crate) fn argmax(be: &WgpuBackend, logits: &Tensor, out: &Tensor) -> Result<()> {
    let op = "argmax";
    let (t_len, v) = check::argmax(logits, out)?;
    check::u32_index(op, "elements", logits.numel())?;
    let [gx, gy] = be.grid(t_len as u32);
    be.dispatch(op, "", &[v as u32], &[logits, out], [gx, gy, 1])
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
    let op = "gdn_gates";
    let (n, hv) = check::gdn_gates(a, b, ssm_a, dt_bias, g_out, beta_out)?;
    let n = check::u32_index(op, "elements", n)?;
    dispatch_linear(be, op, &[n, hv as u32], &[a, b, ssm_a, dt_bias, g_out, beta_out], n)
}
