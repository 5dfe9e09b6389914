//! (placeholder until implemented)

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::Tensor;
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[];

pub(crate) fn moe_route(
    _be: &WgpuBackend,
    _logits: &Tensor,
    _k: usize,
    _scale: f32,
    _ids: &Tensor,
    _weights: &Tensor,
) -> Result<()> {
    Err(gpu_err("moe_route: not implemented"))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_experts(
    _be: &WgpuBackend,
    _x: &Tensor,
    _gate_exps: &Tensor,
    _up_exps: &Tensor,
    _down_exps: &Tensor,
    _ids: &Tensor,
    _weights: &Tensor,
    _out: &Tensor,
) -> Result<()> {
    Err(gpu_err("moe_experts: not implemented"))
}
