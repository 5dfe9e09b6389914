//! The causal conv1d + SiLU and its fusion with the q/k L2 norm and the delta-rule gates
//! (kernels-cuda/conv.cu).

use super::{grid_u32, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::cuda_err;
use crate::backend::cuda::op::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, GdnDims, GdnGates, Tensor};
use crate::error::Result;

fn args(x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor, d: check::ConvDims, op: &str) -> Result<Args> {
    let mut a = Args::default();
    a.p[0] = ptr(x, op)?;
    a.p[1] = ptr(w, op)?;
    a.p[2] = ptr(state, op)?;
    a.p[3] = ptr(out, op)?;
    a.n[0] = d.t as i64;
    a.n[1] = d.c as i64;
    a.n[2] = d.k as i64;
    a.n[5] = tile_tokens(d) as i64;
    Ok(a)
}

/// Tokens per block row: a prefill spreads over T / CONV_TILE block rows. A tile must hold at
/// least K-1 tokens (only tile 0 may read the old state); for an unusually wide kernel the whole
/// batch is one tile.
const CONV_TILE: usize = 16;

fn tile_tokens(d: check::ConvDims) -> usize {
    if d.k <= CONV_TILE + 1 {
        CONV_TILE
    } else {
        d.t.max(1)
    }
}

/// Block rows of the launch (at least one, which also shifts the state when T = 0).
fn tiles(op: &str, d: check::ConvDims) -> Result<u32> {
    grid_u32(op, "token tiles", d.t.div_ceil(tile_tokens(d)).max(1))
}

pub(crate) fn conv1d_causal_silu(inner: &Inner, x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<()> {
    let op = "conv1d_causal_silu";
    let d = check::conv1d(x, w, state, out)?;
    let a = args(x, w, state, out, d, op)?;
    inner.kernel(
        Launch {
            name: ("conv1d_silu", ""),
            grid: [grid_u32(op, "channel blocks", d.c.div_ceil(256))?, tiles(op, d)?, 1],
            block: 256,
            smem: 0,
            args: a,
            phase: Phase::Conv,
        },
        &[x, w, state, out],
    )
}

/// `ConvL2qkParams` (conv.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct ConvL2qkParams {
    x: u64,
    w: u64,
    state: u64,
    out: u64,
    a: u64,
    b: u64,
    ssm_a: u64,
    dt_bias: u64,
    g: u64,
    beta: u64,
    t: i32,
    c: i32,
    k: i32,
    tt: i32,
    hk: i32,
    dk: i32,
    conv_blocks: i32,
    n_gates: i32,
    hv: i32,
    gate_chunk: i32,
    eps: f32,
    _pad: i32,
}

/// Largest key head dim of the fused kernel (one block per head).
const MAX_DK: usize = 1024;

fn i32_of(op: &str, what: &str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| cuda_err(format!("{op}: {what} ({n}) exceeds i32")))
}

/// One launch of `conv1d_silu_l2qk` (conv.cu): conv + SiLU + q/k L2 norm, and with `gates` the
/// delta-rule gates in one extra block per token tile. Needs `dims.dk <= MAX_DK`.
#[allow(clippy::too_many_arguments)]
fn conv_l2qk_launch(
    inner: &Inner,
    op: &str,
    x: &Tensor,
    w: &Tensor,
    state: &Tensor,
    out: &Tensor,
    d: check::ConvDims,
    dims: GdnDims,
    eps: f32,
    gates: Option<(GdnGates<'_>, usize, usize)>,
) -> Result<()> {
    let bs = dims.dk.div_ceil(32) * 32;
    let conv_blocks = 2 * dims.hk + dims.value_dim().div_ceil(bs);
    let tiles = tiles(op, d)?;
    let mut p = ConvL2qkParams {
        x: ptr(x, op)?,
        w: ptr(w, op)?,
        state: ptr(state, op)?,
        out: ptr(out, op)?,
        t: i32_of(op, "tokens", d.t)?,
        c: i32_of(op, "channels", d.c)?,
        k: i32_of(op, "taps", d.k)?,
        tt: i32_of(op, "tile", tile_tokens(d))?,
        hk: i32_of(op, "key heads", dims.hk)?,
        dk: i32_of(op, "key head dim", dims.dk)?,
        conv_blocks: i32_of(op, "blocks", conv_blocks)?,
        eps,
        ..Default::default()
    };
    let mut uses = vec![x, w, state, out];
    let mut blocks = conv_blocks;
    if let Some((g, n, hv)) = gates.filter(|&(_, n, _)| n > 0) {
        p.a = ptr(g.a, op)?;
        p.b = ptr(g.b, op)?;
        p.ssm_a = ptr(g.ssm_a, op)?;
        p.dt_bias = ptr(g.dt_bias, op)?;
        p.g = ptr(g.g, op)?;
        p.beta = ptr(g.beta, op)?;
        p.n_gates = i32_of(op, "gate elements", n)?;
        p.hv = i32_of(op, "value heads", hv)?;
        p.gate_chunk = i32_of(op, "gate elements", n.div_ceil(tiles as usize))?;
        uses.extend([g.a, g.b, g.ssm_a, g.dt_bias, g.g, g.beta]);
        blocks += 1;
    }
    inner.kernel(
        Launch {
            name: ("conv1d_silu_l2qk", ""),
            grid: [grid_u32(op, "blocks", blocks)?, tiles, 1],
            block: bs as u32,
            smem: 0,
            args: Args::from_pod(&p),
            phase: Phase::Conv,
        },
        &uses,
    )
}

/// One kernel for conv + SiLU + q/k L2 norm when a head fits one block (dk <= 1024); else the two
/// ops one after the other.
pub(crate) fn conv1d_silu_l2qk(
    inner: &Inner,
    x: &Tensor,
    w: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    eps: f32,
) -> Result<()> {
    let op = "conv1d_silu_l2qk";
    let d = check::conv1d(x, w, state, out)?;
    check::l2_norm_qk(out, dims)?;
    if dims.dk > MAX_DK {
        conv1d_causal_silu(inner, x, w, state, out)?;
        return super::norm::l2_norm_qk(inner, out, dims, eps);
    }
    conv_l2qk_launch(inner, op, x, w, state, out, d, dims, eps, None)
}

/// `gdn_conv_gates` in one launch: the gates ride along with the fused conv as extra blocks
/// (the op was two launches per Gated DeltaNet layer). Past `MAX_DK` the gates and the conv run
/// one after the other.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gdn_conv_gates(
    inner: &Inner,
    x: &Tensor,
    w: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    eps: f32,
    gates: GdnGates<'_>,
) -> Result<()> {
    let op = "gdn_conv_gates";
    let (d, (n, hv)) = check::gdn_conv_gates(x, w, state, out, dims, gates)?;
    if dims.dk > MAX_DK {
        let GdnGates {
            a,
            b,
            ssm_a,
            dt_bias,
            g,
            beta,
        } = gates;
        super::eltwise::gdn_gates(inner, a, b, ssm_a, dt_bias, g, beta)?;
        return conv1d_silu_l2qk(inner, x, w, state, out, dims, eps);
    }
    conv_l2qk_launch(inner, op, x, w, state, out, d, dims, eps, Some((gates, n, hv)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn params_layout() {
        assert_eq!(std::mem::size_of::<super::ConvL2qkParams>(), 128);
    }
}
