//! The ops of steps whose rows belong to different sequences (`backend::rows`, DESIGN.md "Many
//! sequences in one step"): one dispatch for all B rows (attention: a split and a merge), each
//! kernel reading the rows' `(slot, pos)` from `Rows::dev` on the device, so that a recorded step
//! stays valid when the rows change; the host's copy serves only the contract's checks, which run
//! first.
//!
//! * `conv1d_silu_rows.wgsl`: an invocation per (channel, row).
//! * `delta_rule_rows.wgsl`: `delta_rule_recurrent.wgsl`'s layout for one token (a row group per
//!   state row, coalesced, each row's state read and written once) with the row on grid z.
//! * `rope_neox_rows.wgsl`, `kv_store_rows.wgsl`: an invocation per pair / element.
//! * `attention_rows_split.wgsl` + `attention_rows_combine.wgsl`: flash-decoding as `attention`'s
//!   decode path, a workgroup per (row, head, piece of the row's keys) on `ATT_SPLITS` pieces per
//!   row whatever its position (`lib_att_rows.wgsl`), the pieces past a row's keys returning at
//!   once.
//!
//! A pool larger than one storage binding (lavapipe and browsers: 128 MiB; a KV pool of the 9B for
//! 64 slots of 700 positions is 184 MB) is bound in pieces of whole slots (`ops::pieces`), one
//! dispatch per piece, each skipping the rows whose slot lies in another piece. A pool that fits
//! (the usual case on a GPU) takes one.

use super::{buffer, piece_rows, pieces, u32_of, Pieces, MAX_PIECE};
use crate::backend::rows::{self, Rows};
use crate::backend::wgpu::geometry::ATT_MAX_D;
use crate::backend::wgpu::kernels::{delta_rec_rows, Kernel, ATT_SPLITS, CONV_WG, ELT_WG};
use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{AttnDims, DType, GdnDims, Tensor};
use crate::error::Result;

/// The pieces of whole slots a pool of `n_slots` slots of `slot_elems` f32s is bound in. A pool
/// that needs pieces when not even one slot fits a binding is refused naming what to shorten.
fn slot_pieces(be: &WgpuBackend, op: &str, pool: &Tensor, n_slots: usize, slot_elems: usize) -> Result<Pieces> {
    let caps = &be.caps;
    let slot_bytes = slot_elems as u64 * 4;
    if buffer::get(pool)?.size > caps.max_binding.min(MAX_PIECE) && piece_rows(caps, slot_bytes).is_none() {
        return Err(gpu_err(format!(
            "{op}: one slot of the pool {:?} ({slot_bytes} bytes) exceeds this device's storage binding limit \
             of {} bytes (use a shorter context, or --backend cpu)",
            pool.shape, caps.max_binding
        )));
    }
    pieces(caps, op, pool, n_slots, slot_bytes)
}

/// A step's row count as the workgroups of one grid dimension.
fn row_count(be: &WgpuBackend, op: &str, b: usize) -> Result<u32> {
    let n = u32_of(op, "rows", b)?;
    if n > be.caps.max_workgroups_per_dim {
        return Err(gpu_err(format!(
            "{op}: {b} rows exceed the {} workgroups of one dispatch dimension",
            be.caps.max_workgroups_per_dim
        )));
    }
    Ok(n)
}

/// x, out `[B, C]`, w `[C, K]`, states `[S * (K-1), C]`.
pub(crate) fn conv1d_silu_rows(
    be: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    states: &Tensor,
    r: Rows,
    out: &Tensor,
) -> Result<()> {
    let op = "conv1d_silu_rows";
    let (c, k) = rows::check_conv1d(x, w, states, r, out)?;
    u32_of(op, "elements", x.numel().max(w.numel()))?;
    let b = row_count(be, op, x.rows())?;
    let groups = u32_of(op, "channel groups", c.div_ceil(CONV_WG as usize))?;
    let n_slots = states.rows() / (k - 1);
    let mut enc = be.encoder()?;
    for p in slot_pieces(be, op, states, n_slots, (k - 1) * c)? {
        enc.run(
            Kernel::ConvRows,
            None,
            &[c as u32, k as u32, p.row0 as u32, p.rows as u32],
            &[r.dev.into(), x.into(), w.into(), p.bind(states), out.into()],
            [groups, b, 1],
        )?;
    }
    Ok(())
}

/// u `[B, conv_dim]`, g, beta `[B, Hv]`, states `[S * Hv * dv, dk]`, out `[B, Hv * dv]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_rule_rows(
    be: &WgpuBackend,
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
    u32_of(op, "elements of u", u.numel().max(out.numel()))?;
    let b = row_count(be, op, u.rows())?;
    let GdnDims { hk, hv, dk, dv } = dims;
    let blocks = u32_of(op, "row blocks", dv.div_ceil(delta_rec_rows(&be.caps) as usize))?;
    let per_slot = hv * dv;
    let mut enc = be.encoder()?;
    for p in slot_pieces(be, op, states, states.rows() / per_slot, per_slot * dk)? {
        let params = [hk, hv, dk, dv, dims.conv_dim(), p.row0, p.rows].map(|x| x as u32);
        enc.run(
            Kernel::DeltaRows,
            None,
            &params,
            &[
                r.dev.into(),
                u.into(),
                g.into(),
                beta.into(),
                p.bind(states),
                out.into(),
            ],
            [blocks, u32_of(op, "value heads", hv)?, b],
        )?;
    }
    Ok(())
}

/// In place RoPE of x `[B, nh * head_dim]`, row `r` at `rows[r].pos` (see `ops::rope_neox` for
/// the precision).
pub(crate) fn rope_neox_rows(
    be: &WgpuBackend,
    x: &Tensor,
    head_dim: usize,
    n_rot: usize,
    theta: f32,
    r: Rows,
) -> Result<()> {
    let op = "rope_neox_rows";
    rows::check_rope(x, head_dim, n_rot, theta, r)?;
    // Positions are converted to f32 in the shader: exact below 2^24.
    if let Some(row) = r.host.iter().find(|row| row.pos >= 1 << 24) {
        return Err(gpu_err(format!("{op}: position {} is out of range", row.pos)));
    }
    super::attention::rope_dispatch(be, Kernel::RopeRows, op, x, head_dim, n_rot, theta, r.dev)
}

/// k, v `[B, W]` into the pools `[S * ctx, W]` at each row's slot and position.
pub(crate) fn kv_store_rows(
    be: &WgpuBackend,
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
    let n = u32_of(op, "elements", k.numel())?;
    let ctx32 = u32_of(op, "ctx", ctx)?;
    let n_slots = k_pool.rows() / ctx;
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(n.div_ceil(ELT_WG));
    let kp = slot_pieces(be, op, k_pool, n_slots, ctx * w)?;
    for (pk, pv) in kp.zip(slot_pieces(be, op, v_pool, n_slots, ctx * w)?) {
        same_slots(op, pk.row0, pk.rows, pv.row0, pv.rows)?;
        enc.run(
            Kernel::KvStoreRows,
            None,
            &[n, w as u32, ctx32, pk.row0 as u32, pk.rows as u32],
            &[r.dev.into(), k.into(), v.into(), pk.bind(k_pool), pv.bind(v_pool)],
            [gx, gy, 1],
        )?;
    }
    Ok(())
}

/// The k and v pools (of one shape) are bound in the same pieces; a kernel takes one slot range.
fn same_slots(op: &str, k0: usize, kn: usize, v0: usize, vn: usize) -> Result<()> {
    if (k0, kn) != (v0, vn) {
        return Err(gpu_err(format!(
            "{op}: k pool piece {k0}+{kn} and v pool piece {v0}+{vn} differ"
        )));
    }
    Ok(())
}

/// Each row's query q `[B, H * D]` against its slot's rows `0..=pos` of the pools
/// `[S * ctx, Hkv * D]` into out `[B, H * D]`: the split pass per pool piece, then the merge, in
/// batches of rows whose pieces' partial results (`[rows * H, ATT_SPLITS, D + 2]`) fit one
/// binding.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_rows(
    be: &WgpuBackend,
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
        n_head: nh,
        n_head_kv: nkv,
        head_dim: d,
    } = dims;
    if d > ATT_MAX_D as usize {
        return Err(gpu_err(format!("{op}: head_dim {d} exceeds {ATT_MAX_D}")));
    }
    u32_of(op, "elements", q.numel())?;
    let (b, n_slots, slot_elems) = (q.rows(), k_pool.rows() / ctx, ctx * nkv * d);
    let ctx32 = u32_of(op, "ctx", ctx)?;
    let row_bytes = (nh * ATT_SPLITS as usize * (d + 2) * 4) as u64;
    let batch = (be.caps.max_binding.min(MAX_PIECE) / row_bytes).min(b as u64) as usize;
    if batch == 0 {
        return Err(gpu_err(format!(
            "{op}: one row's partial results ({row_bytes} bytes) exceed the storage binding limit"
        )));
    }
    let mut enc = be.encoder()?;
    let part = enc.scratch("att_part", DType::F32, &[batch * nh, ATT_SPLITS as usize, d + 2])?;
    for b0 in (0..b).step_by(batch) {
        let n_rows = u32_of(op, "query rows", batch.min(b - b0) * nh)?;
        let [gx, gy] = enc.grid(n_rows);
        let kp = slot_pieces(be, op, k_pool, n_slots, slot_elems)?;
        for (pk, pv) in kp.zip(slot_pieces(be, op, v_pool, n_slots, slot_elems)?) {
            same_slots(op, pk.row0, pk.rows, pv.row0, pv.rows)?;
            let params = [
                nh as u32,
                (nh / nkv) as u32,
                d as u32,
                scale.to_bits(),
                ctx32,
                pk.row0 as u32,
                pk.rows as u32,
                b0 as u32,
            ];
            enc.run(
                Kernel::AttentionRowsSplit,
                None,
                &params,
                &[r.dev.into(), q.into(), pk.bind(k_pool), pv.bind(v_pool), (&part).into()],
                [gx, gy, ATT_SPLITS],
            )?;
        }
        enc.run(
            Kernel::AttentionRowsCombine,
            None,
            &[d as u32, nh as u32, b0 as u32],
            &[r.dev.into(), (&part).into(), out.into()],
            [gx, gy, 1],
        )?;
    }
    Ok(())
}
