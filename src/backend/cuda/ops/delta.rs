//! The gated delta rule (kernels-cuda/delta_rule.cu): row-owned recurrence, one warp per state row.
//! Both contract ops run it; for prefill it walks the tokens in order with the state in
//! registers (equal to the chunked algorithm up to f32 rounding, which the contract allows).

use super::{grid_u32, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::cuda_err;
use crate::backend::cuda::launch::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, GdnDims, Tensor};
use crate::error::Result;

#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_rule(
    inner: &Inner,
    op: &str,
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
) -> Result<()> {
    let t = check::delta_rule(op, u, g, beta, state, out, dims)?;
    // Columns per lane: one kernel per register budget.
    let kernel = match dims.dk {
        0..=128 => "delta_rule_4",
        129..=256 => "delta_rule_8",
        257..=512 => "delta_rule_16",
        dk => return Err(cuda_err(format!("{op}: key head dim {dk} > 512 is not supported"))),
    };
    let mut a = Args::default();
    a.p[0] = ptr(u, op)?;
    a.p[1] = ptr(g, op)?;
    a.p[2] = ptr(beta, op)?;
    a.p[3] = ptr(state, op)?;
    a.p[4] = ptr(out, op)?;
    a.n[0] = t as i64;
    a.n[1] = dims.hk as i64;
    a.n[2] = dims.hv as i64;
    a.n[3] = dims.dk as i64;
    a.n[4] = dims.dv as i64;
    inner.kernel(
        Launch {
            name: (kernel, ""),
            grid: [
                grid_u32(op, "heads", dims.hv)?,
                grid_u32(op, "row groups", dims.dv.div_ceil(4))?,
                1,
            ],
            block: 128,
            smem: 0,
            args: a,
            phase: Phase::DeltaRule,
        },
        &[u, g, beta, state, out],
    )
}
