//! Products with weight matrices in their GGUF block formats: `embed` (kernels-cuda/embed.cu),
//! `matmul` and `matmul_swiglu` (matvec.cu, matvec_glu.cu for a few tokens, matmul_tiled.cu for
//! a batch), and the MoE expert products (matvec kernels with expert indirection).
//!
//! `matmul_dispatch` is the one place that picks the kernel for a batch of T tokens; faster
//! prefill kernels (tensor cores) slot in there.

use super::{grid_u32, Launch, GRID_YZ_MAX};
use crate::backend::cuda::buffer::{get, ptr};
use crate::backend::cuda::driver::{cuda_err, DevPtr};
use crate::backend::cuda::launch::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::{buffer, Inner};
use crate::backend::{check, DType, Tensor};
use crate::error::Result;
use crate::gguf::GgmlType;

/// Batches up to this many tokens use the matrix-vector kernels (weights read once per token);
/// larger ones the tiled kernel (weights read once per 64 tokens).
const MATVEC_MAX_T: usize = 4;

/// Threads per matvec block and the rows-per-thread limits (kernels-cuda/matvec.cuh).
const MV_THREADS: usize = 256;
const MV_RPT_MAX: usize = 8;
const MV_RPT_MAX_GLU: usize = 4;
/// Shared-memory floats per 32-element unit of activations (32 + padding).
const MV_XPAD: usize = 36;

/// The format of a weight (an F32 tensor reads as F32): kernels are named after it
/// (`matvec_Q4_K`), one for every type the CPU backend reads.
pub(crate) fn format(op: &str, dtype: DType) -> Result<GgmlType> {
    let ty = match dtype {
        DType::F32 => GgmlType::F32,
        DType::Ggml(t) => t,
        DType::U32 => return Err(cuda_err(format!("{op}: a U32 tensor is not a weight"))),
    };
    if !crate::quant::can_dequantize(ty) {
        return Err(cuda_err(format!(
            "{op}: weight type {ty} is not supported by the cuda backend"
        )));
    }
    Ok(ty)
}

/// A weight operand: device address, bytes per row, format suffix and the phase for the profile.
struct Weight {
    ptr: DevPtr,
    row_bytes: usize,
    suffix: &'static str,
    ty: GgmlType,
    phase: Phase,
}

/// Check that `w` holds `rows` rows of `cols` elements of its format (`rows` counts every expert).
fn weight(op: &str, w: &Tensor, rows: usize, cols: usize) -> Result<Weight> {
    let ty = format(op, w.dtype)?;
    let row_bytes = ty
        .row_size(cols as u64)
        .ok_or_else(|| cuda_err(format!("{op}: a row of {cols} is not a whole number of {ty} blocks")))?
        as usize;
    let need = row_bytes
        .checked_mul(rows)
        .ok_or_else(|| cuda_err(format!("{op}: weight {:?} overflows", w.shape)))?;
    let b = get(w, op, need)?;
    // Block decoders read whole 16-byte chunks around the data: only padded weight buffers, or
    // F32 tensors (read as whole f32 values, never past their end), qualify.
    if w.dtype != DType::F32 && b.bytes < need + buffer::WEIGHT_PAD {
        return Err(cuda_err(format!("{op}: weight buffer lacks its padding")));
    }
    Ok(Weight {
        ptr: b.ptr,
        row_bytes,
        suffix: ty.name(),
        ty,
        phase: Phase::of_weight(b.name.as_deref()),
    })
}

// ---- embed ------------------------------------------------------------------------------------

pub(crate) fn embed(inner: &Inner, table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()> {
    let op = "embed";
    let e = check::embed(table, ids, out)?;
    let w = weight(op, table, e.vocab, e.d)?;
    if e.tokens == 0 || e.d == 0 {
        return Ok(());
    }
    let units = e.d.div_ceil(32);
    let (idp, outp) = (ptr(ids, op)?, ptr(out, op)?);
    // Tokens in chunks of the grid's y limit.
    for t0 in (0..e.tokens).step_by(GRID_YZ_MAX) {
        let n = (e.tokens - t0).min(GRID_YZ_MAX);
        let mut a = Args::default();
        a.p[0] = w.ptr;
        a.p[1] = idp + 4 * t0 as u64;
        a.p[2] = outp + 4 * (t0 * e.d) as u64;
        a.n[0] = e.vocab as i64;
        a.n[1] = e.d as i64;
        a.n[2] = w.row_bytes as i64;
        inner.kernel(
            Launch {
                name: ("embed_", w.suffix),
                grid: [grid_u32(op, "units", units.div_ceil(64))?, n as u32, 1],
                block: 64,
                smem: 0,
                args: a,
                phase: Phase::Head,
            },
            &[table, ids, out],
        )?;
    }
    Ok(())
}

// ---- matrix-vector kernels --------------------------------------------------------------------

/// Launch geometry of a matvec kernel (kernels-cuda/matvec.cuh).
#[derive(Debug, Clone, Copy)]
struct MvPlan {
    /// Unit lanes: threads sharing one row group (a power of two, 32..=256).
    ut: usize,
    /// Rows per thread.
    rpt: usize,
    /// Activations in shared memory (else read from global memory).
    x_in_smem: bool,
    smem: u32,
}

impl MvPlan {
    fn rows_per_block(&self) -> usize {
        (MV_THREADS / self.ut) * self.rpt
    }
}

/// The unit-lane count for rows of `units` 32-element units: the widest power of two (<= 256)
/// that divides the units evenly (every thread gets the same number of units), else the smallest
/// power of two >= units (short rows), else 256.
fn unit_lanes(units: usize) -> usize {
    for ut in [256, 128, 64, 32] {
        if units >= ut && units.is_multiple_of(ut) {
            return ut;
        }
    }
    if units < 256 {
        units.next_power_of_two().clamp(32, 256)
    } else {
        256
    }
}

/// `RILL_CUDA_MV_UT` and `RILL_CUDA_MV_RPT`: fixed unit lanes / rows per thread for every matvec
/// (tuning with dev/cuda/matvec_bench), read once.
fn mv_overrides() -> (Option<usize>, Option<usize>) {
    static O: std::sync::OnceLock<(Option<usize>, Option<usize>)> = std::sync::OnceLock::new();
    *O.get_or_init(|| {
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
        (
            num("RILL_CUDA_MV_UT").filter(|u| [32, 64, 128, 256].contains(u)),
            num("RILL_CUDA_MV_RPT"),
        )
    })
}

/// Plan a matvec over `rows` output rows in total (all output vectors), rows of `n_in`, with
/// `nsum` activation vectors per block.
fn mv_plan(inner: &Inner, rows: usize, n_in: usize, nsum: usize, glu: bool) -> MvPlan {
    let units = n_in.div_ceil(32).max(1);
    let (ut_override, rpt_override) = mv_overrides();
    let ut = ut_override.unwrap_or_else(|| unit_lanes(units));
    let rg = MV_THREADS / ut;
    let rpt_max = if glu { MV_RPT_MAX_GLU } else { MV_RPT_MAX };
    // About two blocks per SM for the whole product, as many rows per thread as that allows:
    // each thread then loads its activations once for several rows.
    let target_blocks = 2 * inner.sms();
    let rpt = rpt_override
        .unwrap_or_else(|| rows.div_ceil(rg * target_blocks))
        .clamp(1, rpt_max);
    let smem = nsum * units * MV_XPAD * 4;
    let x_in_smem = smem <= inner.kernels.matvec_smem_limit() as usize;
    MvPlan {
        ut,
        rpt,
        x_in_smem,
        smem: if x_in_smem { smem as u32 } else { 0 },
    }
}

/// One matvec launch family: everything but the output-vector range.
struct Mv<'a> {
    w: &'a Weight,
    w2: Option<&'a Weight>,
    x: DevPtr,
    out: DevPtr,
    ids: DevPtr,
    scales: DevPtr,
    n_out: usize,
    n_in: usize,
    expert_bytes: usize,
    n_experts: usize,
    /// Output vectors sharing one activation vector (MoE gate/up: k).
    x_group: usize,
    /// Entries summed into one output vector (MoE down: k).
    nsum: usize,
    /// Output vectors.
    vectors: usize,
}

impl<'a> Mv<'a> {
    /// A dense product (no experts) of `d.t` token vectors; `w2` makes it the fused SwiGLU.
    fn dense(w: &'a Weight, w2: Option<&'a Weight>, x: DevPtr, out: DevPtr, d: check::MatmulDims) -> Mv<'a> {
        Mv {
            w,
            w2,
            x,
            out,
            ids: 0,
            scales: 0,
            n_out: d.n_out,
            n_in: d.n_in,
            expert_bytes: 0,
            n_experts: 1,
            x_group: 1,
            nsum: 1,
            vectors: d.t,
        }
    }
}

fn run_mv(inner: &Inner, op: &str, m: &Mv, uses: &[&Tensor]) -> Result<()> {
    if m.vectors == 0 || m.n_out == 0 {
        return Ok(());
    }
    let glu = m.w2.is_some();
    let plan = mv_plan(inner, m.n_out * m.vectors, m.n_in, m.nsum, glu);
    let gx = grid_u32(op, "row blocks", m.n_out.div_ceil(plan.rows_per_block()))?;
    let prefix = if glu { "matvec_glu_" } else { "matvec_" };
    // Output vectors in chunks of the grid's y limit; every per-vector pointer moves with them.
    // A chunk holds a whole number of x groups, so the kernel's `entry / x_group` stays right.
    let chunk = (GRID_YZ_MAX / m.x_group.max(1)).max(1) * m.x_group.max(1);
    for v0 in (0..m.vectors).step_by(chunk) {
        let nv = (m.vectors - v0).min(chunk);
        let entries0 = v0 * m.nsum; // first ids / scales entry of this chunk
        let x_row0 = entries0 / m.x_group.max(1);
        let mut a = Args::default();
        a.p[0] = m.w.ptr;
        a.p[1] = m.w2.map_or(0, |w| w.ptr);
        a.p[2] = m.x + 4 * (x_row0 * m.n_in) as u64;
        a.p[3] = m.out + 4 * (v0 * m.n_out) as u64;
        a.p[4] = if m.ids == 0 { 0 } else { m.ids + 4 * entries0 as u64 };
        a.p[5] = if m.scales == 0 {
            0
        } else {
            m.scales + 4 * entries0 as u64
        };
        a.n[0] = m.n_out as i64;
        a.n[1] = m.n_in as i64;
        a.n[2] = m.w.row_bytes as i64;
        a.n[3] = m.expert_bytes as i64;
        a.n[4] = m.n_experts as i64;
        a.n[5] = m.x_group as i64;
        a.n[6] = m.nsum as i64;
        a.n[7] = plan.ut as i64;
        a.n[8] = plan.rpt as i64;
        a.n[9] = i64::from(plan.x_in_smem);
        a.n[10] = m.n_out as i64;
        a.n[11] = m.n_in as i64;
        inner.kernel(
            Launch {
                name: (prefix, m.w.suffix),
                grid: [gx, nv as u32, 1],
                block: MV_THREADS as u32,
                smem: plan.smem,
                args: a,
                phase: m.w.phase,
            },
            uses,
        )?;
    }
    Ok(())
}

// ---- matmul -------------------------------------------------------------------------------------

pub(crate) fn matmul(inner: &Inner, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
    let op = "matmul";
    let d = check::matmul(w, x, out)?;
    let wt = weight(op, w, d.n_out, d.n_in)?;
    let (xp, op_) = (ptr(x, op)?, ptr(out, op)?);
    matmul_dispatch(inner, &wt, xp, op_, d, &[w, x, out])
}

/// The kernel for `out [T, n_out] = x [T, n_in] · Wᵀ` by batch size.
fn matmul_dispatch(
    inner: &Inner,
    w: &Weight,
    x: DevPtr,
    out: DevPtr,
    d: check::MatmulDims,
    uses: &[&Tensor],
) -> Result<()> {
    let op = "matmul";
    if d.t == 0 || d.n_out == 0 {
        return Ok(());
    }
    if d.n_in == 0 {
        // An empty sum: zeros (the kernels never run a unit).
        return inner.submit(
            crate::backend::cuda::launch::Op::Memset {
                dst: out,
                bytes: d.t * d.n_out * 4,
            },
            uses,
        );
    }
    if d.t <= MATVEC_MAX_T {
        return run_mv(inner, op, &Mv::dense(w, None, x, out, d), uses);
    }
    // Prefill: 64 x 64 output tiles, weights read once per 64 tokens.
    for t0 in (0..d.t).step_by(64 * GRID_YZ_MAX) {
        let n = (d.t - t0).min(64 * GRID_YZ_MAX);
        let mut a = Args::default();
        a.p[0] = w.ptr;
        a.p[1] = x + 4 * (t0 * d.n_in) as u64;
        a.p[2] = out + 4 * (t0 * d.n_out) as u64;
        a.n[0] = d.n_out as i64;
        a.n[1] = d.n_in as i64;
        a.n[2] = w.row_bytes as i64;
        a.n[3] = n as i64;
        inner.kernel(
            Launch {
                name: ("matmul_tiled_", w.suffix),
                grid: [
                    grid_u32(op, "row tiles", d.n_out.div_ceil(64))?,
                    n.div_ceil(64) as u32,
                    1,
                ],
                block: 256,
                smem: 0,
                args: a,
                phase: w.phase,
            },
            uses,
        )?;
    }
    Ok(())
}

/// `out = silu(W_gate x) * (W_up x)`: one pass over both weights for a few tokens when they share
/// a format, else the two products and `swiglu`.
pub(crate) fn matmul_swiglu(
    inner: &Inner,
    w_gate: &Tensor,
    w_up: &Tensor,
    x: &Tensor,
    gate_tmp: &Tensor,
    up_tmp: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let op = "matmul_swiglu";
    let d = check::matmul_swiglu(w_gate, w_up, x, gate_tmp, up_tmp, out)?;
    if d.t <= MATVEC_MAX_T && w_gate.dtype == w_up.dtype && d.n_in > 0 {
        let (g, u) = (weight(op, w_gate, d.n_out, d.n_in)?, weight(op, w_up, d.n_out, d.n_in)?);
        let m = Mv::dense(&g, Some(&u), ptr(x, op)?, ptr(out, op)?, d);
        return run_mv(inner, op, &m, &[w_gate, w_up, x, out]);
    }
    matmul(inner, w_gate, x, gate_tmp)?;
    matmul(inner, w_up, x, up_tmp)?;
    super::eltwise::swiglu(inner, gate_tmp, up_tmp, out)
}

// ---- MoE experts --------------------------------------------------------------------------------

/// `out[t] = sum_j weights[t][j] * down_e(silu(gate_e x[t]) * up_e x[t])`, e = ids[t][j]: the
/// gate/up products of every (token, expert) entry into a hidden row, then one down product per
/// token that sums its k entries. Only the selected experts' rows are read.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_experts(
    inner: &Inner,
    x: &Tensor,
    gate_exps: &Tensor,
    up_exps: &Tensor,
    down_exps: &Tensor,
    ids: &Tensor,
    weights: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let op = "moe_experts";
    let m = check::moe_experts(x, gate_exps, up_exps, down_exps, ids, weights, out)?;
    let (t, d, e, f, k) = (m.t, m.d, m.n_exp, m.n_ff, m.k);
    if t == 0 {
        return Ok(());
    }
    let outp = ptr(out, op)?;
    if k == 0 || d == 0 || f == 0 {
        return inner.submit(
            crate::backend::cuda::launch::Op::Memset {
                dst: outp,
                bytes: t * d * 4,
            },
            &[out],
        );
    }
    let g = weight(op, gate_exps, e * f, d)?;
    let u = weight(op, up_exps, e * f, d)?;
    let dn = weight(op, down_exps, e * d, f)?;
    let (xp, idp, wp) = (ptr(x, op)?, ptr(ids, op)?, ptr(weights, op)?);
    let entries = t * k;
    // Hidden rows h[t*k + j] = silu(gate_e x[t]) * up_e x[t].
    let h = inner.workspace("moe_hidden", entries * f * 4)?;
    let uses = [x, gate_exps, up_exps, down_exps, ids, weights, out];
    fn gate_up<'a>(
        w: &'a Weight,
        w2: Option<&'a Weight>,
        x: DevPtr,
        ids: DevPtr,
        dst: DevPtr,
        m: check::MoeDims,
    ) -> Mv<'a> {
        Mv {
            w,
            w2,
            x,
            out: dst,
            ids,
            scales: 0,
            n_out: m.n_ff,
            n_in: m.d,
            expert_bytes: m.n_ff * w.row_bytes,
            n_experts: m.n_exp,
            x_group: m.k,
            nsum: 1,
            vectors: m.t * m.k,
        }
    }
    if g.ty == u.ty {
        run_mv(inner, op, &gate_up(&g, Some(&u), xp, idp, h, m), &uses)?;
    } else {
        // Different formats: the two products separately, then swiglu.
        let gt = inner.workspace("moe_gate", entries * f * 4)?;
        let ut = inner.workspace("moe_up", entries * f * 4)?;
        run_mv(inner, op, &gate_up(&g, None, xp, idp, gt, m), &uses)?;
        run_mv(inner, op, &gate_up(&u, None, xp, idp, ut, m), &uses)?;
        let mut a = Args::default();
        a.p[0] = gt;
        a.p[1] = ut;
        a.p[2] = h;
        a.n[0] = (entries * f) as i64;
        inner.kernel(
            Launch {
                name: ("swiglu", ""),
                grid: [super::stride_blocks(inner, entries * f), 1, 1],
                block: 256,
                smem: 0,
                args: a,
                phase: Phase::FfnMoe,
            },
            &uses,
        )?;
    }
    // Down: out[t] = sum_j weights[t*k + j] * down_{ids[t*k + j]} h[t*k + j].
    run_mv(
        inner,
        op,
        &Mv {
            w: &dn,
            w2: None,
            x: h,
            out: outp,
            ids: idp,
            scales: wp,
            n_out: d,
            n_in: f,
            expert_bytes: d * dn.row_bytes,
            n_experts: e,
            x_group: 1,
            nsum: k,
            vectors: t,
        },
        &uses,
    )
}
