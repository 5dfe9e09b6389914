//! The exact decode products on the tensor cores (kernels-cuda/matvec_tc*.cu): Q4_K weights as the
//! A operand of f16 MMAs, exact; x split into three f16 terms per element by a prep kernel, so
//! the sums keep f32 precision (the strict tier). About 2 instructions per weight against the f32
//! kernels' 3.5: 1.4-1.75x faster on the H200 (dev/cuda/matvec_bench.cu, BENCHMARKS.md). Q8_0 and
//! Q6_K run on the int8 MMA, x split into four signed base-256 digits (matvec_tc8.cuh,
//! matvec_tc6.cuh): 1.3x and 1.1-1.35x. Each format prepares x in its own layout (`TcFormat`).
//!
//! A prepared x is a copy of the f32 activations like the f16 ones of `shadow.rs`, and kept the
//! same way (per format): the projections that read one normed hidden state share one prep.
//! Each prep is a launch on the critical path (~2 us of a decode step under dependent launch), so
//! the kernels that write a product's input row by row in decode (the RMSNorms, the gated norm of
//! the delta-rule output, the gate of the attention output: `Producer`) prepare their output
//! themselves in every layout the products have read from that kind of output (`Preps`).

use std::sync::atomic::{AtomicU8, Ordering};

use super::mv::{Mv, Weight};
use super::{grid_u32, Launch, GRID_YZ_MAX};
use crate::backend::cuda::driver::{cuda_err, DevPtr};
use crate::backend::cuda::op::Args;
use crate::backend::cuda::policy::{self, MvKernels, MvShape, TcGeometry, TcKernel, TcTakes, MATVEC_MAX_T};
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::{Inner, SYNC_COUNTERS};
use crate::backend::Tensor;
use crate::error::Result;
use crate::gguf::GgmlType;

/// Inputs per prepared unit (a super-block, or Q8_0's group of 8 blocks).
const SB: usize = policy::TC_UNIT;

/// What differs between the formats: the prepared copy's words and sums per unit of 256 inputs
/// (the cuh files' `WORDS`, `SUMS`), what the kernels take (`policy::TcTakes`), and how the
/// producer kernels (kernels-cuda/norm.cu) take the layout: its bit in their records and the
/// pointer slot of their `Args`. Every prep kernel is one warp per unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcFormat {
    pub(crate) ty: GgmlType,
    words: usize,
    sums: usize,
    pub(crate) takes: TcTakes,
    bit: u8,
    slot: usize,
}

/// What the kernels of `ty` take; only called for the formats that have them (in constants, so a
/// format without them is a compile error).
const fn takes(ty: GgmlType) -> TcTakes {
    match policy::tc_takes(ty) {
        Some(t) => t,
        None => panic!("a tensor-core format without kernels"),
    }
}

const Q4K: TcFormat = TcFormat {
    ty: GgmlType::Q4K,
    words: 4 * 3 * 32,
    sums: 16,
    takes: takes(GgmlType::Q4K),
    bit: 1,
    slot: 7,
};
const Q8_0: TcFormat = TcFormat {
    ty: GgmlType::Q8_0,
    words: 32 * 24,
    sums: 16,
    takes: takes(GgmlType::Q8_0),
    bit: 2,
    slot: 5,
};
const Q6K: TcFormat = TcFormat {
    ty: GgmlType::Q6K,
    words: 8 * 32,
    sums: 1,
    takes: takes(GgmlType::Q6K),
    bit: 4,
    slot: 4,
};
const FORMATS: [TcFormat; 3] = [Q4K, Q8_0, Q6K];

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

/// The n11 bits of the tensor-core matvec launches (kernels-cuda/matvec_tc.cuh). Bit 0: a dense
/// product pulls its block rows into L2 before the dependency wait; bit 1: a MoE sum pulls its
/// entries after it; bit 3: the double-buffered kernels (`rows_db`) load their first step before
/// the dependency wait; bit 4: a double-buffered SwiGLU loads its up matrix's first step during
/// the gate's last arithmetic; bit 5: the product adds its rows into `out` (`Mv::accumulate`).
mod n11 {
    pub(super) const DENSE_PREFETCH: i64 = 1;
    pub(super) const MOE_PREFETCH: i64 = 2;
    pub(super) const PIPE_PRE: i64 = 8;
    pub(super) const PIPE_GLU: i64 = 16;
    pub(super) const ACCUMULATE: i64 = 32;
}

/// The n11 bits of a launch of `m` (`n11`): MoE entries always prefetched, dense block rows for
/// small launches (`policy::tc_dense_prefetch`), both pipelines on.
fn n11_bits(m: &Mv) -> i64 {
    let bytes = m.parts.rows() * m.w.row_bytes * if m.w2.is_some() { 2 } else { 1 };
    let mut bits = n11::MOE_PREFETCH | n11::PIPE_PRE | n11::PIPE_GLU;
    if policy::tc_dense_prefetch(bytes) {
        bits |= n11::DENSE_PREFETCH;
    }
    if m.accumulate {
        bits |= n11::ACCUMULATE;
    }
    bits
}

/// A prepared x: the A (or B) words of every row, then the sums of every row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TcX {
    pub xa: DevPtr,
    pub xs: DevPtr,
}

impl TcX {
    /// The planes from x row `row` on, rows of `nsb` units in format `f`'s layout.
    fn rows_from(self, f: TcFormat, row: usize, nsb: usize) -> TcX {
        TcX {
            xa: self.xa + (row * nsb * f.words * 4) as u64,
            xs: self.xs + (row * nsb * f.sums * 4) as u64,
        }
    }
}

/// The kernels that write a product's input row by row in decode (kernels-cuda/norm.cu) and can
/// prepare it on the way: the RMSNorms (the layers' input and the head's), the gated norm of the
/// delta-rule output (-> ssm_out), the gate of the attention output (-> attn_output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Producer {
    Norm = 0,
    GatedNorm = 1,
    SigmoidMul = 2,
    /// The fused SwiGLU product (its output is the down product's input; kernels-cuda/out_prep.cuh).
    Glu = 3,
}

/// Which layouts the products have read from each producer's outputs (bit `TcFormat::bit`), per
/// kind of producer rather than per tensor: a kind learns from its first output whichever buffer
/// it writes (the head's norm from the layers' norms), and a layer that reads one tensor in two
/// formats (Q4_K_M: some Q6_K projections) teaches both. A model without tensor-core products, or
/// a product that never reads a producer's output, costs the producers nothing.
#[derive(Default)]
pub(crate) struct Learned([AtomicU8; 4]);

/// A product of `ty` weights reads `x` (rows of `n_in`), on whichever path: where a producer
/// wrote `x` and the decode products of `ty` would read it prepared, that producer writes the
/// layout from now on. Called for a prompt's batched products too, so that the first decode step,
/// recorded and replayed as a CUDA graph ever after, already has every layout. (A decode step
/// without a prompt before it learns as it goes: its graph keeps the few prep launches of the
/// producer outputs that came before their first reader.)
pub(crate) fn read_by(inner: &Inner, x: &Tensor, ty: GgmlType, n_in: usize) {
    let Some(f) = TcFormat::of(ty) else { return };
    // The plain kernels' rows (a producer's output is a dense product's input).
    if !n_in.is_multiple_of(f.takes.plain.n_in_multiple) {
        return;
    }
    if let Some(who) = inner.writer_of(x) {
        inner.tc_learned.0[who as usize].fetch_or(f.bit, Ordering::Relaxed);
    }
}

/// The prepared copies a producer kernel writes of its output, claimed (`shadow.rs`) before its
/// launch and registered after it (`made`).
pub(crate) struct Preps {
    copies: [Option<(usize, TcFormat)>; 3],
}

impl Preps {
    /// Ask the kernel of producer `who` to prepare its output `out` (`rows` rows of `n`, one
    /// block per slice of 256: norm.cu `prep_slice`, out_prep.cuh `glu_out_prep`, warp w preparing
    /// layout w): in every layout the products have read from `who`'s outputs and a product could
    /// read at this `n`, each into a claimed slot named in `args`. None where it cannot (not a
    /// decode shape, rows not whole units). The caller holds the workspace lock until `made`.
    pub(crate) fn ask(
        inner: &Inner,
        who: Producer,
        out: &Tensor,
        rows: usize,
        n: usize,
        args: &mut Args,
    ) -> Result<Option<Preps>> {
        if !(1..=MATVEC_MAX_T).contains(&rows) || n == 0 || !n.is_multiple_of(SB) {
            return Ok(None);
        }
        let want = inner.tc_learned.0[who as usize].load(Ordering::Relaxed);
        let mut p = Preps { copies: [None; 3] };
        for (copy, f) in p.copies.iter_mut().zip(FORMATS) {
            if want & f.bit == 0 || !n.is_multiple_of(f.takes.unit) {
                continue;
            }
            let (slot, base) = inner.tc_slot(out, n, f)?;
            args.p[f.slot] = base;
            *copy = Some((slot, f));
        }
        Ok(Some(p))
    }

    /// The kernel is submitted: its copies of `out` are kept for the products.
    pub(crate) fn made(self, inner: &Inner, out: &Tensor) -> Result<()> {
        for &(slot, f) in self.copies.iter().flatten() {
            inner.tc_made(slot, out, f)?;
        }
        Ok(())
    }
}

/// The format whose kernels run the product `m`, if they do (`policy::mv_kernels`).
pub(crate) fn applies(m: &Mv) -> Option<TcFormat> {
    let shared_aligned = m
        .shared
        .is_none_or(|s| s.w.is_multiple_of(16) && (m.w2.is_none() || s.w2.is_multiple_of(16)));
    let shape = MvShape {
        ty: m.w.ty,
        ty2: m.w2.map(|w| w.ty),
        n_in: m.n_in,
        row_bytes: m.w.row_bytes,
        expert_bytes: m.expert_bytes,
        shared: m.shared.is_some(),
        aligned: m.w.ptr.is_multiple_of(16)
            && m.w2.is_none_or(|w| w.ptr.is_multiple_of(16))
            && m.parts.iter().all(|p| p.w.is_multiple_of(16))
            && shared_aligned,
        x_rows: x_rows(m),
        grid_y_max: GRID_YZ_MAX,
    };
    match policy::mv_kernels(&shape) {
        MvKernels::TensorCores(ty) => TcFormat::of(ty),
        MvKernels::F32 => None,
    }
}

/// Rows of x the product reads.
pub(crate) fn x_rows(m: &Mv) -> usize {
    (m.vectors * m.nsum).div_ceil(m.x_group.max(1))
}

/// Prepare `rows` rows of `n_in` f32 values at `src` into `dst` (`f.prep_bytes` of them) in
/// format `f`'s layout (one warp per 256 values). Reads nothing that an op writes later in the
/// stream than this launch: submitted without tensors.
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

/// The kernel, rows per block and threads of the product `m` (`applies(m)` gave `f`): the shape
/// its tallest product picks (`policy::tc_geometry`).
pub(crate) fn kernel_of(f: TcFormat, m: &Mv) -> TcGeometry {
    policy::tc_geometry(f.ty, m.parts.widest(), m.w2.is_some(), is_dense(m), m.shared.is_some())
}

/// No experts, one x row per output.
fn is_dense(m: &Mv) -> bool {
    m.ids == 0 && m.scales == 0 && m.nsum == 1 && m.x_group == 1
}

/// Launch the product `m` (one or a group of products: its grid spans all their rows) on its
/// prepared x (`applies(m)` gave `f`), in the kernel `kernel_of` picks.
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
    out_prep: Option<&OutPrep>,
) -> Result<()> {
    let nsb = m.n_in / SB;
    let g = kernel_of(f, m);
    let launch = ((g.kernel.prefix(), m.w.suffix), g.rows_per_block, g.threads);
    launch_chunks(inner, op, m, launch, 0, flops, reads, writes, |a, x_row0| {
        // Slots of its own (matvec_tc.cuh `mv_body`): p2 the prepared words, p6 the sums.
        let x = x.rows_from(f, x_row0, nsb);
        (a.p[2], a.p[6]) = (x.xa, x.xs);
        if let Some(o) = out_prep {
            a.n[7..=10].copy_from_slice(&o.slots);
        }
    })
}

/// Rows per block of `mvtc_mix_Q6_K_Q4_K` (R = 1 for both formats).
const MIX_ROWS: usize = 16;

/// The dense products `m` of one x whose first is the Q6_K product of weight `w6` and the others
/// Q4_K (`m.w`), in one launch (kernels-cuda/matvec_tc6.cu `mvtc_mix_Q6_K_Q4_K`): Q4_K_M's qkv or v
/// beside the layer's other projections. x prepared as `x6` (Q6_K layout) and `x4` (Q4_K).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_mixed(
    inner: &Inner,
    op: &str,
    m: &Mv,
    w6: &Weight,
    x6: TcX,
    x4: TcX,
    flops: impl Fn(usize) -> f64,
    reads: &[&Tensor],
    writes: &[&Tensor],
) -> Result<()> {
    let q6_blocks = m.parts.iter().next().map_or(0, |p| p.n_out.div_ceil(MIX_ROWS));
    let nsb = m.n_in / SB;
    let launch = (("mvtc_mix_Q6_K_Q4_K", ""), MIX_ROWS, 256);
    launch_chunks(inner, op, m, launch, 0, flops, reads, writes, |a, x_row0| {
        // The Q4_K products' x in the usual slots, the Q6_K product's at p4 / p5 (mv_body ALT).
        let (x4, x6) = (x4.rows_from(Q4K, x_row0, nsb), x6.rows_from(Q6K, x_row0, nsb));
        (a.p[2], a.p[6], a.p[4], a.p[5]) = (x4.xa, x4.xs, x6.xa, x6.xs);
        a.n[9] = q6_blocks as i64;
        a.n[10] = w6.row_bytes as i64;
    })
}

/// The x of a NORM kernel (kernels-cuda/matvec_tc.cuh mv_body NORM): `rms_norm(h; w, eps)` of the
/// residual rows at `h`, which each block computes and prepares itself, block 0 of each vector
/// writing the normed row to `out`.
#[derive(Clone, Copy)]
pub(crate) struct NormIn {
    pub h: DevPtr,
    pub w: DevPtr,
    pub out: DevPtr,
    pub eps: f32,
}

impl NormIn {
    /// Its slots (p0 h, p7 w, p3 out, f0 eps) for the launch's vectors from `row0` on.
    fn slots(&self, a: &mut Args, row0: usize, n_in: usize) {
        let off = (row0 * n_in * 4) as u64;
        (a.p[0], a.p[7], a.p[3]) = (self.h + off, self.w, self.out + off);
        a.f[0] = self.eps;
    }
}

/// Dynamic shared memory of a NORM kernel for x rows of `n_in` (matvec_tc.cuh `norm_smem`): the
/// normed row, then the Q4_K layout's words and sums.
fn norm_smem(n_in: usize) -> u32 {
    ((n_in + n_in / SB * (Q4K.words + Q4K.sums)) * 4) as u32
}

/// The dense Q4_K products `m` of x = `norm` (one launch family) in the tall kernel's NORM version
/// (`mvtc_norm_tall_Q4_K`), which `policy::Policy::normed_group` chose.
pub(crate) fn run_normed(
    inner: &Inner,
    op: &str,
    m: &Mv,
    norm: NormIn,
    flops: impl Fn(usize) -> f64,
    reads: &[&Tensor],
    writes: &[&Tensor],
) -> Result<()> {
    let g = kernel_of(Q4K, m);
    if g.kernel != TcKernel::Tall || m.w.ty != GgmlType::Q4K {
        return Err(cuda_err(format!(
            "{op}: no NORM kernel for {}{}",
            g.kernel.prefix(),
            m.w.suffix
        )));
    }
    let launch = (("mvtc_norm_tall_", m.w.suffix), g.rows_per_block, g.threads);
    launch_chunks(
        inner,
        op,
        m,
        launch,
        norm_smem(m.n_in),
        flops,
        reads,
        writes,
        |a, x_row0| norm.slots(a, x_row0, m.n_in),
    )
}

/// The launches of the tensor-core product `m` in a kernel (its name as prefix and suffix, rows per
/// block, threads; `smem` bytes of dynamic shared memory): one per chunk of output vectors
/// (`Mv::chunks`), whose slots `slots` completes from the chunk's first x row on; the n11 bits
/// from `m`.
#[allow(clippy::too_many_arguments)]
fn launch_chunks(
    inner: &Inner,
    op: &str,
    m: &Mv,
    (name, rows_per_block, threads): ((&'static str, &'static str), usize, u32),
    smem: u32,
    flops: impl Fn(usize) -> f64,
    reads: &[&Tensor],
    writes: &[&Tensor],
    slots: impl Fn(&mut Args, usize),
) -> Result<()> {
    let gx = m.grid_x(op, rows_per_block)?;
    for (mut a, nv, x_row0) in m.chunks(rows_per_block) {
        slots(&mut a, x_row0);
        a.n[11] = n11_bits(m);
        inner.kernel_rw(
            Launch {
                name,
                grid: [gx, nv as u32, 1],
                block: threads,
                smem,
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

/// The fused SwiGLU's output prepared by its own blocks (kernels-cuda/out_prep.cuh): the slots
/// n7..n10 of its launch and the copies it makes.
pub(crate) struct OutPrep {
    slots: [i64; 4],
    /// The copies of an output tensor (a dense SwiGLU's), kept for the products; none for a
    /// workspace the caller hands on itself (the MoE hidden rows).
    preps: Option<Preps>,
}

impl OutPrep {
    /// Ask the fused SwiGLU product `m` (a dense decode product on one launch) to prepare its
    /// output `out` in every layout the products have read from SwiGLU outputs. None where it
    /// cannot: rows not whole slices of 256, too many slices for the counters, or nothing learned.
    /// The caller holds the workspace lock until `made`.
    pub(crate) fn ask(inner: &Inner, m: &Mv, out: &Tensor, rows_per_block: usize) -> Result<Option<OutPrep>> {
        if m.ids != 0 || m.shared.is_some() || !Self::fits(m, rows_per_block, SB) {
            return Ok(None);
        }
        let mut a = Args::default();
        let Some(preps) = Preps::ask(inner, Producer::Glu, out, m.vectors, m.parts.rows(), &mut a)? else {
            return Ok(None);
        };
        if preps.copies.iter().all(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(OutPrep {
            slots: [
                a.p[7] as i64,
                a.p[5] as i64,
                a.p[4] as i64,
                inner.sync_counters() as i64,
            ],
            preps: Some(preps),
        }))
    }

    /// The SwiGLU product `m` of a MoE layer's entries prepares its hidden rows (`rows` of `n`) in
    /// format `f`'s layout at `dst` (`f.prep_bytes(rows, n)`), which the down product then reads
    /// (`f.planes(dst, rows, n)`). None where it cannot (as `ask`).
    pub(crate) fn into_buffer(
        inner: &Inner,
        m: &Mv,
        f: TcFormat,
        dst: DevPtr,
        rows_per_block: usize,
    ) -> Option<OutPrep> {
        if !Self::fits(m, rows_per_block, f.takes.unit) {
            return None;
        }
        let mut slots = [0, 0, 0, inner.sync_counters() as i64];
        // The layout's slot (norm.cu's p7 / p5 / p4 order: Q4_K, Q8_0, Q6_K).
        let i = match f.slot {
            7 => 0,
            5 => 1,
            _ => 2,
        };
        slots[i] = dst as i64;
        Some(OutPrep { slots, preps: None })
    }

    /// Whether the SwiGLU product `m` (one launch, `rows_per_block` rows per tile) can prepare its
    /// output rows, whole units of `unit` (a multiple of 256): each tile in one slice, a counter
    /// per (vector, slice).
    fn fits(m: &Mv, rows_per_block: usize, unit: usize) -> bool {
        let n = m.parts.rows();
        m.w2.is_some()
            && m.parts.len() == 1
            && n.is_multiple_of(SB)
            && n.is_multiple_of(unit)
            && SB.is_multiple_of(rows_per_block)
            && m.vectors <= GRID_YZ_MAX
            && m.vectors * (n / SB) <= SYNC_COUNTERS
    }

    /// The product is submitted: its copies of `out` are kept for the down product.
    pub(crate) fn made(self, inner: &Inner, out: &Tensor) -> Result<()> {
        match self.preps {
            Some(p) => p.made(inner, out),
            None => Ok(()),
        }
    }
}
