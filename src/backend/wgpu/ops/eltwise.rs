//! Elementwise ops, the delta-rule gates, the q/gate split and argmax, plus the operand checks
//! shared by every op family of this backend.

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{DType, Tensor};
use crate::error::Result;
use crate::gguf::GgmlType;

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
    check_f32("add_assign", &[acc, x])?;
    if acc.numel() != x.numel() {
        return Err(gpu_err(format!("add_assign: {:?} += {:?}", acc.shape, x.shape)));
    }
    if acc.same_buffer(x) {
        return Err(gpu_err("add_assign: x aliases acc"));
    }
    let n = acc.numel() as u32;
    let [gx, gy] = be.grid(n.div_ceil(256));
    be.dispatch("add_assign", "", &[n], &[acc, x], [gx, gy, 1])
}

/// Every tensor must be F32.
pub(crate) fn check_f32(op: &str, ts: &[&Tensor]) -> Result<()> {
    for t in ts {
        if t.dtype != DType::F32 {
            return Err(gpu_err(format!("{op}: expected F32, got {:?}", t.dtype)));
        }
    }
    Ok(())
}

/// A small F32 operand that may also come as a weight (norm weights, conv taps, `ssm_a`): F32 or
/// a GGUF F32 tensor, which has the same bytes. (The CPU backend also takes F16/BF16 there; the
/// model loader uploads those small tensors dequantized, so kernels here read f32 only.)
pub(crate) fn check_f32_in(op: &str, name: &str, t: &Tensor) -> Result<()> {
    match t.dtype {
        DType::F32 | DType::Ggml(GgmlType::F32) => Ok(()),
        d => Err(gpu_err(format!("{op}: {name} must be F32, got {d:?}"))),
    }
}

/// `t` must hold exactly `want` elements.
pub(crate) fn check_numel(op: &str, name: &str, t: &Tensor, want: usize) -> Result<()> {
    if t.numel() != want {
        return Err(gpu_err(format!(
            "{op}: {name} {:?} has {} elements, expected {want}",
            t.shape,
            t.numel()
        )));
    }
    Ok(())
}

/// No output may share its buffer with another output or with an input.
pub(crate) fn no_alias(op: &str, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<()> {
    for (i, o) in outputs.iter().enumerate() {
        for other in outputs.iter().skip(i + 1).chain(inputs.iter()) {
            if o.same_buffer(other) {
                return Err(gpu_err(format!(
                    "{op}: an output shares its buffer with another operand"
                )));
            }
        }
    }
    Ok(())
}

/// A size as a shader index: every index a kernel computes must fit in u32.
pub(crate) fn u32_of(op: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| gpu_err(format!("{op}: size {n} exceeds the 32-bit index range")))
}

/// Dispatch an elementwise kernel over `n` items, WG per workgroup, split over a 2-D grid.
fn dispatch_linear(be: &WgpuBackend, shader: &str, params: &[u32], bindings: &[&Tensor], n: u32) -> Result<()> {
    let [gx, gy] = be.grid(n.div_ceil(WG));
    be.dispatch(shader, "", params, bindings, [gx, gy, 1])
}

/// `out = silu(gate) * up`.
pub(crate) fn swiglu(be: &WgpuBackend, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
    let op = "swiglu";
    check_f32(op, &[gate, up, out])?;
    check_numel(op, "up", up, gate.numel())?;
    check_numel(op, "out", out, gate.numel())?;
    no_alias(op, &[out], &[gate, up])?;
    let n = u32_of(op, gate.numel())?;
    dispatch_linear(be, op, &[n], &[gate, up, out], n)
}

/// `x *= sigmoid(gate)` (in place).
pub(crate) fn sigmoid_mul_assign(be: &WgpuBackend, x: &Tensor, gate: &Tensor) -> Result<()> {
    let op = "sigmoid_mul_assign";
    check_f32(op, &[x, gate])?;
    check_numel(op, "gate", gate, x.numel())?;
    no_alias(op, &[x], &[gate])?;
    let n = u32_of(op, x.numel())?;
    dispatch_linear(be, op, &[n], &[x, gate], n)
}

/// `acc[t] += sigmoid(gate_logit[t]) * x[t]`; acc, x `[T, d]`, gate_logit `[T, 1]`.
pub(crate) fn sigmoid_scale_add(be: &WgpuBackend, acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()> {
    let op = "sigmoid_scale_add";
    check_f32(op, &[acc, x, gate_logit])?;
    let (t_len, d) = (acc.rows(), acc.cols());
    check_numel(op, "x", x, t_len * d)?;
    check_numel(op, "gate_logit", gate_logit, t_len)?;
    no_alias(op, &[acc], &[x, gate_logit])?;
    let n = u32_of(op, acc.numel())?;
    if n == 0 {
        return Ok(());
    }
    dispatch_linear(be, op, &[n, d as u32], &[acc, x, gate_logit], n)
}

/// `[q_0|gate_0|q_1|gate_1|...]` (each `head_dim` wide) -> q, gate.
pub(crate) fn split_qgate(be: &WgpuBackend, qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<()> {
    let op = "split_qgate";
    check_f32(op, &[qg, q, gate])?;
    let d = head_dim;
    if d == 0 || !qg.numel().is_multiple_of(2 * d) {
        return Err(gpu_err(format!("{op}: qg {:?} is not whole heads of 2*{d}", qg.shape)));
    }
    check_numel(op, "q", q, qg.numel() / 2)?;
    check_numel(op, "gate", gate, qg.numel() / 2)?;
    no_alias(op, &[q, gate], &[qg])?;
    u32_of(op, qg.numel())?;
    let n = (qg.numel() / 2) as u32;
    dispatch_linear(be, op, &[n, d as u32], &[qg, q, gate], n)
}

/// Row-wise argmax of `logits` `[T, V]` into U32 `out` `[T]`: one workgroup per row.
pub(crate) fn argmax(be: &WgpuBackend, logits: &Tensor, out: &Tensor) -> Result<()> {
    let op = "argmax";
    check_f32(op, &[logits])?;
    if out.dtype != DType::U32 {
        return Err(gpu_err(format!("{op}: out must be U32, got {:?}", out.dtype)));
    }
    let (t_len, v) = (logits.rows(), logits.cols());
    check_numel(op, "out", out, t_len)?;
    if v == 0 {
        return Err(gpu_err(format!("{op}: cannot take argmax over rows of {v}")));
    }
    no_alias(op, &[out], &[logits])?;
    u32_of(op, logits.numel())?;
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
    check_f32(op, &[a, b, g_out, beta_out])?;
    check_f32_in(op, "ssm_a", ssm_a)?;
    check_f32_in(op, "dt_bias", dt_bias)?;
    let hv = ssm_a.numel();
    if hv == 0 || a.cols() != hv {
        return Err(gpu_err(format!("{op}: a {:?} vs ssm_a {:?}", a.shape, ssm_a.shape)));
    }
    let n = a.numel();
    check_numel(op, "b", b, n)?;
    check_numel(op, "dt_bias", dt_bias, hv)?;
    check_numel(op, "g_out", g_out, n)?;
    check_numel(op, "beta_out", beta_out, n)?;
    no_alias(op, &[g_out, beta_out], &[a, b, ssm_a, dt_bias])?;
    let n = u32_of(op, n)?;
    dispatch_linear(be, op, &[n, hv as u32], &[a, b, ssm_a, dt_bias, g_out, beta_out], n)
}
