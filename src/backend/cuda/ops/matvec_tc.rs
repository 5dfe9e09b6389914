//! The exact decode products on the tensor cores (kernels-cuda/matvec_tc*.cu): Q4_K weights as the
//! A operand of f16 MMAs, exact; x split into three f16 terms per element by a prep kernel, so
//! the sums keep f32 precision (the strict tier). About 2 instructions per weight against the f32
//! kernels' 3.5: 1.4-1.75x faster on the H200 (dev/cuda/matvec_bench.cu, BENCHMARKS.md). Q8_0 and
//! Q6_K run on the int8 MMA, x split into four signed base-256 digits (matvec_tc8.cuh,
//! matvec_tc6.cuh): 1.3x and 1.1-1.35x. Each format prepares x in its own layout (`TcFormat`).
//!
//! A prepared x is a copy of the f32 activations like the f16 ones of `shadow.rs`, and kept the
//! same way (per format): the projections that read one normed hidden state share one prep.

use super::linear::Mv;
use super::{grid_u32, Launch, GRID_YZ_MAX};
use crate::backend::cuda::driver::DevPtr;
use crate::backend::cuda::launch::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::Tensor;
use crate::error::Result;
use crate::gguf::GgmlType;

/// Inputs per prepared unit (a super-block, or Q8_0's group of 8 blocks).
const SB: usize = 256;
/// Products with at least this many rows run `mvtc_tall_` (32 rows per block), the others
/// `mvtc_` (16 rows per block of 8 warps): matvec_tc.cu and matvec_tc8.cu say why.
const TALL_ROWS: usize = 8192;
/// Dense Q8_0 products with at least this many rows (the LM head) run `mvtc_head_Q8_0` (32 rows
/// per block of 4 warps).
const Q8_HEAD_ROWS: usize = 65536;

/// What differs between the formats: the prepared copy's words and sums per unit of 256 inputs
/// (the cuh files' `WORDS`, `SUMS`), what a row's length must be a multiple of, and the prep
/// kernel's threads per unit (Q4_K one warp, the int8 formats one thread per element).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcFormat {
    pub(crate) ty: GgmlType,
    words: usize,
    sums: usize,
    n_in_multiple: usize,
    prep_threads: u32,
}

const Q4K: TcFormat = TcFormat {
    ty: GgmlType::Q4K,
    words: 4 * 3 * 32,
    sums: 16,
    n_in_multiple: SB,
    prep_threads: 32,
};
const Q8_0: TcFormat = TcFormat {
    ty: GgmlType::Q8_0,
    words: 32 * 24,
    sums: 16,
    n_in_multiple: SB,
    prep_threads: 256,
};
/// Q6_K's loads assume 8 warps striding over the super-blocks of rows that start 16-byte
/// aligned: 210-byte super-blocks realign every 8 (matvec_tc6.cuh).
const Q6K: TcFormat = TcFormat {
    ty: GgmlType::Q6K,
    words: 8 * 32,
    sums: 1,
    n_in_multiple: 8 * SB,
    prep_threads: 256,
};

impl TcFormat {
    /// The tensor-core kernels of weight format `ty`, if it has them.
    pub(crate) fn of(ty: GgmlType) -> Option<TcFormat> {
        match ty {
            GgmlType::Q4K => Some(Q4K),
            GgmlType::Q8_0 => Some(Q8_0),
            GgmlType::Q6K => Some(Q6K),
            _ => None,
        }
    }

    /// The layout the decode RMSNorms write themselves (matvec_tc.cuh `prep_row`).
    pub(crate) fn norm() -> TcFormat {
        Q4K
    }

    /// The kernel, rows per block and threads for a product of `n_out` rows (`glu`: the fused
    /// SwiGLU; `dense`: no experts, one x row per output; the `_tall_` / `_head_` Q8_0 kernels
    /// read nothing else; `shared`: MoE experts with a shared expert, the `_sh_` kernels).
    fn geometry(&self, n_out: usize, glu: bool, dense: bool, shared: bool) -> (&'static str, usize, u32) {
        match self.ty {
            _ if shared && glu => ("mvtc_glu_sh_", 16, 256),
            _ if shared => ("mvtc_sh_", 16, 256),
            GgmlType::Q8_0 if dense && !glu && n_out >= Q8_HEAD_ROWS => ("mvtc_head_", 32, 128),
            GgmlType::Q8_0 if dense && !glu && n_out >= TALL_ROWS => ("mvtc_tall_", 32, 256),
            GgmlType::Q8_0 | GgmlType::Q6K if glu => ("mvtc_glu_", 16, 256),
            GgmlType::Q8_0 | GgmlType::Q6K => ("mvtc_", 16, 256),
            _ => q4k_geometry(n_out, glu),
        }
    }

    /// Bytes of the prepared copy of `rows` vectors of `n_in` (a multiple of 256).
    pub(crate) fn prep_bytes(&self, rows: usize, n_in: usize) -> usize {
        rows * (n_in / SB) * (self.words + self.sums) * 4
    }

    /// Where the parts of a prepared copy of `rows` rows of `n_in` at `base` lie.
    pub(crate) fn planes(&self, base: DevPtr, rows: usize, n_in: usize) -> TcX {
        TcX {
            xa: base,
            xs: base + (rows * (n_in / SB) * self.words * 4) as u64,
        }
    }
}

/// The Q4_K kernel, rows per block and threads for a product of `n_out` rows (`glu`: the fused
/// SwiGLU).
fn q4k_geometry(n_out: usize, glu: bool) -> (&'static str, usize, u32) {
    if glu {
        // 8 warps: 4 were slower end to end (9B Q4_K_M decode 210.8 against 221.2 t/s on the H200).
        return ("mvtc_glu_", 16, 256);
    }
    if n_out >= TALL_ROWS {
        ("mvtc_tall_", 32, 128)
    } else {
        ("mvtc_", 16, 256)
    }
}

/// A prepared x: the A (or B) words of every row, then the sums of every row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TcX {
    pub xa: DevPtr,
    pub xs: DevPtr,
}

/// Whether a kernel with `threads` threads per row can prepare rows of `d` itself in the norms'
/// layout (matvec_tc.cuh `prep_row`: one warp per super-block, whole warps), and the products
/// that would read the copy run here; and should: a Q4_K product has run before (the first
/// token's norms leave it to the prep kernel; a model without Q4_K weights never pays for it).
pub(crate) fn prep_fits(inner: &Inner, d: usize, threads: u32) -> bool {
    inner.tc_q4k_seen.load(std::sync::atomic::Ordering::Relaxed)
        && super::linear::tc_enabled(inner)
        && d > 0
        && d.is_multiple_of(SB)
        && threads.is_multiple_of(32)
}

/// The format whose kernels run the product `m`, if they do: Q4_K, Q8_0 or Q6_K weights (both
/// of a SwiGLU, the same format), rows a multiple of the format's unit, 16-byte aligned weights
/// (a shared expert's too) and experts, and x rows within one grid.
pub(crate) fn applies(m: &Mv) -> Option<TcFormat> {
    let f = TcFormat::of(m.w.ty)?;
    let ok = |w: &super::linear::Weight| w.ty == f.ty && w.ptr.is_multiple_of(16);
    let shared_ok = m
        .shared
        .is_none_or(|s| s.w.is_multiple_of(16) && (m.w2.is_none() || s.w2.is_multiple_of(16)));
    (m.n_in > 0
        && m.n_in.is_multiple_of(f.n_in_multiple)
        && ok(m.w)
        && m.w2.is_none_or(ok)
        && shared_ok
        && m.w.row_bytes.is_multiple_of(16)
        && m.expert_bytes.is_multiple_of(16)
        && x_rows(m) <= GRID_YZ_MAX)
        .then_some(f)
}

/// Rows of x the product reads.
pub(crate) fn x_rows(m: &Mv) -> usize {
    (m.vectors * m.nsum).div_ceil(m.x_group.max(1))
}

/// Prepare `rows` rows of `n_in` f32 values at `src` into `dst` (`f.prep_bytes` of them) in
/// format `f`'s layout. Reads nothing that an op writes later in the stream than this launch:
/// submitted without tensors.
pub(crate) fn prep(inner: &Inner, f: TcFormat, src: DevPtr, rows: usize, n_in: usize, dst: DevPtr) -> Result<TcX> {
    let x = f.planes(dst, rows, n_in);
    let mut a = Args::default();
    a.p[0] = src;
    a.p[1] = x.xa;
    a.p[2] = x.xs;
    inner.kernel_rw(
        Launch {
            name: ("mvtc_prep_", f.ty.name()),
            grid: [
                grid_u32("matvec", "super-blocks", n_in / SB)?,
                grid_u32("matvec", "rows", rows)?,
                1,
            ],
            block: f.prep_threads,
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

/// Launch the product `m` on its prepared x (`applies(m)` gave `f`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    inner: &Inner,
    op: &str,
    f: TcFormat,
    m: &Mv,
    x: TcX,
    flops: impl Fn(usize) -> f64,
    reads: &[&Tensor],
    writes: &[&Tensor],
) -> Result<()> {
    if f.ty == GgmlType::Q4K {
        inner.tc_q4k_seen.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let dense = m.ids == 0 && m.scales == 0 && m.nsum == 1 && m.x_group == 1;
    let (kernel, rows_per_block, threads) = f.geometry(m.n_out, m.w2.is_some(), dense, m.shared.is_some());
    let gx = grid_u32(op, "row blocks", m.n_out.div_ceil(rows_per_block))?;
    let nsb = m.n_in / SB;
    for (mut a, nv, x_row0) in m.chunks() {
        // Slots of its own (matvec_tc.cuh `mv_body`): p2 the prepared words, p6 the sums, n7 the
        // output stride, n8 the shared expert's second operand.
        a.p[2] = x.xa + (x_row0 * nsb * f.words * 4) as u64;
        a.p[6] = x.xs + (x_row0 * nsb * f.sums * 4) as u64;
        a.n[7] = m.n_out as i64;
        a.n[8] = m.shared_second(x_row0) as i64;
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
