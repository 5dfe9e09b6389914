//! The gated delta rule (spec/DELTANET.md) on the value-major state `M = Sᵀ` `[Hv, dv, dk]`.
//!
//! * `delta_rule_recurrent`: `delta_rule_recurrent.wgsl` (A.2/A.3, row-owned: a subgroup, or a
//!   group of invocations without subgroups, owns one state row; a workgroup a block of rows), so
//!   that a decode token spreads over ceil(dv / rows) × Hv workgroups (rows: 8 with subgroups).
//! * `delta_rule_chunked`: C = 64 (B). Per batch of chunks, `delta_rule_chunk_prep.wgsl`
//!   (parallel over heads × chunks: decays, A and P as tiled products, the triangular solve for
//!   U and W) then `delta_rule_chunk_state.wgsl` (parallel over heads × blocks of state rows,
//!   sequential over the chunks of the batch, each chunk's V_new, outputs and state update as
//!   products over all its tokens at once). Chunk intermediates live in scratch tensors sized for
//!   one batch, so any T fits the device's storage binding limit.

use crate::backend::wgpu::kernels::{delta_rec_rows, Kernel, DELTA_CHUNK, DELTA_MAX_DK, DELTA_ROWS};
use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{check, DType, GdnDims, Tensor};
use crate::error::Result;

/// Chunk length of the chunked algorithm.
const CHUNK: usize = DELTA_CHUNK as usize;
/// State rows per workgroup of the chunk-state kernel.
const ROWS: usize = DELTA_ROWS as usize;
/// Largest key head dim: the chunk-state shader keeps its block of state rows in workgroup memory
/// sized for this.
const MAX_DK: usize = DELTA_MAX_DK as usize;
/// llvmpipe/lavapipe (our CI device) silently ends all loops of a shader invocation after 65535
/// back-edges in total (`LP_MAX_TGSI_LOOP_ITERATIONS`, shared by every loop of the shader), so a
/// sequential kernel must not walk too many tokens in one dispatch; the state row is stored and
/// reloaded between dispatches instead. Recurrent: ~2·dk/w + 20 back-edges per token for row groups
/// of w invocations (w = 8 without subgroups, lavapipe's subgroup size 4..16 with), i.e. at most
/// ~9K for 128 tokens with dk = 128.
const RECURRENT_TOKENS_PER_DISPATCH: usize = 128;
/// Upper bound on the chunks per scratch batch (bounds the scratch memory: with Hv = 32 and
/// dk = dv = 128, X is 32 MiB and P 8 MiB at 16 chunks; 16 × Hv prep workgroups are still plenty
/// of parallelism). The chunk-state kernel runs a whole batch in one dispatch: the same lavapipe
/// budget as above allows it, at ~dk + 3·C ≈ 320 back-edges per chunk (see the shader).
const MAX_BATCH_CHUNKS: usize = 16;

/// The contract's checks plus this backend's limits; returns the token count T.
fn check(
    op: &str,
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
) -> Result<usize> {
    let t = check::delta_rule(op, u, g, beta, state, out, dims)?;
    if dims.dk > MAX_DK {
        return Err(gpu_err(format!(
            "{op}: dk {} exceeds the supported maximum {MAX_DK}",
            dims.dk
        )));
    }
    check::u32_index(op, "elements of u", u.numel())?;
    Ok(t)
}

/// Shader parameters from usizes (no allocation).
fn u32s<const N: usize>(xs: [usize; N]) -> [u32; N] {
    xs.map(|x| x as u32)
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
    let blocks = dv.div_ceil(delta_rec_rows(&be.caps) as usize) as u32;
    let mut enc = be.encoder()?;
    for t0 in (0..t).step_by(RECURRENT_TOKENS_PER_DISPATCH) {
        let n = RECURRENT_TOKENS_PER_DISPATCH.min(t - t0);
        let params = u32s([hk, hv, dk, dv, dims.conv_dim(), t0, n]);
        enc.run(
            Kernel::DeltaRecurrent,
            None,
            &params,
            &[u.into(), g.into(), beta.into(), state.into(), out.into()],
            [blocks, hv as u32, 1],
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
    // Chunks per batch: the largest scratch tensor (P [Hv, nb, C, C] or X [Hv, nb, C, dv+dk])
    // must fit one storage binding.
    let per_chunk = hv * CHUNK * CHUNK.max(xw) * 4;
    let limit = be.caps.max_binding as usize;
    let n_chunks = t.div_ceil(CHUNK);
    let nb_max = (limit / per_chunk).min(MAX_BATCH_CHUNKS).min(n_chunks);
    if nb_max == 0 {
        return Err(gpu_err(format!(
            "{op}: one chunk of scratch ({per_chunk} bytes) exceeds the storage binding limit"
        )));
    }
    // Chunk intermediates persist in the backend's scratch pool (no allocation per call); the
    // dispatches that share them are recorded under one hold of the encoder.
    let mut enc = be.encoder()?;
    let p = enc.scratch("delta_p", DType::F32, &[hv, nb_max, CHUNK, CHUNK])?;
    let x = enc.scratch("delta_x", DType::F32, &[hv, nb_max, CHUNK, xw])?;
    let dec = enc.scratch("delta_dec", DType::F32, &[hv, nb_max, 2, CHUNK])?;
    let mut t0 = 0;
    while t0 < t {
        let n_tok = (t - t0).min(nb_max * CHUNK);
        let nb = n_tok.div_ceil(CHUNK);
        let params = u32s([hk, hv, dk, dv, dims.conv_dim(), t0, n_tok, nb]);
        enc.run(
            Kernel::DeltaChunkPrep,
            None,
            &params,
            &[u.into(), g.into(), beta.into(), (&p).into(), (&x).into(), (&dec).into()],
            [nb as u32, hv as u32, 1],
        )?;
        enc.run(
            Kernel::DeltaChunkState,
            None,
            &params,
            &[
                u.into(),
                state.into(),
                out.into(),
                (&p).into(),
                (&x).into(),
                (&dec).into(),
            ],
            [dv.div_ceil(ROWS) as u32, hv as u32, 1],
        )?;
        t0 += n_tok;
    }
    Ok(())
}
