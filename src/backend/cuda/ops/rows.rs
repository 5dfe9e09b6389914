//! The ops of a step whose rows belong to different sequences (`backend::rows`), one launch each
//! for all B rows (kernels-cuda/rows.cu; attention adds a combine launch when it splits the key
//! range). Each kernel reads row b's `(slot, pos)` from `rows.dev`, so a recorded step stays
//! valid when the rows change: the host values only pass the rules (`rows::check_*`), and grids
//! depend on B and the pool's shapes alone.

use super::{grid_u32, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::cuda_err;
use crate::backend::cuda::op::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::rows::{self, Rows};
use crate::backend::{AttnDims, GdnDims, Tensor};
use crate::error::Result;

pub(crate) fn conv1d_silu(inner: &Inner, x: &Tensor, w: &Tensor, states: &Tensor, r: Rows, out: &Tensor) -> Result<()> {
    let op = "conv1d_silu_rows";
    let (c, k) = rows::check_conv1d(x, w, states, r, out)?;
    let mut a = Args::default();
    a.p[0] = ptr(x, op)?;
    a.p[1] = ptr(w, op)?;
    a.p[2] = ptr(states, op)?;
    a.p[3] = ptr(out, op)?;
    a.p[4] = ptr(r.dev, op)?;
    a.n[0] = c as i64;
    a.n[1] = k as i64;
    inner.kernel_rw(
        Launch {
            name: ("rows_conv1d_silu", ""),
            grid: [
                grid_u32(op, "channel blocks", c.div_ceil(256))?,
                grid_u32(op, "rows", r.len())?,
                1,
            ],
            block: 256,
            smem: 0,
            args: a,
            phase: Phase::Conv,
        },
        0.0,
        &[x, w, r.dev],
        &[states, out],
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_rule(
    inner: &Inner,
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    states: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    r: Rows,
) -> Result<()> {
    let op = "delta_rule_rows";
    rows::check_delta_rule(u, g, beta, states, out, dims, r)?;
    // Columns per lane: one kernel per register budget (as `delta_rule_recurrent`).
    let kernel = match dims.dk {
        0..=128 => "rows_delta_rule_4",
        129..=256 => "rows_delta_rule_8",
        257..=512 => "rows_delta_rule_16",
        dk => return Err(cuda_err(format!("{op}: key head dim {dk} > 512 is not supported"))),
    };
    let mut a = Args::default();
    a.p[0] = ptr(u, op)?;
    a.p[1] = ptr(g, op)?;
    a.p[2] = ptr(beta, op)?;
    a.p[3] = ptr(states, op)?;
    a.p[4] = ptr(out, op)?;
    a.p[5] = ptr(r.dev, op)?;
    a.n[1] = dims.hk as i64;
    a.n[2] = dims.hv as i64;
    a.n[3] = dims.dk as i64;
    a.n[4] = dims.dv as i64;
    inner.kernel_rw(
        Launch {
            name: (kernel, ""),
            grid: [
                grid_u32(op, "heads", dims.hv)?,
                grid_u32(op, "row groups", dims.dv.div_ceil(4))?,
                grid_u32(op, "rows", r.len())?,
            ],
            block: 128,
            smem: 0,
            args: a,
            phase: Phase::DeltaRule,
        },
        0.0,
        &[u, g, beta, r.dev],
        &[states, out],
    )
}

pub(crate) fn rope_neox(inner: &Inner, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, r: Rows) -> Result<()> {
    let op = "rope_neox_rows";
    rows::check_rope(x, head_dim, n_rot, theta, r)?;
    let n_head = x.cols() / head_dim;
    if n_rot < 2 || n_head == 0 {
        return Ok(());
    }
    let mut a = Args::default();
    a.p[0] = ptr(x, op)?;
    a.p[1] = ptr(r.dev, op)?;
    a.n[0] = n_head as i64;
    a.n[1] = head_dim as i64;
    a.n[2] = n_rot as i64;
    a.f[0] = theta;
    inner.kernel_rw(
        Launch {
            name: ("rows_rope_neox", ""),
            grid: [grid_u32(op, "heads", n_head)?, grid_u32(op, "rows", r.len())?, 1],
            block: ((n_rot / 2).div_ceil(32) * 32).clamp(32, 256) as u32,
            smem: 0,
            args: a,
            phase: Phase::Attention,
        },
        0.0,
        &[r.dev],
        &[x],
    )
}

pub(crate) fn kv_store(
    inner: &Inner,
    k: &Tensor,
    v: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    ctx: usize,
    r: Rows,
) -> Result<()> {
    let op = "kv_store_rows";
    rows::check_kv_store(k, v, k_pool, v_pool, ctx, r)?;
    let w = k.cols();
    if w == 0 {
        return Ok(());
    }
    let mut a = Args::default();
    a.p[0] = ptr(k, op)?;
    a.p[1] = ptr(v, op)?;
    a.p[2] = ptr(k_pool, op)?;
    a.p[3] = ptr(v_pool, op)?;
    a.p[4] = ptr(r.dev, op)?;
    a.n[0] = w as i64;
    a.n[1] = ctx as i64;
    inner.kernel_rw(
        Launch {
            name: ("rows_kv_store", ""),
            grid: [
                grid_u32(op, "width blocks", w.div_ceil(256))?,
                grid_u32(op, "rows", r.len())?,
                1,
            ],
            block: 256,
            smem: 0,
            args: a,
            phase: Phase::Attention,
        },
        0.0,
        &[k, v, r.dev],
        &[k_pool, v_pool],
    )
}

/// The attention kernel for `dims`: query heads per block (sharing one KV head, so each K/V
/// row loaded serves them all) and dims per lane, within the kernels' register budget
/// (heads x dims-per-lane/32 <= 32; rows.cu `ROWS_ATTN`). `None`: head dim above 512.
fn attn_kernel(dims: AttnDims) -> Option<(&'static str, usize)> {
    let dl = match dims.head_dim {
        0..=64 => 2,
        65..=128 => 4,
        129..=256 => 8,
        257..=512 => 16,
        _ => return None,
    };
    let group = dims.n_head / dims.n_head_kv.max(1);
    let hb = [4, 2, 1]
        .into_iter()
        .find(|&hb| group.is_multiple_of(hb) && hb * dl <= 32)
        .unwrap_or(1);
    let name = match (hb, dl) {
        (1, 2) => "rows_attn_1_2",
        (1, 4) => "rows_attn_1_4",
        (1, 8) => "rows_attn_1_8",
        (1, _) => "rows_attn_1_16",
        (2, 2) => "rows_attn_2_2",
        (2, 4) => "rows_attn_2_4",
        (2, 8) => "rows_attn_2_8",
        (2, _) => "rows_attn_2_16",
        (_, 2) => "rows_attn_4_2",
        (_, 4) => "rows_attn_4_4",
        _ => "rows_attn_4_8",
    };
    Some((name, hb))
}

/// Splits of the key range, from shapes only (never a row's position): enough blocks for about
/// 8 blocks of 4 warps per SM when every row is full (the loop over keys is latency-bound), at
/// most ~1024 keys per block, at least 64 keys per split, at most 64 splits (the partials are
/// `B x H x S x (D + 2)` floats). Rows shorter than the context leave their later splits idle.
fn attn_splits(sms: usize, blocks_per_split: usize, ctx: usize) -> usize {
    let want = (8 * sms).div_ceil(blocks_per_split.max(1)).max(ctx.div_ceil(1024));
    want.min(ctx.div_ceil(64)).clamp(1, 64)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    inner: &Inner,
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    ctx: usize,
    r: Rows,
    dims: AttnDims,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    let op = "attention_rows";
    rows::check_attention(q, k_pool, v_pool, ctx, r, dims, out)?;
    let AttnDims {
        n_head: h,
        n_head_kv: hkv,
        head_dim: d,
    } = dims;
    let (kernel, hb) =
        attn_kernel(dims).ok_or_else(|| cuda_err(format!("{op}: head dim {d} > 512 is not supported")))?;
    let b = r.len();
    let s = attn_splits(inner.sms(), b * (h / hb), ctx);
    let chunk = ctx.div_ceil(s);
    // The partials' workspace stays locked until the combine is submitted.
    let ws = inner.workspaces()?;
    let part = if s > 1 {
        ws.get("attention rows", b * h * s * (d + 2) * 4)?
    } else {
        0
    };
    let mut a = Args::default();
    a.p[0] = ptr(q, op)?;
    a.p[1] = ptr(k_pool, op)?;
    a.p[2] = ptr(v_pool, op)?;
    a.p[3] = ptr(out, op)?;
    a.p[4] = ptr(r.dev, op)?;
    a.p[5] = part;
    a.n[0] = h as i64;
    a.n[1] = hkv as i64;
    a.n[2] = d as i64;
    a.n[3] = s as i64;
    a.n[4] = ctx as i64;
    a.n[5] = chunk as i64;
    a.f[0] = scale;
    let gb = grid_u32(op, "rows", b)?;
    inner.kernel_rw(
        Launch {
            name: (kernel, ""),
            grid: [grid_u32(op, "head groups", h / hb)?, gb, s as u32],
            block: 128,
            smem: 0,
            args: a,
            phase: Phase::Attention,
        },
        0.0,
        &[q, k_pool, v_pool, r.dev],
        &[out],
    )?;
    if s == 1 {
        return Ok(());
    }
    let mut c = Args::default();
    c.p[0] = part;
    c.p[1] = ptr(out, op)?;
    c.p[2] = ptr(r.dev, op)?;
    c.n[0] = h as i64;
    c.n[1] = d as i64;
    c.n[2] = s as i64;
    c.n[3] = ctx as i64;
    c.n[4] = chunk as i64;
    inner.kernel_rw(
        Launch {
            name: ("rows_attn_combine", ""),
            grid: [grid_u32(op, "heads", h)?, gb, 1],
            block: 128,
            smem: 0,
            args: c,
            phase: Phase::Attention,
        },
        0.0,
        &[r.dev],
        &[out],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(n_head: usize, n_head_kv: usize, head_dim: usize) -> AttnDims {
        AttnDims {
            n_head,
            n_head_kv,
            head_dim,
        }
    }

    #[test]
    fn attention_kernel_shares_kv_heads_within_registers() {
        assert_eq!(attn_kernel(dims(16, 4, 256)), Some(("rows_attn_4_8", 4)));
        assert_eq!(attn_kernel(dims(6, 2, 40)), Some(("rows_attn_1_2", 1)));
        assert_eq!(attn_kernel(dims(4, 2, 40)), Some(("rows_attn_2_2", 2)));
        assert_eq!(attn_kernel(dims(4, 4, 64)), Some(("rows_attn_1_2", 1)));
        assert_eq!(attn_kernel(dims(8, 1, 512)), Some(("rows_attn_2_16", 2)));
        assert_eq!(attn_kernel(dims(9, 3, 128)), Some(("rows_attn_1_4", 1)));
        assert_eq!(attn_kernel(dims(4, 1, 513)), None);
    }

    #[test]
    fn attention_splits_follow_shapes() {
        // 9B at B = 64 on 132 SMs: 256 blocks per split.
        assert_eq!(attn_splits(132, 256, 4096), 5);
        // Many rows, short context: one split, no combine pass.
        assert_eq!(attn_splits(132, 1024, 700), 2);
        assert_eq!(attn_splits(132, 4096, 700), 1);
        // Long contexts bound the keys per block; tiny ones the splits.
        assert_eq!(attn_splits(132, 4096, 32768), 32);
        assert_eq!(attn_splits(132, 1, 100), 2);
        assert_eq!(attn_splits(132, 1, 1 << 20), 64);
    }
}
