//! Elementwise ops.

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{DType, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[("add_assign", include_str!("../../../../shaders-wgsl/add_assign.wgsl"))];

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

pub(crate) fn swiglu(_be: &WgpuBackend, _gate: &Tensor, _up: &Tensor, _out: &Tensor) -> Result<()> {
    Err(gpu_err("swiglu: not implemented"))
}

pub(crate) fn sigmoid_mul_assign(_be: &WgpuBackend, _x: &Tensor, _gate: &Tensor) -> Result<()> {
    Err(gpu_err("sigmoid_mul_assign: not implemented"))
}

pub(crate) fn sigmoid_scale_add(_be: &WgpuBackend, _acc: &Tensor, _x: &Tensor, _gate_logit: &Tensor) -> Result<()> {
    Err(gpu_err("sigmoid_scale_add: not implemented"))
}

pub(crate) fn split_qgate(
    _be: &WgpuBackend,
    _qg: &Tensor,
    _head_dim: usize,
    _q: &Tensor,
    _gate: &Tensor,
) -> Result<()> {
    Err(gpu_err("split_qgate: not implemented"))
}

pub(crate) fn argmax(_be: &WgpuBackend, _logits: &Tensor, _out: &Tensor) -> Result<()> {
    Err(gpu_err("argmax: not implemented"))
}

pub(crate) fn gdn_gates(
    _be: &WgpuBackend,
    _a: &Tensor,
    _b: &Tensor,
    _ssm_a: &Tensor,
    _dt_bias: &Tensor,
    _g_out: &Tensor,
    _beta_out: &Tensor,
) -> Result<()> {
    Err(gpu_err("gdn_gates: not implemented"))
}
