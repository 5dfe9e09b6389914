//! The causal conv1d + SiLU and its fusion with the q/k L2 norm (kernels-cuda/conv.cu).

use super::{grid_u32, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::launch::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, GdnDims, Tensor};
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
    if dims.dk > 1024 {
        conv1d_causal_silu(inner, x, w, state, out)?;
        return super::norm::l2_norm_qk(inner, out, dims, eps);
    }
    let bs = dims.dk.div_ceil(32) * 32;
    let v_blocks = dims.value_dim().div_ceil(bs);
    let mut a = args(x, w, state, out, d, op)?;
    a.n[3] = dims.hk as i64;
    a.n[4] = dims.dk as i64;
    a.f[0] = eps;
    inner.kernel(
        Launch {
            name: ("conv1d_silu_l2qk", ""),
            grid: [grid_u32(op, "blocks", 2 * dims.hk + v_blocks)?, tiles(op, d)?, 1],
            block: bs as u32,
            smem: 0,
            args: a,
            phase: Phase::Conv,
        },
        &[x, w, state, out],
    )
}
