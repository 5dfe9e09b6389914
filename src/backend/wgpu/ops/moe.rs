//! MoE routing and the routed experts (spec/MODEL.md §7.2).
//!
//! `moe_route` is one dispatch, one workgroup per token (softmax, then k rounds of an argmax
//! reduction). `moe_experts` is four dispatches, because a dequant snippet reads exactly one weight
//! binding (`W`): gate projection of every (token, slot) into a scratch `h [T·k, n_ff]`, up
//! projection combined in place into `h = silu(gate) · up`, down projection into `y [T·k, d]`, and
//! the weighted sum over each token's slots into `out`.

use super::linear::weight_variant;
use crate::backend::wgpu::{buffer, gpu_err, WgpuBackend};
use crate::backend::{check, DType, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[
    ("moe_route", include_str!("../../../../shaders-wgsl/moe_route.wgsl")),
    ("moe_matvec", include_str!("../../../../shaders-wgsl/moe_matvec.wgsl")),
    ("moe_combine", include_str!("../../../../shaders-wgsl/moe_combine.wgsl")),
];

/// Most experts per token (`moe_route.wgsl`/`moe_combine.wgsl` keep per-slot workgroup arrays).
const MAX_K: usize = 16;
/// Most experts `moe_route` handles (its probabilities live in workgroup memory).
const MAX_EXPERTS: usize = 2048;
/// Workgroup geometry of `moe_matvec.wgsl`: output rows per workgroup.
const MATVEC_ROWS: usize = 8;

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
    let n = check::u32_index(op, "tokens", n_tok)?;
    check::u32_index(op, "logits", logits.numel())?;
    let [gx, gy] = be.grid(n);
    be.dispatch(
        "moe_route",
        "",
        &[n, n_exp as u32, k as u32, scale.to_bits()],
        &[logits, ids, weights],
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
    // Variants and byte geometry of the three weights; every byte offset must fit in a u32.
    let mut geo = Vec::with_capacity(3);
    for (w, rows, cols) in [(gate_exps, n_ff, d), (up_exps, n_ff, d), (down_exps, d, n_ff)] {
        let (v, ty) = weight_variant(op, w.dtype)?;
        let rb = ty
            .row_size(cols as u64)
            .ok_or_else(|| gpu_err(format!("{op}: a row of {cols} is not a whole number of {ty} blocks")))?;
        let total = rb
            .checked_mul(rows as u64)
            .and_then(|b| b.checked_mul(n_exp as u64))
            .filter(|&b| b <= u32::MAX as u64)
            .ok_or_else(|| gpu_err(format!("{op}: expert weight {:?} exceeds 4 GiB", w.shape)))?;
        let have = buffer::get(w)?.size;
        if have < total {
            return Err(gpu_err(format!(
                "{op}: weight {:?} needs {total} bytes, its buffer has {have}",
                w.shape
            )));
        }
        geo.push((v, rb as u32));
    }
    let slots = n_tok * k;
    for (what, v) in [
        ("x", x.numel()),
        ("slots", slots),
        ("h", slots.saturating_mul(n_ff)),
        ("y", slots.saturating_mul(d)),
        ("experts", n_exp),
    ] {
        check::u32_index(op, what, v)?;
    }
    if n_tok == 0 || d == 0 {
        return Ok(());
    }

    let (s32, d32, f32_, e32) = (slots as u32, d as u32, n_ff as u32, n_exp as u32);
    // Intermediates persist in the backend's scratch pool (grown once, never per token).
    let h = buffer::scratch(be, "moe_h", DType::F32, &[slots, n_ff])?;
    let y = buffer::scratch(be, "moe_y", DType::F32, &[slots, d])?;
    // The four dispatches share the scratch `h`/`y`: record them without interleaving.
    let mut batch = be.batch()?;
    let mut matvec =
        |w: &Tensor, gi: usize, rows: u32, cols: u32, in_div: u32, inp: &Tensor, dst: &Tensor, mode: u32| {
            let (v, rb) = geo[gi];
            let row_groups = rows.div_ceil(MATVEC_ROWS as u32);
            let n_wg = s32
                .checked_mul(row_groups)
                .ok_or_else(|| gpu_err(format!("{op}: too many workgroups")))?;
            let [gx, gy] = be.grid(n_wg);
            batch.dispatch(
                "moe_matvec",
                v,
                &[s32, rows, cols, e32, rb, in_div, mode, row_groups],
                &[w, ids, inp, dst],
                [gx, gy, 1],
            )
        };
    // gate -> h, then h = silu(h) * up, then down -> y.
    matvec(gate_exps, 0, f32_, d32, k as u32, x, &h, 0)?;
    matvec(up_exps, 1, f32_, d32, k as u32, x, &h, 1)?;
    matvec(down_exps, 2, d32, f32_, 1, &h, &y, 0)?;
    let chunks = d32.div_ceil(256);
    let n_wg = (n_tok as u32)
        .checked_mul(chunks)
        .ok_or_else(|| gpu_err(format!("{op}: too many workgroups")))?;
    let [gx, gy] = be.grid(n_wg);
    batch.dispatch(
        "moe_combine",
        "",
        &[n_tok as u32, d32, k as u32, e32, chunks],
        &[ids, weights, &y, out],
        [gx, gy, 1],
    )
}
