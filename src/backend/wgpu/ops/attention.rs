//! Partial NeoX RoPE, the KV-cache append, the steps before the attention fused
//! (`attn_qk_prep`) and causal GQA softmax attention (spec/MODEL.md §6). All of them read the
//! position from the device (`Pos::dev`), so a recorded decode step replays correctly at every
//! later position.

use super::u32_of;
use crate::backend::wgpu::encoder::Bind;
use crate::backend::wgpu::geometry::{ATT_MAX_D, ATT_T_BQ, SPLIT_MAX_ROWS};
use crate::backend::wgpu::kernels::{self, Kernel, ATT_SPLITS, ELT_WG, PREP_WG};
use crate::backend::wgpu::policy::{self, AttnGate, Prep};
use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{check, AttnDims, AttnPrep, DType, Pos, Tensor};
use crate::error::Result;

/// In place NeoX RoPE on the first `n_rot` dims of every head of x `[T, nh*D]`.
///
/// The angle is computed in f32 on the device (lib_rope.wgsl; the CPU reference uses f64,
/// llama.cpp's GPU kernels use f32 too): its error is a few ulp of the position, measured
/// 1.8-2.5 * pos * 2^-24 rad, so a rotated pair (a, b) differs from the reference by about
/// `pos * 2^-23 * |(a, b)|`: within 1e-5 of |(a, b)| up to pos ≈ 80, 1e-4 up to pos ≈ 800, 5e-4
/// at pos 4096, 4e-2 at pos 250k (tests/device_ops.rs checks a 4 * pos * 2^-24 bound up to pos
/// 4096).
pub(crate) fn rope_neox(
    be: &WgpuBackend,
    x: &Tensor,
    head_dim: usize,
    n_rot: usize,
    theta: f32,
    pos: Pos,
) -> Result<()> {
    let op = "rope_neox";
    let t_len = check::rope_neox(x, head_dim, n_rot, theta, pos)?.t;
    // Positions are converted to f32 in the shader: exact below 2^24.
    if pos.host + t_len > 1 << 24 {
        return Err(gpu_err(format!("{op}: position {} is out of range", pos.host + t_len)));
    }
    rope_dispatch(be, Kernel::Rope, op, x, head_dim, n_rot, theta, pos.dev)
}

/// One dispatch of a RoPE kernel over every rotated pair of `x` (one invocation each), the
/// positions read on the device from `at` (a `Pos`'s tensor or a step's rows), after the op's
/// checks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_dispatch(
    be: &WgpuBackend,
    kernel: Kernel,
    op: &str,
    x: &Tensor,
    head_dim: usize,
    n_rot: usize,
    theta: f32,
    at: &Tensor,
) -> Result<()> {
    let (half, nh) = (n_rot / 2, x.cols() / head_dim);
    u32_of(op, "elements", x.numel())?;
    let n = u32_of(op, "pairs", x.rows() * nh * half)?;
    if n == 0 {
        return Ok(());
    }
    let log2_theta = (theta as f64).log2() as f32;
    let params = [
        n,
        x.cols() as u32,
        head_dim as u32,
        half as u32,
        nh as u32,
        log2_theta.to_bits(),
    ];
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(n.div_ceil(ELT_WG));
    enc.run(kernel, None, &params, &[at.into(), x.into()], [gx, gy, 1])
}

/// `k_cache[pos + t] = k[t]`, `v_cache[pos + t] = v[t]` in one dispatch.
pub(crate) fn kv_store(
    be: &WgpuBackend,
    k: &Tensor,
    v: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
) -> Result<()> {
    let op = "kv_store";
    let t = check::kv_store(k, v, k_cache, v_cache, pos)?;
    let w = k.cols();
    let n = u32_of(op, "elements", t * w)?;
    u32_of(op, "cache elements", k_cache.numel())?;
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(n.div_ceil(ELT_WG));
    enc.run(
        Kernel::KvStore,
        None,
        &[n, w as u32, k_cache.rows() as u32],
        &[pos.dev.into(), k.into(), v.into(), k_cache.into(), v_cache.into()],
        [gx, gy, 1],
    )
}

/// Causal GQA attention of T queries at positions `pos..pos+T` against cache rows `0..=pos+t`.
/// Few query rows (decode): each row's key range is split over ATT_SPLITS workgroups and merged
/// by a second dispatch; many rows (prefill): a workgroup per block of `ATT_T_BQ` rows of one KV
/// head over key tiles staged once for the block (`Caps::att_tiled`), else one workgroup per row.
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
    check::attention(q, k_cache, v_cache, pos, dims, out)?;
    attend(be, q, k_cache, v_cache, pos, dims, scale, None, out)
}

/// `attention` then `out *= sigmoid(gate)`. Where the key range is split (decode), the merging
/// dispatch applies the gate, and with the packed-integer-dot products (`Caps::mv_dot`) also
/// writes the output's planes, so neither the gate nor the output projection's `mv_dot_prep` costs
/// a dispatch of its own.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_gated(
    be: &WgpuBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
    dims: AttnDims,
    scale: f32,
    gate: &Tensor,
    out: &Tensor,
) -> Result<()> {
    check::attention_gated(q, k_cache, v_cache, pos, dims, gate, out)?;
    attend(be, q, k_cache, v_cache, pos, dims, scale, Some(gate), out)
}

/// `attention`'s and `attention_gated`'s dispatches (arguments checked).
#[allow(clippy::too_many_arguments)]
fn attend(
    be: &WgpuBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
    dims: AttnDims,
    scale: f32,
    gate: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let op = "attention";
    let t_len = q.rows();
    let AttnDims {
        n_head: nh,
        n_head_kv: nkv,
        head_dim: d,
    } = dims;
    if d > ATT_MAX_D as usize {
        return Err(gpu_err(format!("{op}: head_dim {d} exceeds {ATT_MAX_D}")));
    }
    u32_of(op, "elements", q.numel().max(k_cache.numel()))?;
    let rows = t_len * nh;
    let r32 = u32_of(op, "rows", rows)?;
    let params = [nh as u32, (nh / nkv) as u32, d as u32, scale.to_bits()];
    let [gx, gy] = be.grid(r32);
    let wg = [gx, gy, 1];
    // The gate goes into the merge of a split key range; elsewhere it is a dispatch of its own.
    let fused = gate.filter(|_| policy::attn_gate(be.caps.device(), rows) == AttnGate::InMerge);
    {
        let mut enc = be.encoder()?;
        if rows > SPLIT_MAX_ROWS && be.caps.att_tiled.is_some() {
            // The rows of one KV head, token by token (its query heads adjacent), in blocks.
            let blocks = (t_len * (nh / nkv)).div_ceil(ATT_T_BQ as usize) * nkv;
            let [bx, by] = enc.grid(u32_of(op, "blocks", blocks)?);
            let [n_head, group, d32, scale_bits] = params;
            enc.run(
                Kernel::AttentionTiled,
                None,
                &[n_head, group, d32, scale_bits, u32_of(op, "tokens", t_len)?],
                &[pos.dev.into(), q.into(), k_cache.into(), v_cache.into(), out.into()],
                [bx, by, 1],
            )?;
        } else if rows > SPLIT_MAX_ROWS {
            enc.run(
                Kernel::Attention,
                None,
                &params,
                &[pos.dev.into(), q.into(), k_cache.into(), v_cache.into(), out.into()],
                wg,
            )?;
        } else {
            let part = enc.scratch("att_part", DType::F32, &[rows, ATT_SPLITS as usize, d + 2])?;
            enc.run(
                Kernel::AttentionSplit,
                None,
                &params,
                &[pos.dev.into(), q.into(), k_cache.into(), v_cache.into(), (&part).into()],
                [gx, gy, ATT_SPLITS],
            )?;
            // The planes' blocks of 32 lie within a head, and the products take whole 256-element
            // rows; they read planes only for one token (linear.rs: the matrix-vector kernels).
            let planes = be.caps.mv_dot && t_len == 1 && d.is_multiple_of(32) && (nh * d).is_multiple_of(256);
            match fused {
                None => enc.run(
                    Kernel::AttentionCombine,
                    None,
                    &[d as u32],
                    &[(&part).into(), out.into()],
                    wg,
                )?,
                Some(g) if !planes => enc.run(
                    Kernel::AttentionCombineGate,
                    None,
                    &[d as u32],
                    &[(&part).into(), g.into(), out.into()],
                    wg,
                )?,
                Some(g) => {
                    let xq = enc.scratch("att_xq", DType::U32, &[kernels::xq_words(t_len * nh * d)])?;
                    enc.run(
                        Kernel::AttentionCombineGateDot,
                        None,
                        &[d as u32],
                        &[(&part).into(), g.into(), out.into(), (&xq).into()],
                        wg,
                    )?;
                    enc.set_dot_x(out, xq);
                }
            }
        }
    }
    match (gate, fused) {
        (Some(g), None) => super::sigmoid_mul_assign(be, out, g),
        _ => Ok(()),
    }
}

/// `split_qgate`, the q and k RMSNorms, RoPE of both and `kv_store` (lib_attn_prep.wgsl): one
/// dispatch of a workgroup per (token, head) over the query heads and then the kv heads
/// (`Prep::One`), or a dispatch per half (`Prep::Halves`, adapters that allow 7 storage buffers
/// per kernel but not 11), else the six ops. `a.q` (scratch) is not written by the fused kernels.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attn_qk_prep(
    be: &WgpuBackend,
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
    let (rq, rk, t_len) = check::attn_qk_prep(a, head_dim, n_rot, theta, k_cache, v_cache, pos)?;
    // One invocation per element of a head; a v row as wide as a k row (one index for both).
    let fits = head_dim <= PREP_WG as usize && a.v.cols() == a.k.cols();
    let prep = policy::attn_prep(be.caps.device());
    if prep == Prep::Separate || !fits {
        super::split_qgate(be, a.qg, head_dim, a.q, a.gate)?;
        super::rms_norm(be, a.q, a.q_norm, eps, a.q_normed)?;
        super::rms_norm(be, a.k, a.k_norm, eps, a.k_normed)?;
        rope_neox(be, a.q_normed, head_dim, n_rot, theta, pos)?;
        rope_neox(be, a.k_normed, head_dim, n_rot, theta, pos)?;
        return kv_store(be, a.k_normed, a.v, k_cache, v_cache, pos);
    }
    // Positions are converted to f32 for the rotation: exact below 2^24 (as rope_neox).
    if pos.host + t_len > 1 << 24 {
        return Err(gpu_err(format!("{op}: position {} is out of range", pos.host + t_len)));
    }
    for t in [a.qg, k_cache, v_cache] {
        u32_of(op, "elements", t.numel())?;
    }
    let q_rows = u32_of(op, "query heads", t_len * rq.n_head)?;
    let kv_rows = u32_of(op, "kv heads", t_len * rk.n_head)?;
    let log2_theta = (theta as f64).log2() as f32;
    let params = [
        head_dim as u32,
        (n_rot / 2) as u32,
        rq.n_head as u32,
        rk.n_head as u32,
        q_rows,
        u32_of(op, "cache rows", k_cache.rows())?,
        eps.to_bits(),
        log2_theta.to_bits(),
    ];
    let kv: [Bind<'_>; 7] = [
        pos.dev.into(),
        a.k.into(),
        a.v.into(),
        a.k_norm.into(),
        a.k_normed.into(),
        k_cache.into(),
        v_cache.into(),
    ];
    let q: [Bind<'_>; 4] = [a.qg.into(), a.q_norm.into(), a.gate.into(), a.q_normed.into()];
    let mut enc = be.encoder()?;
    if prep == Prep::One {
        let total = q_rows
            .checked_add(kv_rows)
            .ok_or_else(|| gpu_err(format!("{op}: too many heads")))?;
        let mut binds = [kv[0]; 11];
        binds[..7].copy_from_slice(&kv);
        binds[7..].copy_from_slice(&q);
        let [gx, gy] = enc.grid(total);
        return enc.run(Kernel::AttnQkPrep, None, &params, &binds, [gx, gy, 1]);
    }
    let [gx, gy] = enc.grid(q_rows);
    enc.run(
        Kernel::AttnPrepQ,
        None,
        &params,
        &[kv[0], q[0], q[1], q[2], q[3]],
        [gx, gy, 1],
    )?;
    let [gx, gy] = enc.grid(kv_rows);
    enc.run(Kernel::AttnPrepKv, None, &params, &kv, [gx, gy, 1])
}
