//! MoE routing (kernels-cuda/moe.cu); the expert products are in `linear`.

use super::{grid_u32, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::cuda_err;
use crate::backend::cuda::launch::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, Tensor};
use crate::error::Result;

pub(crate) fn moe_route(
    inner: &Inner,
    logits: &Tensor,
    k: usize,
    scale: f32,
    ids: &Tensor,
    weights: &Tensor,
) -> Result<()> {
    let op = "moe_route";
    let (t, e) = check::moe_route(logits, k, ids, weights)?;
    // Probabilities (f32) and taken flags (bytes) of one token in shared memory.
    let smem = e * 4 + e.div_ceil(4) * 4;
    if smem > 48 * 1024 {
        return Err(cuda_err(format!("{op}: {e} experts exceed the supported 9830")));
    }
    let mut a = Args::default();
    a.p[0] = ptr(logits, op)?;
    a.p[1] = ptr(ids, op)?;
    a.p[2] = ptr(weights, op)?;
    a.n[0] = e as i64;
    a.n[1] = k as i64;
    a.f[0] = scale;
    inner.kernel(
        Launch {
            name: ("moe_route", ""),
            grid: [grid_u32(op, "tokens", t)?, 1, 1],
            block: 256,
            smem: smem as u32,
            args: a,
            phase: Phase::FfnMoe,
        },
        &[logits, ids, weights],
    )
}
