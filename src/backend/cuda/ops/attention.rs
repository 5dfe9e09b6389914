//! RoPE, the KV-cache append, both fused with the q/gate split and the q/k norms
//! (`attn_qk_prep`), and attention (kernels-cuda/attention.cu). Positions are read on the
//! device (`Pos::dev`), so a recorded decode step stays valid from token to token. A prompt batch
//! under `Precision::Fast` with head dim 256 runs flash attention on the tensor cores instead
//! (kernels-cuda/flash_attn.cu; f16 q, k, v and probabilities, f32 scores and sums).

use super::{grid_u32, group_threads, stride_blocks, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::cuda_err;
use crate::backend::cuda::op::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, AttnDims, AttnPrep, Pos, Tensor};
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

/// `QkPrepParams` (attention.cu).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct QkPrepParams {
    qg: u64,
    k: u64,
    v: u64,
    q_norm: u64,
    k_norm: u64,
    gate: u64,
    q_normed: u64,
    k_normed: u64,
    k_cache: u64,
    v_cache: u64,
    pos: u64,
    tq: i32,
    tk: i32,
    nh: i32,
    nkv: i32,
    d: i32,
    n_rot: i32,
    ctx: i32,
    theta: f32,
    eps: f32,
    _pad: i32,
}

/// `attn_qk_prep` in one launch (attention.cu), where it was six: one block per (head, token) over
/// the query heads and then the kv heads. The block size is the one `rms_norm` picks for one head
/// (`group_threads`), so the norms' sums are those of the unfused kernels.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attn_qk_prep(
    inner: &Inner,
    a: AttnPrep<'_>,
    head_dim: usize,
    n_rot: usize,
    theta: f32,
    eps: f32,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
) -> Result<()> {
    let op = "attn_qk_prep";
    let (rq, rk, _) = check::attn_qk_prep(a, head_dim, n_rot, theta, k_cache, v_cache, pos)?;
    let i32_of =
        |what: &str, v: usize| i32::try_from(v).map_err(|_| cuda_err(format!("{op}: {what} ({v}) exceeds i32")));
    let ctx = k_cache.rows().min(v_cache.rows());
    let p = QkPrepParams {
        qg: ptr(a.qg, op)?,
        k: ptr(a.k, op)?,
        v: ptr(a.v, op)?,
        q_norm: ptr(a.q_norm, op)?,
        k_norm: ptr(a.k_norm, op)?,
        gate: ptr(a.gate, op)?,
        q_normed: ptr(a.q_normed, op)?,
        k_normed: ptr(a.k_normed, op)?,
        k_cache: ptr(k_cache, op)?,
        v_cache: ptr(v_cache, op)?,
        pos: ptr(pos.dev, op)?,
        tq: i32_of("tokens", rq.t)?,
        tk: i32_of("tokens", rk.t)?,
        nh: i32_of("heads", rq.n_head)?,
        nkv: i32_of("kv heads", rk.n_head)?,
        d: i32_of("head dim", head_dim)?,
        n_rot: i32_of("rotated dims", n_rot)?,
        ctx: i32_of("cache rows", ctx)?,
        theta,
        eps,
        _pad: 0,
    };
    inner.kernel(
        Launch {
            name: ("attn_qk_prep", ""),
            grid: [
                grid_u32(op, "heads", rq.n_head + rk.n_head)?,
                grid_u32(op, "tokens", rq.t.max(rk.t))?,
                1,
            ],
            block: group_threads(head_dim),
            smem: 0,
            args: Args::from_pod(&p),
            phase: Phase::Attention,
        },
        &[
            a.qg, a.k, a.v, a.q_norm, a.k_norm, a.gate, a.q_normed, a.k_normed, k_cache, v_cache, pos.dev,
        ],
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
    if d == FLASH_D && super::gemm::fast_batch(inner, t) {
        // The f16 copies of K and V are workspaces: held until the kernel is submitted.
        let _ws = inner.workspaces()?;
        return flash(inner, q, k_cache, v_cache, pos.host, dims, scale, out, t);
    }
    let ctx = k_cache.rows();
    let s = splits(inner, t, h, ctx);
    // The partials' workspace stays locked until the merge is submitted.
    let ws = inner.workspaces()?;
    let part = if s > 1 {
        ws.get("attention", t * h * s * (d + 2) * 4)?
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

// ---- flash attention (prefill, Precision::Fast) -------------------------------------------------

/// Head dim of the flash kernel, queries per block, threads, dynamic shared memory
/// (flash_attn.cu `FA_*`; asserted there).
const FLASH_D: usize = 256;
const FLASH_BQ: usize = 64;
const FLASH_SMEM: u32 = 98_304;

/// `pf::FlashParams` (flash_attn.cu).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct FlashParams {
    q: u64,
    k: u64,
    v: u64,
    out: u64,
    t: i32,
    pos0: i32,
    n_head: i32,
    n_head_kv: i32,
    scale_log2: f32,
    _pad: i32,
}

/// The T queries at positions `pos0..` against cache rows `0..pos0 + T`: those rows of K and V
/// converted to f16 (one pass each), then one launch of (query tiles x heads) blocks.
#[allow(clippy::too_many_arguments)]
fn flash(
    inner: &Inner,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos0: usize,
    dims: AttnDims,
    scale: f32,
    out: &Tensor,
    t: usize,
) -> Result<()> {
    let op = "attention";
    let kv_len = pos0 + t;
    let n = kv_len * dims.n_head_kv * FLASH_D;
    let (k16, v16) = (
        inner.workspace("flash k f16", n * 2)?,
        inner.workspace("flash v f16", n * 2)?,
    );
    inner.convert_f16(ptr(k_cache, op)?, k16, 0, n, Phase::Attention)?;
    inner.convert_f16(ptr(v_cache, op)?, v16, 0, n, Phase::Attention)?;
    let i32_of =
        |what: &str, v: usize| i32::try_from(v).map_err(|_| cuda_err(format!("{op}: {what} ({v}) exceeds i32")));
    let p = FlashParams {
        q: ptr(q, op)?,
        k: k16,
        v: v16,
        out: ptr(out, op)?,
        t: i32_of("tokens", t)?,
        pos0: i32_of("position", pos0)?,
        n_head: i32_of("heads", dims.n_head)?,
        n_head_kv: i32_of("kv heads", dims.n_head_kv)?,
        scale_log2: scale * std::f32::consts::LOG2_E,
        _pad: 0,
    };
    // FLOPs of the causal products: 2 (QK^T) + 2 (PV) per query, key and dim.
    let pairs: f64 = (0..t).map(|i| (pos0 + i + 1) as f64).sum();
    inner.kernel_rw(
        Launch {
            name: ("pf_flash_attn_d256", ""),
            grid: [
                grid_u32(op, "query tiles", t.div_ceil(FLASH_BQ))?,
                grid_u32(op, "heads", dims.n_head)?,
                1,
            ],
            block: 128,
            smem: FLASH_SMEM,
            args: Args::from_pod(&p),
            phase: Phase::Attention,
        },
        4.0 * FLASH_D as f64 * dims.n_head as f64 * pairs,
        &[q, k_cache, v_cache],
        &[out],
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn params_layout() {
        assert_eq!(std::mem::size_of::<super::FlashParams>(), 56);
        assert_eq!(std::mem::size_of::<super::QkPrepParams>(), 128);
    }
}
