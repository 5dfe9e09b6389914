//! (placeholder until implemented)

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{GdnDims, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[];

pub(crate) fn rms_norm(_be: &WgpuBackend, _x: &Tensor, _w: &Tensor, _eps: f32, _out: &Tensor) -> Result<()> {
    Err(gpu_err("rms_norm: not implemented"))
}

pub(crate) fn gated_rms_norm(
    _be: &WgpuBackend,
    _x: &Tensor,
    _z: &Tensor,
    _w: &Tensor,
    _eps: f32,
    _out: &Tensor,
) -> Result<()> {
    Err(gpu_err("gated_rms_norm: not implemented"))
}

pub(crate) fn l2_norm_qk(_be: &WgpuBackend, _u: &Tensor, _dims: GdnDims, _eps: f32) -> Result<()> {
    Err(gpu_err("l2_norm_qk: not implemented"))
}
