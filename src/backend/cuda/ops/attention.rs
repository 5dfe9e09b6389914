//! RoPE, the KV-cache append and attention (kernels-cuda/attention.cu). Positions are read on the
//! device (`Pos::dev`), so a recorded decode step stays valid from token to token.

use super::{grid_u32, stride_blocks, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::cuda_err;
use crate::backend::cuda::launch::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, AttnDims, Pos, Tensor};
use crate::error::Result;

pub(crate) fn rope_neox(inner: &Inner, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, pos: Pos) -> Result<()> {
    let op = "rope_neox";
    let d = check::rope_neox(x, head_dim, n_rot, theta, pos)?;
    if n_rot < 2 || d.t == 0 || d.n_head == 0 {
        return Ok(());
    }
    let mut a = Args::default();
    a.p[0] = ptr(x, op)?;
    a.p[1] = ptr(pos.dev, op)?;
    a.n[0] = d.n_head as i64;
    a.n[1] = head_dim as i64;
    a.n[2] = n_rot as i64;
    a.f[0] = theta;
    inner.kernel(
        Launch {
            name: ("rope_neox", ""),
            grid: [grid_u32(op, "heads", d.n_head)?, grid_u32(op, "tokens", d.t)?, 1],
            block: ((n_rot / 2).div_ceil(32) * 32).clamp(32, 256) as u32,
            smem: 0,
            args: a,
            phase: Phase::Attention,
        },
        &[x, pos.dev],
    )
}

pub(crate) fn kv_store(
    inner: &Inner,
    k: &Tensor,
    v: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
) -> Result<()> {
    let op = "kv_store";
    let t = check::kv_store(k, v, k_cache, v_cache, pos)?;
    let w = k.cols();
    if t == 0 || w == 0 {
        return Ok(());
    }
    let mut a = Args::default();
    a.p[0] = ptr(k, op)?;
    a.p[1] = ptr(v, op)?;
    a.p[2] = ptr(k_cache, op)?;
    a.p[3] = ptr(v_cache, op)?;
    a.p[4] = ptr(pos.dev, op)?;
    a.n[0] = (t * w) as i64;
    a.n[1] = w as i64;
    a.n[2] = k_cache.rows().min(v_cache.rows()) as i64;
    inner.kernel(
        Launch {
            name: ("kv_store", ""),
            grid: [stride_blocks(inner, t * w), 1, 1],
            block: 256,
            smem: 0,
            args: a,
            phase: Phase::Attention,
        },
        &[k, v, k_cache, v_cache, pos.dev],
    )
}

/// Largest head dim of `attn_split` (16 dims per lane).
const MAX_HEAD_DIM: usize = 512;

/// Splits of the key range: one block per head and token covers a prefill (T > 1: T * H blocks
/// already fill the GPU); a decode step splits its range so that about two blocks per SM run.
/// The count depends only on shapes (the cache capacity), never on the position, so a recorded
/// step stays valid as the sequence grows; splits past the current length do no work.
fn splits(inner: &Inner, t: usize, h: usize, ctx: usize) -> usize {
    if t > 1 {
        return 1;
    }
    let want = (2 * inner.sms()).div_ceil(h.max(1));
    want.min(ctx.div_ceil(64)).clamp(1, 64)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    inner: &Inner,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
    dims: AttnDims,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    let op = "attention";
    let t = check::attention(q, k_cache, v_cache, pos, dims, out)?;
    let AttnDims {
        n_head: h,
        n_head_kv: hkv,
        head_dim: d,
    } = dims;
    if d > MAX_HEAD_DIM {
        return Err(cuda_err(format!(
            "{op}: head dim {d} > {MAX_HEAD_DIM} is not supported"
        )));
    }
    if t == 0 {
        return Ok(());
    }
    let ctx = k_cache.rows();
    let s = splits(inner, t, h, ctx);
    let part = if s > 1 {
        inner.workspace("attention", t * h * s * (d + 2) * 4)?
    } else {
        0
    };
    let mut a = Args::default();
    a.p[0] = ptr(q, op)?;
    a.p[1] = ptr(k_cache, op)?;
    a.p[2] = ptr(v_cache, op)?;
    a.p[3] = ptr(out, op)?;
    a.p[4] = ptr(pos.dev, op)?;
    a.p[5] = part;
    a.n[0] = h as i64;
    a.n[1] = hkv as i64;
    a.n[2] = d as i64;
    a.n[3] = s as i64;
    a.n[4] = ctx as i64;
    a.f[0] = scale;
    let (gh, gt) = (grid_u32(op, "heads", h)?, grid_u32(op, "tokens", t)?);
    inner.kernel(
        Launch {
            name: ("attn_split", ""),
            grid: [gh, gt, s as u32],
            block: 128,
            smem: 0,
            args: a,
            phase: Phase::Attention,
        },
        &[q, k_cache, v_cache, out, pos.dev],
    )?;
    if s == 1 {
        return Ok(());
    }
    let mut c = Args::default();
    c.p[0] = part;
    c.p[1] = ptr(out, op)?;
    c.n[0] = h as i64;
    c.n[1] = d as i64;
    c.n[2] = s as i64;
    inner.kernel(
        Launch {
            name: ("attn_combine", ""),
            grid: [gh, gt, 1],
            block: 128,
            smem: 0,
            args: c,
            phase: Phase::Attention,
        },
        &[out],
    )
}
