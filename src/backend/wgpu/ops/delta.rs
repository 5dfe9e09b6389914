//! The gated delta rule (spec/DELTANET.md) on the value-major state `M = Sᵀ` `[Hv, dv, dk]`.
//!
//! * `delta_rule_recurrent`: one dispatch of `delta_rule_recurrent.wgsl` (A.2/A.3, row-owned:
//!   an invocation owns one state row for all T tokens).
//! * `delta_rule_chunked`: C = 64 (B). Per batch of chunks, `delta_rule_chunk_prep.wgsl`
//!   (parallel over heads × chunks: decays, A, P, the triangular solve for U and W) then
//!   `delta_rule_chunk_state.wgsl` (parallel over heads × state rows, sequential over the
//!   chunks, a few per dispatch: V_new, outputs, state update). Chunk intermediates live in scratch tensors sized for
//!   one batch, so any T fits the device's storage binding limit.

use crate::backend::wgpu::{buffer, gpu_err, WgpuBackend};
use crate::backend::{DType, GdnDims, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[
    (
        "delta_rule_recurrent",
        include_str!("../../../../shaders-wgsl/delta_rule_recurrent.wgsl"),
    ),
    (
        "delta_rule_chunk_prep",
        include_str!("../../../../shaders-wgsl/delta_rule_chunk_prep.wgsl"),
    ),
    (
        "delta_rule_chunk_state",
        include_str!("../../../../shaders-wgsl/delta_rule_chunk_state.wgsl"),
    ),
];

/// Chunk length of the chunked algorithm (`C` in the chunk shaders).
const CHUNK: usize = 64;
/// State rows per workgroup (`ROWS` in the recurrent and chunk-state shaders).
const ROWS: usize = 32;
/// Largest key head dim: the shaders keep a state row in a private array of this size.
const MAX_DK: usize = 128;
/// llvmpipe/lavapipe (our CI device) silently ends all loops of a shader invocation after 65535
/// back-edges in total (`LP_MAX_TGSI_LOOP_ITERATIONS`, shared by every loop of the shader), so a
/// sequential kernel must not walk too many tokens in one dispatch; the state row is stored and
/// reloaded between dispatches instead. Recurrent: ~2·dk + 5 back-edges per token, i.e. at most
/// ~33.5K for 128 tokens with dk = 128.
const RECURRENT_TOKENS_PER_DISPATCH: usize = 128;
/// The same budget for the chunk-state kernel: ~C·(2·dk + C/2 + 3) ≈ 18.6K back-edges per chunk
/// with dk = 128, so two chunks per dispatch (~37K).
const STATE_CHUNKS_PER_DISPATCH: usize = 2;
/// Upper bound on the chunks per scratch batch (bounds the scratch memory: with Hv = 32 and
/// dk = dv = 128, X is 32 MiB and A, P are 8 MiB each at 16 chunks; 16 × Hv prep workgroups
/// are still plenty of parallelism).
const MAX_BATCH_CHUNKS: usize = 16;

/// Shared argument checks of both ops; returns the token count T.
fn check(
    op: &str,
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
) -> Result<usize> {
    for (name, t) in [("u", u), ("g", g), ("beta", beta), ("state", state), ("out", out)] {
        if t.dtype != DType::F32 {
            return Err(gpu_err(format!("{op}: {name} must be F32, got {:?}", t.dtype)));
        }
    }
    let GdnDims { hk, hv, dk, dv } = dims;
    if hk == 0 || hv == 0 || dk == 0 || dv == 0 || !hv.is_multiple_of(hk) {
        return Err(gpu_err(format!("{op}: bad dims {dims:?}")));
    }
    if dk > MAX_DK {
        return Err(gpu_err(format!("{op}: dk {dk} exceeds the supported maximum {MAX_DK}")));
    }
    let cd = dims.conv_dim();
    if u.cols() != cd {
        return Err(gpu_err(format!(
            "{op}: u {:?} does not have conv_dim {cd} columns",
            u.shape
        )));
    }
    let t = u.rows();
    for (name, x, want) in [
        ("g", g, t * hv),
        ("beta", beta, t * hv),
        ("state", state, hv * dv * dk),
        ("out", out, t * hv * dv),
    ] {
        if x.numel() != want {
            return Err(gpu_err(format!(
                "{op}: {name} {:?} has {} elements, want {want}",
                x.shape,
                x.numel()
            )));
        }
    }
    // state and out are written: neither may share a buffer with an input or with each other.
    for (wn, w) in [("state", state), ("out", out)] {
        for (rn, r) in [("u", u), ("g", g), ("beta", beta)] {
            if w.same_buffer(r) {
                return Err(gpu_err(format!("{op}: {wn} aliases {rn}")));
            }
        }
    }
    if state.same_buffer(out) {
        return Err(gpu_err(format!("{op}: out aliases state")));
    }
    u32::try_from(u.numel()).map_err(|_| gpu_err(format!("{op}: u {:?} too large", u.shape)))?;
    Ok(t)
}

fn u32s(xs: &[usize]) -> Vec<u32> {
    xs.iter().map(|&x| x as u32).collect()
}

pub(crate) fn delta_rule_recurrent(
    be: &WgpuBackend,
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
) -> Result<()> {
    let t = check("delta_rule_recurrent", u, g, beta, state, out, dims)?;
    if t == 0 {
        return Ok(());
    }
    let GdnDims { hk, hv, dk, dv } = dims;
    for t0 in (0..t).step_by(RECURRENT_TOKENS_PER_DISPATCH) {
        let n = RECURRENT_TOKENS_PER_DISPATCH.min(t - t0);
        let params = u32s(&[hk, hv, dk, dv, dims.conv_dim(), t0, n]);
        be.dispatch(
            "delta_rule_recurrent",
            "",
            &params,
            &[u, g, beta, state, out],
            [dv.div_ceil(ROWS) as u32, hv as u32, 1],
        )?;
    }
    Ok(())
}

pub(crate) fn delta_rule_chunked(
    be: &WgpuBackend,
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
) -> Result<()> {
    let op = "delta_rule_chunked";
    let t = check(op, u, g, beta, state, out, dims)?;
    if t == 0 {
        return Ok(());
    }
    let GdnDims { hk, hv, dk, dv } = dims;
    let xw = dv + dk;
    // Chunks per batch: the largest scratch tensor (A/P [Hv, nb, C, C] or X [Hv, nb, C, dv+dk])
    // must fit one storage binding.
    let per_chunk = hv * CHUNK * CHUNK.max(xw) * 4;
    let limit = be.limits.max_storage_buffer_binding_size as usize;
    let n_chunks = t.div_ceil(CHUNK);
    let nb_max = (limit / per_chunk).min(MAX_BATCH_CHUNKS).min(n_chunks);
    if nb_max == 0 {
        return Err(gpu_err(format!(
            "{op}: one chunk of scratch ({per_chunk} bytes) exceeds the storage binding limit"
        )));
    }
    let a = buffer::alloc(be, DType::F32, &[hv, nb_max, CHUNK, CHUNK])?;
    let p = buffer::alloc(be, DType::F32, &[hv, nb_max, CHUNK, CHUNK])?;
    let x = buffer::alloc(be, DType::F32, &[hv, nb_max, CHUNK, xw])?;
    let dec = buffer::alloc(be, DType::F32, &[hv, nb_max, 2, CHUNK])?;

    let mut t0 = 0;
    while t0 < t {
        let n_tok = (t - t0).min(nb_max * CHUNK);
        let nb = n_tok.div_ceil(CHUNK);
        let params = u32s(&[hk, hv, dk, dv, dims.conv_dim(), t0, n_tok, nb]);
        be.dispatch(
            "delta_rule_chunk_prep",
            "",
            &params,
            &[u, g, beta, &a, &p, &x, &dec],
            [nb as u32, hv as u32, 1],
        )?;
        for n_first in (0..nb).step_by(STATE_CHUNKS_PER_DISPATCH) {
            let n_count = STATE_CHUNKS_PER_DISPATCH.min(nb - n_first);
            let mut sp = params.clone();
            sp.extend(u32s(&[n_first, n_count]));
            be.dispatch(
                "delta_rule_chunk_state",
                "",
                &sp,
                &[u, state, out, &p, &x, &dec],
                [dv.div_ceil(ROWS) as u32, hv as u32, 1],
            )?;
        }
        t0 += n_tok;
    }
    Ok(())
}
