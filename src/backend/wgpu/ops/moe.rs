//! MoE routing and the routed experts (spec/MODEL.md §7.2).
//!
//! `moe_route` is one dispatch, one workgroup per token (softmax, then k rounds of an argmax
//! reduction). `moe_experts` is four dispatches, because a dequant snippet reads exactly one weight
//! binding (`W`): gate projection of every (token, slot) into a scratch `h [T·k, n_ff]`, up
//! projection combined in place into `h = silu(gate) · up`, down projection into `y [T·k, d]`, and
//! the weighted sum over each token's slots into `out`.

use super::linear::weight_variant;
use crate::backend::wgpu::buffer::{self, check_dtype};
use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{DType, Tensor};
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

fn u32_of(op: &str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| gpu_err(format!("{op}: {what} = {v} does not fit in 32 bits")))
}

/// Outputs must not share a buffer with each other or with an input (wgpu forbids binding one
/// buffer both read-only and read-write in a dispatch).
fn no_alias(op: &str, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<()> {
    for (i, o) in outputs.iter().enumerate() {
        if outputs[i + 1..].iter().chain(inputs).any(|t| o.same_buffer(t)) {
            return Err(gpu_err(format!(
                "{op}: an output shares its buffer with another operand"
            )));
        }
    }
    Ok(())
}

pub(crate) fn moe_route(
    be: &WgpuBackend,
    logits: &Tensor,
    k: usize,
    scale: f32,
    ids: &Tensor,
    weights: &Tensor,
) -> Result<()> {
    let op = "moe_route";
    check_dtype(op, logits, DType::F32)?;
    check_dtype(op, ids, DType::U32)?;
    check_dtype(op, weights, DType::F32)?;
    let (n_tok, n_exp) = (logits.rows(), logits.cols());
    if k == 0 || k > n_exp || k > MAX_K || n_exp > MAX_EXPERTS {
        return Err(gpu_err(format!(
            "{op}: top-{k} of {n_exp} experts (supported: 1 <= k <= min(E, {MAX_K}), E <= {MAX_EXPERTS})"
        )));
    }
    if ids.numel() != n_tok * k || weights.numel() != n_tok * k {
        return Err(gpu_err(format!(
            "{op}: logits {:?} with k = {k} vs ids {:?} / weights {:?}",
            logits.shape, ids.shape, weights.shape
        )));
    }
    no_alias(op, &[ids, weights], &[logits])?;
    let n = u32_of(op, "tokens", n_tok)?;
    u32_of(op, "logits", logits.numel())?;
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
    check_dtype(op, x, DType::F32)?;
    check_dtype(op, ids, DType::U32)?;
    check_dtype(op, weights, DType::F32)?;
    check_dtype(op, out, DType::F32)?;
    let (n_tok, d) = (x.rows(), x.cols());
    if gate_exps.shape.len() != 3 || up_exps.shape != gate_exps.shape || down_exps.shape.len() != 3 {
        return Err(gpu_err(format!(
            "{op}: expert weights gate {:?} up {:?} down {:?}",
            gate_exps.shape, up_exps.shape, down_exps.shape
        )));
    }
    let (n_exp, n_ff) = (gate_exps.shape[0], gate_exps.shape[1]);
    if gate_exps.shape[2] != d || down_exps.shape != [n_exp, d, n_ff] {
        return Err(gpu_err(format!(
            "{op}: x {:?} vs gate {:?} / down {:?}",
            x.shape, gate_exps.shape, down_exps.shape
        )));
    }
    let k = ids.numel().checked_div(n_tok).unwrap_or(0);
    if ids.numel() != n_tok * k || weights.numel() != n_tok * k || out.numel() != n_tok * d {
        return Err(gpu_err(format!(
            "{op}: x {:?} vs ids {:?} / weights {:?} / out {:?}",
            x.shape, ids.shape, weights.shape, out.shape
        )));
    }
    if k > MAX_K {
        return Err(gpu_err(format!("{op}: {k} experts per token (at most {MAX_K})")));
    }
    no_alias(op, &[out], &[x, gate_exps, up_exps, down_exps, ids, weights])?;
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
        u32_of(op, what, v)?;
    }
    if n_tok == 0 || d == 0 {
        return Ok(());
    }

    let (s32, d32, f32_, e32) = (slots as u32, d as u32, n_ff as u32, n_exp as u32);
    let h = buffer::alloc(be, DType::F32, &[slots, n_ff])?;
    let y = buffer::alloc(be, DType::F32, &[slots, d])?;
    let matvec = |w: &Tensor, gi: usize, rows: u32, cols: u32, in_div: u32, inp: &Tensor, dst: &Tensor, mode: u32| {
        let (v, rb) = geo[gi];
        let row_groups = rows.div_ceil(MATVEC_ROWS as u32);
        let n_wg = s32
            .checked_mul(row_groups)
            .ok_or_else(|| gpu_err(format!("{op}: too many workgroups")))?;
        let [gx, gy] = be.grid(n_wg);
        be.dispatch(
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
    be.dispatch(
        "moe_combine",
        "",
        &[n_tok as u32, d32, k as u32, e32, chunks],
        &[ids, weights, &y, out],
        [gx, gy, 1],
    )
}
