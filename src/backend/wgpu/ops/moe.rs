//! MoE routing and the routed experts (spec/MODEL.md §7.2).
//!
//! `moe_route` is one dispatch, one workgroup per token (softmax, then each expert's rank among
//! the others: the top k are those of rank < k). `moe_experts` is four dispatches (per piece of the expert weights): gate projection
//! of every (token, slot) into a scratch `h [T·k, n_ff]`, up projection combined in place into
//! `h = silu(gate) · up`, down projection into `y [T·k, d]`, and the weighted sum over each
//! token's slots into `out`. The projections of long rows use the matrix-vector units of
//! `matvec.wgsl` (`moe_matvec.wgsl`), those of short rows one invocation per row (`moe_rows.wgsl`).
//!
//! `moe_experts_shared` at decode is two dispatches: the shared expert is entry k of each token's
//! k + 1, its gate and up products among the routed experts' (`moe_swiglu_sh.wgsl`, gate, up and
//! SwiGLU in one pass), its down product in each token's weighted sum, which the down dispatch
//! makes itself (`moe_down_sh.wgsl`): two dependent dispatches per MoE layer instead of seven
//! (`policy::moe_shared` decides).

use super::{pieces, row_bytes, u32_of, weight_type, Piece, MATMUL_ROWS_MAX_IN};
use crate::backend::wgpu::geometry::MOE_MAX_K;
use crate::backend::wgpu::kernels::{self, Kernel, ELT_WG, MM_ROWS_WG, MOE_MAX_E};
use crate::backend::wgpu::policy::{self, MoeShape, MoeShared};
use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{check, DType, MoeExperts, Tensor};
use crate::error::Result;
use crate::gguf::GgmlType;

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
        let row_groups = (rows as u32).div_ceil(kernels::mv_rows_per_wg(&be.caps, Kernel::MoeMatvec, ty, lanes));
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

/// `moe_experts_shared` with the shared expert as one more expert per token (the module's
/// notes): `moe_swiglu_sh` into hidden rows, then `moe_down_sh` into `out`. The routed experts'
/// hidden rows are bit for bit `moe_experts`'; the down sums add the routed and shared terms in
/// slot order inside one reduction (another rounding order, within the matrix-vector bound, as
/// the shared expert's own products are: tests/device_moe.rs `experts_shared_*`). Taken for a
/// decode batch whose shared expert has the routed experts' hidden width and, per projection,
/// their format (gate and up one format), rows of whole matrix-vector units, and every weight in
/// one binding; `Ok(false)` otherwise (nothing done: the caller composes the plain ops).
pub(crate) fn moe_experts_shared(be: &WgpuBackend, x: &Tensor, e: MoeExperts<'_>, out: &Tensor) -> Result<bool> {
    let dims = check::moe_experts_shared(x, e, out)?;
    experts_shared(be, "moe_experts_shared", dims, x, e, out)
}

/// `moe_experts_shared`'s two dispatches where they apply (`Ok(false)` where not: nothing done);
/// `dims` from the op's checks.
fn experts_shared(
    be: &WgpuBackend,
    op: &str,
    (m, n_ff_sh): (check::MoeDims, usize),
    x: &Tensor,
    e: MoeExperts<'_>,
    out: &Tensor,
) -> Result<bool> {
    let MoeExperts {
        gate_exps,
        up_exps,
        down_exps,
        ids,
        weights,
        sh,
    } = e;
    let check::MoeDims {
        t: n_tok,
        d,
        n_exp,
        n_ff,
        k,
    } = m;
    let shape = MoeShape {
        n_tok,
        k,
        n_embd: d,
        n_ff,
        n_ff_shared: n_ff_sh,
    };
    if policy::moe_shared(be.caps.device(), shape) == MoeShared::Composed {
        return Ok(false);
    }
    let gty = weight_type(op, gate_exps.dtype)?;
    let dty = weight_type(op, down_exps.dtype)?;
    for (w, ty) in [(up_exps, gty), (sh.gate, gty), (sh.up, gty), (sh.down, dty)] {
        if weight_type(op, w.dtype)? != ty {
            return Ok(false);
        }
    }
    // Formats on the generic unit take the composition: in the fused kernels every weight access
    // of its element-by-element decoding branches over four bindings, and LLVM (lavapipe)
    // took minutes to compile `moe_swiglu_sh/q5_0` (a CI run's longest job); their kernels of one
    // binding compile in milliseconds.
    if !kernels::mv_whole_word(gty) || !kernels::mv_whole_word(dty) {
        return Ok(false);
    }
    let (g_unit, d_unit) = (kernels::mv_unit(gty), kernels::mv_unit(dty));
    if !d.is_multiple_of(g_unit) || !n_ff.is_multiple_of(d_unit) {
        return Ok(false);
    }
    let (g_rb, d_rb) = (row_bytes(op, gty, d)?, row_bytes(op, dty, n_ff)?);
    // The kernels tell the shared expert's matrices from the routed ones by binding, so each
    // weight must be one binding.
    let one = |w: &Tensor, rows: usize, rb: u64| -> Result<Option<Piece>> {
        let mut p = pieces(&be.caps, op, w, rows, rb)?;
        Ok(match (p.next(), p.next()) {
            (Some(first), None) => Some(first),
            _ => None,
        })
    };
    let (e_ff, e_d) = (n_exp.saturating_mul(n_ff), n_exp.saturating_mul(d));
    let (Some(pg), Some(pu), Some(psg), Some(psu), Some(pd), Some(psd)) = (
        one(gate_exps, e_ff, g_rb)?,
        one(up_exps, e_ff, g_rb)?,
        one(sh.gate, n_ff, g_rb)?,
        one(sh.up, n_ff, g_rb)?,
        one(down_exps, e_d, d_rb)?,
        one(sh.down, d, d_rb)?,
    ) else {
        return Ok(false);
    };
    let entries = n_tok * (k + 1);
    for (what, v) in [
        ("x", x.numel()),
        ("h", entries.saturating_mul(n_ff)),
        ("out", out.numel()),
        ("experts", n_exp),
    ] {
        u32_of(op, what, v)?;
    }
    let mut enc = be.encoder()?;
    let h = enc.scratch("moe_h", DType::F32, &[entries, n_ff])?;
    // Parameters (lib_moe_sh.wgsl) and workgroups of a projection of `rows` rows of `cols`
    // elements, rb bytes each, for `n` entries or tokens, whose row groups' lanes stride over
    // `runs` rows' units (the down products run every entry's row of a token in one stride).
    let geometry = |ty: GgmlType, rows: usize, cols: usize, unit: usize, rb: u64, n: usize, runs: usize| {
        let lanes = kernels::mv_lanes(&be.caps, cols / unit * runs);
        // The shared-expert kernels (moe_swiglu_sh, moe_down_sh) take the general rows.
        let row_groups = (rows as u32).div_ceil(kernels::mv_rows_per_wg(&be.caps, Kernel::MoeSwigluSh, ty, lanes));
        let n_wg = (n as u32)
            .checked_mul(row_groups)
            .ok_or_else(|| gpu_err(format!("{op}: too many workgroups")))?;
        let params = [
            n_tok as u32,
            k as u32,
            n_exp as u32,
            rows as u32,
            cols as u32,
            u32_of(op, "row bytes", rb as usize)?,
            row_groups,
            (cols / unit) as u32,
            lanes,
        ];
        Ok::<_, crate::error::Error>((params, be.grid(n_wg)))
    };
    let (params, [gx, gy]) = geometry(gty, n_ff, d, g_unit, g_rb, entries, 1)?;
    let binds = [
        pg.bind(gate_exps),
        pu.bind(up_exps),
        psg.bind(sh.gate),
        psu.bind(sh.up),
        ids.into(),
        x.into(),
        (&h).into(),
    ];
    enc.run(Kernel::MoeSwigluSh, Some(gty), &params, &binds, [gx, gy, 1])?;
    let (params, [gx, gy]) = geometry(dty, d, n_ff, d_unit, d_rb, n_tok, k + 1)?;
    enc.run(
        Kernel::MoeDownSh,
        Some(dty),
        &params,
        &[
            pd.bind(down_exps),
            psd.bind(sh.down),
            ids.into(),
            weights.into(),
            sh.gate_logit.into(),
            (&h).into(),
            out.into(),
        ],
        [gx, gy, 1],
    )?;
    Ok(true)
}
