//! MoE routing (kernels-cuda/moe.cu); the expert products are in `linear`, except those of a
//! batch under `Precision::Fast`, grouped by expert here.

use super::gemm::{self, F16Planes, GemmW, Groups, Tile};
use super::{grid_u32, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::cuda_err;
use crate::backend::cuda::op::{Args, Op};
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, Tensor};
use crate::error::Result;

/// Most experts `moe_route_rank` takes (256 threads x ROUTE_PER_THREAD in kernels-cuda/moe.cu).
const ROUTE_RANK_MAX: usize = 256 * 4;

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
    // Up to ROUTE_RANK_MAX experts every pick is found in one parallel pass (each expert counts
    // the experts that beat it); more experts take the k selections in series.
    let rank = e <= ROUTE_RANK_MAX;
    inner.kernel(
        Launch {
            name: (if rank { "moe_route_rank" } else { "moe_route" }, ""),
            grid: [grid_u32(op, "tokens", t)?, 1, 1],
            block: 256,
            smem: if rank { 0 } else { smem as u32 },
            args: a,
            phase: Phase::FfnMoe,
        },
        &[logits, ids, weights],
    )
}

// ---- MoE experts of a batch on the tensor cores (kernels-cuda/moe_group.cu, gemm_q.cu) ---------

/// `pf::MoeParams` (moe_group.cu; size asserted there).
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct MoeParams {
    ids: u64,
    counts: u64,
    offsets: u64,
    tiles: u64,
    num_tiles: u64,
    slot_token: u64,
    slot_of: u64,
    y: u64,
    weights: u64,
    out: u64,
    n: i32,
    n_expert: i32,
    k: i32,
    bm: i32,
    d: i32,
    _pad: i32,
}

/// Experts the grouping kernels handle (`pf_moe_offsets` is one block of 1024 threads).
const MAX_GROUPED_EXPERTS: usize = 1024;

/// Average rows per expert from which the 128-row tile beats the 32-row one (H200, 35B-A3B:
/// T = 512 gives 16 rows per expert, C; T = 4096 gives 128, B).
const ROWS_PER_EXPERT_FOR_B: usize = 96;

/// Whether `grouped_experts` takes experts of these dims (`pf_moe_offsets` is one block of 1024
/// threads, one per expert).
pub(crate) fn groups_fit(m: &check::MoeDims) -> bool {
    m.n_exp <= MAX_GROUPED_EXPERTS
}

/// `moe_experts` for a batch under `Precision::Fast` (experts that `groups_fit`): the T x k
/// routing choices grouped by expert on the device (count, offsets and tile list, placement in
/// token order), then one grouped tensor-core product per projection (gate and up gather their
/// rows of the f16 input, down reads the f16 SwiGLU rows; F16/BF16 experts read and gather the lo
/// planes too, `gemm::Fmt::split`), and the k rows of each token summed in routing order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn grouped_experts(
    inner: &Inner,
    gate: &GemmW,
    up: &GemmW,
    down: &GemmW,
    m: check::MoeDims,
    x: &Tensor,
    ids: &Tensor,
    weights: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let op = "moe_experts";
    let check::MoeDims {
        t,
        d,
        n_exp: e,
        n_ff: f,
        k,
    } = m;
    let slots = t * k;
    let n = i32::try_from(slots).map_err(|_| cuda_err(format!("{op}: {slots} routing choices exceed i32")))?;
    let tile = if slots / e >= ROWS_PER_EXPERT_FOR_B {
        Tile::B
    } else {
        Tile::C
    };
    let max_tiles = slots.div_ceil(tile.bm()) + e;
    // One workspace for the grouping: counts [E], offsets [E + 1], num_tiles, tiles (int4),
    // slot_token [S], slot_of [S]; 16-byte aligned parts.
    let a16 = |b: usize| b.div_ceil(16) * 16;
    let (o_counts, o_offsets, o_num) = (0, a16(e * 4), a16(e * 4) + a16((e + 1) * 4));
    let o_tiles = o_num + 16;
    let o_token = o_tiles + max_tiles * 16;
    let o_slot = o_token + a16(slots * 4);
    let grouping = inner.workspace("moe grouping", o_slot + a16(slots * 4))?;
    let gate_rows = inner.workspace("moe gate rows", slots * f * 4)?;
    let up_rows = inner.workspace("moe up rows", slots * f * 4)?;
    let hidden = inner.workspace("moe hidden f16", slots * f * 2)?;
    // The hidden rows' lo plane, for a down projection of a split format (F16/BF16 experts).
    let hidden_lo = if down.fmt.split() {
        inner.workspace("moe hidden f16 lo", slots * f * 2)?
    } else {
        0
    };
    let down_rows = inner.workspace("moe down rows", slots * d * 4)?;
    let p = MoeParams {
        ids: ptr(ids, op)?,
        counts: grouping + o_counts as u64,
        offsets: grouping + o_offsets as u64,
        tiles: grouping + o_tiles as u64,
        num_tiles: grouping + o_num as u64,
        slot_token: grouping + o_token as u64,
        slot_of: grouping + o_slot as u64,
        y: down_rows,
        weights: ptr(weights, op)?,
        out: ptr(out, op)?,
        n,
        n_expert: e as i32,
        k: k as i32,
        bm: tile.bm() as i32,
        d: d as i32,
        _pad: 0,
    };
    let reads = [x, ids, weights];
    let small = |name: &'static str, grid: usize, block: u32| {
        inner.kernel_rw(
            Launch {
                name: (name, ""),
                grid: [grid_u32(op, "blocks", grid)?, 1, 1],
                block,
                smem: 0,
                args: Args::from_pod(&p),
                phase: Phase::FfnMoe,
            },
            0.0,
            &reads,
            &[],
        )
    };
    inner.submit_rw(
        Op::Memset {
            dst: p.counts,
            bytes: e * 4,
        },
        &[],
        &[],
    )?;
    small("pf_moe_count", slots.div_ceil(256), 256)?;
    small("pf_moe_offsets", 1, 1024)?;
    small("pf_moe_place", e, 256)?;
    let x16 = inner.f16_of(x, gate.fmt.split() || up.fmt.split())?;
    let groups = Groups {
        tile,
        tiles: p.tiles,
        num_tiles: p.num_tiles,
        max_tiles,
        rows: slots,
    };
    let per_expert = |w: &GemmW, rows: usize| rows * w.row_bytes;
    gemm::grouped(
        inner,
        gate,
        per_expert(gate, f),
        x16,
        d,
        p.slot_token,
        gate_rows,
        f,
        d,
        &groups,
        &reads,
    )?;
    gemm::grouped(
        inner,
        up,
        per_expert(up, f),
        x16,
        d,
        p.slot_token,
        up_rows,
        f,
        d,
        &groups,
        &reads,
    )?;
    let hidden = F16Planes {
        hi: hidden,
        lo: hidden_lo,
    };
    gemm::swiglu_f16(inner, gate_rows, up_rows, hidden, 0, slots * f, Phase::FfnMoe, &[])?;
    gemm::grouped(
        inner,
        down,
        per_expert(down, d),
        hidden,
        f,
        0,
        down_rows,
        d,
        f,
        &groups,
        &reads,
    )?;
    inner.kernel_rw(
        Launch {
            name: ("pf_moe_combine", ""),
            grid: [grid_u32(op, "tokens", t)?, 1, 1],
            block: 256,
            smem: 0,
            args: Args::from_pod(&p),
            phase: Phase::FfnMoe,
        },
        0.0,
        &reads,
        &[out],
    )
}
