//! The exact decode products on the tensor cores (kernels-cuda/matvec_tc.cu): Q4_K weights as the
//! A operand of f16 MMAs, exact; x split into three f16 terms per element by a prep kernel, so
//! the sums keep f32 precision (the strict tier). About 2 instructions per weight against the f32
//! kernels' 3.5: 1.4-1.75x faster on the H200 (dev/cuda/matvec_bench.cu, BENCHMARKS.md).
//!
//! A prepared x is a copy of the f32 activations like the f16 ones of `shadow.rs`, and kept the
//! same way: the projections that read one normed hidden state share one prep.

use super::linear::Mv;
use super::{grid_u32, Launch, GRID_YZ_MAX};
use crate::backend::cuda::driver::DevPtr;
use crate::backend::cuda::launch::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::Tensor;
use crate::error::Result;
use crate::gguf::GgmlType;

/// Elements per prepared super-block, and its A words and sums (matvec_tc.cuh `SB_WORDS`,
/// `SB_SUMS`).
const SB: usize = 256;
const SB_WORDS: usize = 4 * 3 * 32;
const SB_SUMS: usize = 16;
/// Products with at least this many rows run `mvtc_tall_` (32 rows per block of 4 warps), the others
/// `mvtc_` (16 rows per block of 8 warps): matvec_tc.cu says why.
const TALL_ROWS: usize = 8192;

/// The kernel, rows per block and threads for a product of `n_out` rows (`glu`: the fused SwiGLU).
fn geometry(n_out: usize, glu: bool) -> (&'static str, usize, u32) {
    if glu {
        // RILL_CUDA_MVTC_GLU_KW=4: the 4-warp SwiGLU kernel (to compare on a GPU), read once.
        static KW4: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *KW4.get_or_init(|| std::env::var("RILL_CUDA_MVTC_GLU_KW").as_deref() == Ok("4")) {
            return ("mvtc_glu4_", 16, 128);
        }
        return ("mvtc_glu_", 16, 256);
    }
    if n_out >= TALL_ROWS {
        ("mvtc_tall_", 32, 128)
    } else {
        ("mvtc_", 16, 256)
    }
}

/// A prepared x: the A words of every row, then the sums of every row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TcX {
    pub xa: DevPtr,
    pub xs: DevPtr,
}

/// Bytes of the prepared copy of `rows` vectors of `n_in` (a multiple of 256).
pub(crate) fn prep_bytes(rows: usize, n_in: usize) -> usize {
    rows * (n_in / SB) * (SB_WORDS + SB_SUMS) * 4
}

/// Whether a kernel with `threads` threads per row can prepare rows of `d` itself (matvec_tc.cuh
/// `prep_row`: one warp per super-block, whole warps) and should: the products that would read the
/// copy run here, and a Q4_K one has run before (the first token's norms leave it to the prep
/// kernel; a model without Q4_K weights never pays for it).
pub(crate) fn prep_fits(inner: &Inner, d: usize, threads: u32) -> bool {
    inner.tc_q4k_seen.load(std::sync::atomic::Ordering::Relaxed)
        && super::linear::tc_enabled(inner)
        && d > 0
        && d.is_multiple_of(SB)
        && threads.is_multiple_of(32)
}

/// Where the parts of a prepared copy of `rows` rows of `n_in` at `base` lie.
pub(crate) fn tc_planes(base: DevPtr, rows: usize, n_in: usize) -> TcX {
    TcX {
        xa: base,
        xs: base + (rows * (n_in / SB) * SB_WORDS * 4) as u64,
    }
}

/// Whether the product `m` runs here: Q4_K weights (both of a SwiGLU), rows of whole
/// super-blocks, 16-byte aligned weights, and x rows within one grid.
pub(crate) fn applies(m: &Mv) -> bool {
    let ok = |w: &super::linear::Weight| w.ty == GgmlType::Q4K && w.ptr.is_multiple_of(16);
    m.n_in > 0
        && m.n_in.is_multiple_of(SB)
        && ok(m.w)
        && m.w2.is_none_or(ok)
        && m.expert_bytes.is_multiple_of(16)
        && x_rows(m) <= GRID_YZ_MAX
}

/// Rows of x the product reads.
pub(crate) fn x_rows(m: &Mv) -> usize {
    (m.vectors * m.nsum).div_ceil(m.x_group.max(1))
}

/// Prepare `rows` rows of `n_in` f32 values at `src` into `dst` (`prep_bytes` of them). Reads
/// nothing that an op writes later in the stream than this launch: submitted without tensors.
pub(crate) fn prep(inner: &Inner, src: DevPtr, rows: usize, n_in: usize, dst: DevPtr) -> Result<TcX> {
    let x = tc_planes(dst, rows, n_in);
    let mut a = Args::default();
    a.p[0] = src;
    a.p[1] = x.xa;
    a.p[2] = x.xs;
    inner.kernel_rw(
        Launch {
            name: ("mvtc_prep_", "Q4_K"),
            grid: [
                grid_u32("matvec", "super-blocks", n_in / SB)?,
                grid_u32("matvec", "rows", rows)?,
                1,
            ],
            block: 32,
            smem: 0,
            args: a,
            phase: Phase::Norms,
        },
        0.0,
        &[],
        &[],
    )?;
    Ok(x)
}

/// Launch the product `m` on its prepared x (`applies(m)` holds).
pub(crate) fn run(
    inner: &Inner,
    op: &str,
    m: &Mv,
    x: TcX,
    flops: impl Fn(usize) -> f64,
    reads: &[&Tensor],
    writes: &[&Tensor],
) -> Result<()> {
    inner.tc_q4k_seen.store(true, std::sync::atomic::Ordering::Relaxed);
    let (kernel, rows_per_block, threads) = geometry(m.n_out, m.w2.is_some());
    let gx = grid_u32(op, "row blocks", m.n_out.div_ceil(rows_per_block))?;
    let nsb = m.n_in / SB;
    // Output vectors in chunks of the grid's y limit, each a whole number of x groups.
    let chunk = (GRID_YZ_MAX / m.x_group.max(1)).max(1) * m.x_group.max(1);
    for v0 in (0..m.vectors).step_by(chunk) {
        let nv = (m.vectors - v0).min(chunk);
        let entries0 = v0 * m.nsum;
        let x_row0 = entries0 / m.x_group.max(1);
        let mut a = Args::default();
        a.p[0] = m.w.ptr;
        a.p[1] = m.w2.map_or(0, |w| w.ptr);
        a.p[2] = x.xa + (x_row0 * nsb * SB_WORDS * 4) as u64;
        a.p[3] = m.out + 4 * (v0 * m.n_out) as u64;
        a.p[4] = if m.ids == 0 { 0 } else { m.ids + 4 * entries0 as u64 };
        a.p[5] = if m.scales == 0 {
            0
        } else {
            m.scales + 4 * entries0 as u64
        };
        a.p[6] = x.xs + (x_row0 * nsb * SB_SUMS * 4) as u64;
        a.n[0] = m.n_out as i64;
        a.n[1] = m.n_in as i64;
        a.n[2] = m.w.row_bytes as i64;
        a.n[3] = m.expert_bytes as i64;
        a.n[4] = m.n_experts as i64;
        a.n[5] = m.x_group as i64;
        a.n[6] = m.nsum as i64;
        a.n[7] = m.n_out as i64;
        inner.kernel_rw(
            Launch {
                name: (kernel, m.w.suffix),
                grid: [gx, nv as u32, 1],
                block: threads,
                smem: 0,
                args: a,
                phase: m.w.phase,
            },
            flops(nv),
            reads,
            writes,
        )?;
    }
    Ok(())
}
