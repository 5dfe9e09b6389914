//! (placeholder until implemented)

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::Tensor;
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[];

pub(crate) fn conv1d_causal_silu(
    _be: &WgpuBackend,
    _x: &Tensor,
    _w: &Tensor,
    _state: &Tensor,
    _out: &Tensor,
) -> Result<()> {
    Err(gpu_err("conv1d_causal_silu: not implemented"))
}
