//! MoE routing and the routed experts (spec/MODEL.md §7.2).
//!
//! `moe_route` is one dispatch, one workgroup per token (softmax, then each expert's rank among
//! the others: the top k are those of rank < k). `moe_experts` is four dispatches (per piece of the expert weights): gate projection
//! of every (token, slot) into a scratch `h [T·k, n_ff]`, up projection combined in place into
//! `h = silu(gate) · up`, down projection into `y [T·k, d]`, and the weighted sum over each
//! token's slots into `out`. The projections of long rows use the matrix-vector units of
//! `matvec.wgsl` (`moe_matvec.wgsl`), those of short rows one invocation per row (`moe_rows.wgsl`).

use super::{pieces, row_bytes, u32_of, weight_type, MATMUL_ROWS_MAX_IN};
use crate::backend::wgpu::kernels::{self, Kernel, ELT_WG, MM_ROWS_WG, MOE_MAX_E, MOE_MAX_K};
use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{check, DType, Tensor};
use crate::error::Result;

/// Most experts per token (`moe_route.wgsl`/`moe_combine.wgsl` keep per-slot workgroup arrays).
const MAX_K: usize = MOE_MAX_K as usize;
/// Most experts `moe_route` handles (its probabilities live in workgroup memory).
const MAX_EXPERTS: usize = MOE_MAX_E as usize;

pub(crate) fn moe_route(
    be: &WgpuBackend,
    logits: &Tensor,
    k: usize,
    scale: f32,
    ids: &Tensor,
    weights: &Tensor,
) -> Result<()> {
    let op = "moe_route";
    let (n_tok, n_exp) = check::moe_route(logits, k, ids, weights)?;
    if k > MAX_K || n_exp > MAX_EXPERTS {
        return Err(gpu_err(format!(
            "{op}: top-{k} of {n_exp} experts (supported: k <= {MAX_K}, E <= {MAX_EXPERTS})"
        )));
    }
    let n = u32_of(op, "tokens", n_tok)?;
    u32_of(op, "logits", logits.numel())?;
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(n);
    enc.run(
        Kernel::MoeRoute,
        None,
        &[n, n_exp as u32, k as u32, scale.to_bits()],
        &[logits.into(), ids.into(), weights.into()],
        [gx, gy, 1],
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_experts(
    be: &WgpuBackend,
    x: &Tensor,
    gate_exps: &Tensor,
    up_exps: &Tensor,
    down_exps: &Tensor,
    ids: &Tensor,
    weights: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let op = "moe_experts";
    let check::MoeDims {
        t: n_tok,
        d,
        n_exp,
        n_ff,
        k,
    } = check::moe_experts(x, gate_exps, up_exps, down_exps, ids, weights, out)?;
    if k > MAX_K {
        return Err(gpu_err(format!("{op}: {k} experts per token (at most {MAX_K})")));
    }
    let slots = n_tok * k;
    for (what, v) in [
        ("x", x.numel()),
        ("slots", slots),
        ("h", slots.saturating_mul(n_ff)),
        ("y", slots.saturating_mul(d)),
        ("experts", n_exp),
    ] {
        u32_of(op, what, v)?;
    }
    if n_tok == 0 || d == 0 {
        return Ok(());
    }
    let mut enc = be.encoder()?;
    // Intermediates persist in the backend's scratch pool (grown once, never per token); the
    // dispatches that share them are recorded under one hold of the encoder.
    let h = enc.scratch("moe_h", DType::F32, &[slots, n_ff])?;
    let y = enc.scratch("moe_y", DType::F32, &[slots, d])?;
    let s32 = slots as u32;
    // gate -> h, then h = silu(h) * up, then down -> y; each per piece of experts.
    for (w, rows, cols, in_div, inp, dst, mode) in [
        (gate_exps, n_ff, d, k, x, &h, 0u32),
        (up_exps, n_ff, d, k, x, &h, 1),
        (down_exps, d, n_ff, 1, &h, &y, 0),
    ] {
        let ty = weight_type(op, w.dtype)?;
        let rb = row_bytes(op, ty, cols)?;
        let expert_bytes = rb * rows as u64;
        // Short rows: one invocation per (slot, row); long ones: a workgroup per few rows of a
        // slot, its row groups' lanes striding over the rows' matrix-vector units.
        // Rows that are not whole units of the format's matrix-vector decoder (never in a model
        // file: their rows are whole K-quant blocks) also take one invocation per row.
        let unit = kernels::mv_unit(ty);
        let short = cols <= MATMUL_ROWS_MAX_IN || !cols.is_multiple_of(unit);
        let lanes = kernels::mv_lanes(&be.caps, cols / unit);
        let row_groups = (rows as u32).div_ceil(kernels::mv_rows_per_wg(&be.caps, lanes));
        let (kernel, n_wg) = if short {
            // slots · rows fits u32: it is the size of h or y.
            (Kernel::MoeRows, (s32 * rows as u32).div_ceil(MM_ROWS_WG))
        } else {
            let n_wg = s32
                .checked_mul(row_groups)
                .ok_or_else(|| gpu_err(format!("{op}: too many workgroups")))?;
            (Kernel::MoeMatvec, n_wg)
        };
        let [gx, gy] = enc.grid(n_wg);
        for p in pieces(&be.caps, op, w, n_exp, expert_bytes)? {
            let params = [
                s32,
                rows as u32,
                cols as u32,
                rb as u32,
                in_div as u32,
                mode,
                row_groups,
                p.row0 as u32,
                p.rows as u32,
                (cols / unit) as u32,
                lanes,
            ];
            enc.run(
                kernel,
                Some(ty),
                &params,
                &[p.bind(w), ids.into(), inp.into(), dst.into()],
                [gx, gy, 1],
            )?;
        }
    }
    let d32 = d as u32;
    let chunks = d32.div_ceil(ELT_WG);
    let n_wg = (n_tok as u32)
        .checked_mul(chunks)
        .ok_or_else(|| gpu_err(format!("{op}: too many workgroups")))?;
    let [gx, gy] = enc.grid(n_wg);
    enc.run(
        Kernel::MoeCombine,
        None,
        &[n_tok as u32, d32, k as u32, n_exp as u32, chunks],
        &[ids.into(), weights.into(), (&y).into(), out.into()],
        [gx, gy, 1],
    )
}
