//! Causal depthwise conv1d + SiLU with a rolling state (spec/MODEL.md §5.3), alone or fused with
//! the q/k L2 norm that follows it in the Gated DeltaNet.

use super::u32_of;
use crate::backend::wgpu::kernels::{Kernel, CONV_MAX_K, CONV_NORM_WG, CONV_WG};
use crate::backend::wgpu::policy::{self, Gates};
use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{check, GdnDims, GdnGates, Tensor};
use crate::error::Result;

fn conv_check(op: &str, x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<check::ConvDims> {
    let dims = check::conv1d(x, w, state, out)?;
    if dims.k > CONV_MAX_K as usize {
        return Err(gpu_err(format!("{op}: kernel width {} exceeds {CONV_MAX_K}", dims.k)));
    }
    u32_of(op, "elements", x.numel().max(w.numel()))?;
    Ok(dims)
}

/// x `[T, C]`, w `[C, K]` (tap K-1 = newest token), state `[K-1, C]` oldest first (updated),
/// out `[T, C]`. One invocation per channel loops over the tokens with a rolling window.
pub(crate) fn conv1d_causal_silu(be: &WgpuBackend, x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<()> {
    let check::ConvDims { t, c, k } = conv_check("conv1d_causal_silu", x, w, state, out)?;
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid((c as u32).div_ceil(CONV_WG));
    enc.run(
        Kernel::Conv,
        None,
        &[t as u32, c as u32, k as u32],
        &[x.into(), w.into(), state.into(), out.into()],
        [gx, gy, 1],
    )
}

/// Batches up to this many tokens run the fused kernel; longer ones the two separate kernels
/// (the fused one reduces once per token inside a workgroup per head: fine for decode, a long
/// serial loop for a prompt).
const FUSED_MAX_T: usize = 8;

/// The fused conv + q/k norm's parameters (conv1d_silu_l2qk.wgsl, lib_conv_l2qk.wgsl) and its
/// workgroup count: a workgroup per q/k head (dk channels) and per CONV_NORM_WG channels of v.
/// `None` for batches longer than FUSED_MAX_T (the two separate kernels run those).
#[allow(clippy::too_many_arguments)]
fn conv_l2qk_plan(
    op: &str,
    x: &Tensor,
    w: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    eps: f32,
) -> Result<Option<([u32; 7], u32)>> {
    let check::ConvDims { t, c, k } = conv_check(op, x, w, state, out)?;
    check::l2_norm_qk(out, dims)?;
    if t > FUSED_MAX_T {
        return Ok(None);
    }
    if dims.dk > CONV_NORM_WG as usize {
        return Err(gpu_err(format!("{op}: dk {} exceeds {CONV_NORM_WG}", dims.dk)));
    }
    let heads = 2 * dims.hk;
    let v_groups = (c - heads * dims.dk).div_ceil(CONV_NORM_WG as usize);
    let params = [
        t as u32,
        c as u32,
        k as u32,
        dims.hk as u32,
        dims.dk as u32,
        eps.to_bits(),
        super::norm::q_scale(dims).to_bits(),
    ];
    Ok(Some((params, u32_of(op, "groups", heads + v_groups)?)))
}

/// `conv1d_causal_silu` then `l2_norm_qk` in one dispatch (`conv_l2qk_plan`).
pub(crate) fn conv1d_silu_l2qk(
    be: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    eps: f32,
) -> Result<()> {
    let Some((params, groups)) = conv_l2qk_plan("conv1d_silu_l2qk", x, w, state, out, dims, eps)? else {
        conv1d_causal_silu(be, x, w, state, out)?;
        return super::l2_norm_qk(be, out, dims, eps);
    };
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(groups);
    enc.run(
        Kernel::ConvL2qk,
        None,
        &params,
        &[x.into(), w.into(), state.into(), out.into()],
        [gx, gy, 1],
    )
}

/// `gdn_gates` and `conv1d_silu_l2qk` in one dispatch (gdn_conv_gates.wgsl): the conv's
/// workgroups, then CONV_NORM_WG gates per workgroup. The two ops where the adapter does not
/// allow the kernel's 10 storage buffers (`policy::gdn_gates`) or the batch takes the separate
/// conv kernels.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gdn_conv_gates(
    be: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    eps: f32,
    g: GdnGates<'_>,
) -> Result<()> {
    let op = "gdn_conv_gates";
    let (_, (n_gates, hv)) = check::gdn_conv_gates(x, w, state, out, dims, g)?;
    let plan = if policy::gdn_gates(be.caps.device()) == Gates::Fused {
        conv_l2qk_plan(op, x, w, state, out, dims, eps)?
    } else {
        None
    };
    let Some((conv, groups)) = plan else {
        super::gdn_gates(be, g.a, g.b, g.ssm_a, g.dt_bias, g.g, g.beta)?;
        return conv1d_silu_l2qk(be, x, w, state, out, dims, eps);
    };
    let n = u32_of(op, "gates", n_gates)?;
    let total = groups
        .checked_add(n.div_ceil(CONV_NORM_WG))
        .ok_or_else(|| gpu_err(format!("{op}: too many workgroups")))?;
    let mut params = [0u32; 10];
    params[..7].copy_from_slice(&conv);
    params[7..].copy_from_slice(&[groups, n, hv as u32]);
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(total);
    enc.run(
        Kernel::GdnConvGates,
        None,
        &params,
        &[
            x.into(),
            w.into(),
            state.into(),
            out.into(),
            g.a.into(),
            g.b.into(),
            g.ssm_a.into(),
            g.dt_bias.into(),
            g.g.into(),
            g.beta.into(),
        ],
        [gx, gy, 1],
    )
}
