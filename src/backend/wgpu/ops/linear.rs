//! (placeholder until implemented)

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::Tensor;
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[];

pub(crate) fn embed(_be: &WgpuBackend, _table: &Tensor, _ids: &Tensor, _out: &Tensor) -> Result<()> {
    Err(gpu_err("embed: not implemented"))
}

pub(crate) fn matmul(_be: &WgpuBackend, _w: &Tensor, _x: &Tensor, _out: &Tensor) -> Result<()> {
    Err(gpu_err("matmul: not implemented"))
}
