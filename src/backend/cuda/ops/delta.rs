//! The gated delta rule. `delta_rule_recurrent` (kernels-cuda/delta_rule.cu): row-owned
//! recurrence, one warp per state row. `delta_rule_chunked` at dk = dv = 128 (every Qwen3.5
//! shape): the chunked algorithm on the tensor cores (kernels-cuda/delta_chunked.cu, two launches
//! per layer: per-chunk preparation, then one pass over the chunks per head with the state in
//! fp32 accumulators), in 3xTF32 (f32-level: the strict tier, chunked == recurrent to ~1e-7 on the
//! emulator) at both precisions. The one-pass tf32 kernels (~4e-4; `pf_gdn_*_fast`, timed by
//! dev/cuda/prefill_bench.cu only) are not used: on the H200 they put the fast tier's fixture
//! logits just outside its bound (max abs 0.1017 > 0.1 on the Q8_0 fixture) while 3xTF32 keeps
//! them inside, at a cost of about 12 µs per layer at T = 102 and 37 µs at T = 512. Other head
//! dims run the recurrence, which equals the chunked algorithm up to f32 rounding.

use super::{grid_u32, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::{cuda_err, DevPtr};
use crate::backend::cuda::op::Args;
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
    if op == "delta_rule_chunked" && dims.dk == CHUNK_D && dims.dv == CHUNK_D && t > 0 {
        // The chunk intermediates are workspaces: held until the last kernel is submitted.
        let _ws = inner.workspaces()?;
        return chunked(inner, u, g, beta, state, out, dims, t);
    }
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

// ---- chunked, on the tensor cores ---------------------------------------------------------------

/// Head dims of the chunked kernels, chunk length, value rows per state-pass block.
const CHUNK_D: usize = 128;
const CHUNK: usize = 64;
const STATE_ROWS: usize = 32;
/// Dynamic shared memory of `pf_gdn_prep_*` and `pf_gdn_state_*` (`GP_SMEM`, `GS_SMEM`; asserted
/// in delta_chunked.cu).
const PREP_SMEM: u32 = 86_016;
const STATE_SMEM: u32 = 158_208;

/// `pf::GdnParams` (delta_chunked.cu; size asserted there).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GdnParams {
    u: u64,
    g: u64,
    beta: u64,
    state: u64,
    out: u64,
    su: u64,
    sw: u64,
    sp: u64,
    sg: u64,
    t: i32,
    hk: i32,
    hv: i32,
    _pad: i32,
}

#[allow(clippy::too_many_arguments)]
fn chunked(
    inner: &Inner,
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    t: usize,
) -> Result<()> {
    let op = "delta_rule_chunked";
    let nc = t.div_ceil(CHUNK);
    let per_head = |floats: usize| dims.hv * nc * floats * 4;
    // Scratch per (head, chunk): U and W [64][128], P [64][64], gamma hi and lo [2][64].
    let scratch = |name: &'static str, floats: usize| -> Result<DevPtr> { inner.workspace(name, per_head(floats)) };
    let p = GdnParams {
        u: ptr(u, op)?,
        g: ptr(g, op)?,
        beta: ptr(beta, op)?,
        state: ptr(state, op)?,
        out: ptr(out, op)?,
        su: scratch("delta U", CHUNK * CHUNK_D)?,
        sw: scratch("delta W", CHUNK * CHUNK_D)?,
        sp: scratch("delta P", CHUNK * CHUNK)?,
        sg: scratch("delta gamma", 2 * CHUNK)?,
        t: i32::try_from(t).map_err(|_| cuda_err(format!("{op}: {t} tokens exceed i32")))?,
        hk: dims.hk as i32,
        hv: dims.hv as i32,
        _pad: 0,
    };
    let hv = grid_u32(op, "heads", dims.hv)?;
    inner.kernel_rw(
        Launch {
            name: ("pf_gdn_prep_exact", ""),
            grid: [grid_u32(op, "chunks", nc)?, hv, 1],
            block: 256,
            smem: PREP_SMEM,
            args: Args::from_pod(&p),
            phase: Phase::DeltaRule,
        },
        0.0,
        &[u, g, beta],
        &[],
    )?;
    inner.kernel_rw(
        Launch {
            name: ("pf_gdn_state_exact", ""),
            grid: [(CHUNK_D / STATE_ROWS) as u32, hv, 1],
            block: 128,
            smem: STATE_SMEM,
            args: Args::from_pod(&p),
            phase: Phase::DeltaRule,
        },
        0.0,
        &[u],
        &[state, out],
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn params_layout() {
        assert_eq!(std::mem::size_of::<super::GdnParams>(), 88);
    }
}
