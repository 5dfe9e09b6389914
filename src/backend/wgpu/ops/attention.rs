//! Partial NeoX RoPE and causal GQA softmax attention (spec/MODEL.md §6).

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{check, AttnDims, Pos, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[
    ("rope_neox", include_str!("../../../../shaders-wgsl/rope_neox.wgsl")),
    ("attention", include_str!("../../../../shaders-wgsl/attention.wgsl")),
];

/// Largest head_dim of the attention kernel (its invocations own head_dim / 64 <= 4 output dims).
const MAX_HEAD_DIM: usize = 256;

/// In place NeoX RoPE on the first `n_rot` dims of every head of x `[T, nh*D]`.
///
/// The angle is computed in f32 on the device (the CPU reference uses f64, llama.cpp's GPU
/// kernels use f32 too): its error is a few ulp of the position, measured 1.8-2.5 * pos * 2^-24
/// rad, so a rotated pair (a, b) differs from the reference by about `pos * 2^-23 * |(a, b)|`:
/// within 1e-5 of |(a, b)| up to pos ≈ 80, 1e-4 up to pos ≈ 800, 5e-4 at pos 4096, 4e-2 at
/// pos 250k (tests/wgpu_ops.rs checks a 4 * pos * 2^-24 bound up to pos 4096).
pub(crate) fn rope_neox(
    be: &WgpuBackend,
    x: &Tensor,
    head_dim: usize,
    n_rot: usize,
    theta: f32,
    pos: Pos,
) -> Result<()> {
    let op = "rope_neox";
    let check::RopeDims { t: t_len, n_head: nh } = check::rope_neox(x, head_dim, n_rot, theta, pos)?;
    let (cols, pos0) = (x.cols(), pos.host);
    // Positions are converted to f32 in the shader: exact below 2^24.
    if pos0 + t_len > 1 << 24 {
        return Err(gpu_err(format!("{op}: position {} is out of range", pos0 + t_len)));
    }
    let half = n_rot / 2;
    check::u32_index(op, "elements", x.numel())?;
    let n = (t_len * nh * half) as u32;
    if n == 0 {
        return Ok(());
    }
    let log2_theta = (theta as f64).log2() as f32;
    let params = [
        n,
        cols as u32,
        head_dim as u32,
        half as u32,
        nh as u32,
        pos0 as u32,
        log2_theta.to_bits(),
    ];
    let [gx, gy] = be.grid(n.div_ceil(256));
    be.dispatch(op, "", &params, &[x], [gx, gy, 1])
}

/// Causal GQA attention of T queries at positions `pos0..pos0+T` against cache rows `0..=pos0+t`.
/// One workgroup per (token, query head), online softmax over tiles of 64 keys.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    be: &WgpuBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
    dims: AttnDims,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    let op = "attention";
    let t_len = check::attention(q, k_cache, v_cache, pos, dims, out)?;
    let AttnDims {
        n_head: nh,
        n_head_kv: nkv,
        head_dim: d,
    } = dims;
    if d > MAX_HEAD_DIM {
        return Err(gpu_err(format!("{op}: head_dim {d} exceeds {MAX_HEAD_DIM}")));
    }
    check::u32_index(op, "elements", q.numel().max(k_cache.numel()))?;
    let pos0 = check::u32_index(op, "position", pos.host)?;
    let rows = (t_len * nh) as u32;
    let params = [nh as u32, (nh / nkv) as u32, d as u32, pos0, scale.to_bits()];
    let [gx, gy] = be.grid(rows);
    be.dispatch(op, "", &params, &[q, k_cache, v_cache, out], [gx, gy, 1])
}
