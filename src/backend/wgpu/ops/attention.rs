//! (placeholder until implemented)

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{AttnDims, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[];

pub(crate) fn rope_neox(
    _be: &WgpuBackend,
    _x: &Tensor,
    _head_dim: usize,
    _n_rot: usize,
    _theta: f32,
    _pos0: usize,
) -> Result<()> {
    Err(gpu_err("rope_neox: not implemented"))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    _be: &WgpuBackend,
    _q: &Tensor,
    _k_cache: &Tensor,
    _v_cache: &Tensor,
    _pos0: usize,
    _dims: AttnDims,
    _scale: f32,
    _out: &Tensor,
) -> Result<()> {
    Err(gpu_err("attention: not implemented"))
}
