//! (placeholder until implemented)

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{GdnDims, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[];

pub(crate) fn delta_rule_recurrent(
    _be: &WgpuBackend,
    _u: &Tensor,
    _g: &Tensor,
    _beta: &Tensor,
    _state: &Tensor,
    _out: &Tensor,
    _dims: GdnDims,
) -> Result<()> {
    Err(gpu_err("delta_rule_recurrent: not implemented"))
}

pub(crate) fn delta_rule_chunked(
    _be: &WgpuBackend,
    _u: &Tensor,
    _g: &Tensor,
    _beta: &Tensor,
    _state: &Tensor,
    _out: &Tensor,
    _dims: GdnDims,
) -> Result<()> {
    Err(gpu_err("delta_rule_chunked: not implemented"))
}
