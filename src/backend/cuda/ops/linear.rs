//! Products with weight matrices in their GGUF block formats: `embed` (kernels-cuda/embed.cu),
//! `matmul` and `matmul_swiglu` (matvec.cu, matvec_glu.cu for a few tokens, matmul_tiled.cu for
//! a batch), and the MoE expert products (matvec kernels with expert indirection).
//!
//! `matmul_dispatch` is the one place that picks the kernel for a batch of T tokens: under
//! `Precision::Fast` a batch runs on the tensor cores (`gemm.rs`) when the weight's format allows,
//! and the MoE experts of a batch are grouped by expert (`moe.rs`).

use super::gemm::{self, GemmW};
use super::matvec_tc;
use super::mv::{weight, Mv, MvShared, Part, Parts, Weight};
use super::{grid_u32, Launch, GRID_YZ_MAX};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::{cuda_err, DevPtr};
use crate::backend::cuda::op::{Args, MV_SEGS};
use crate::backend::cuda::policy::{self, MixedLaunch, NormedGroup, SharedExpert, SharedExpertShape, MATVEC_MAX_T};
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, AddNorm, Group, MoeExperts, Tensor};
use crate::error::Result;
use crate::gguf::GgmlType;

/// Products with at most this many outputs per token use the matrix-vector kernels at any batch
/// size (exact f32): their weights are a few hundred KB, read from L2 once per token, while a
/// tiled or tensor-core product of them is one or two nearly empty tiles split over K (plus a
/// split-K reduce launch): the GDN alpha and beta projections (32 outputs per layer).
const MATVEC_MAX_N_OUT: usize = 64;

/// Threads per matvec block and the rows-per-thread limits (kernels-cuda/matvec.cuh).
const MV_THREADS: usize = 256;
const MV_RPT_MAX: usize = 8;
const MV_RPT_MAX_GLU: usize = 4;
/// Shared-memory floats per 32-element unit of activations (32 + padding).
const MV_XPAD: usize = 36;

impl Weight {
    /// This weight as a tensor-core operand for rows of `n_in`, when a batch of `t` rows takes
    /// that path (`gemm::fast_batch`) and the kernels decode its format.
    pub(crate) fn gemm(&self, inner: &Inner, t: usize, n_in: usize) -> Option<GemmW> {
        if !gemm::fast_batch(inner, t) {
            return None;
        }
        GemmW::new(self.ptr, self.row_bytes, self.ty, n_in, self.phase)
    }
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

/// Products with at least this many output rows in all count as tall (`mv_plan`).
const MV_TALL_ROWS: usize = 65536;

/// Plan the f32 matvec `m`: rows of `n_in`, `nsum` activation vectors per block. The unit lanes
/// (which fix each row's order of summation) follow the tallest product alone, so a product in a
/// group gets the bits it gets launched alone; the rows per thread (which only decide which rows
/// a thread takes) follow all the products' rows.
fn mv_plan(inner: &Inner, m: &Mv) -> MvPlan {
    let (n_in, nsum, glu) = (m.n_in, m.nsum, m.w2.is_some());
    let rows = m.parts.rows() * m.vectors;
    let units = n_in.div_ceil(32).max(1);
    // Very tall products (the LM head: 248K rows) have rows to spare for every SM many times
    // over: 64 unit lanes and more rows per block keep more loads in flight per thread
    // (dev/cuda/matvec_bench.cu on the H200, 4096-wide rows: Q6_K 556 -> 481 us, Q8_0 434 -> 399 us).
    let tall = m.parts.widest() * m.vectors >= MV_TALL_ROWS && units.is_multiple_of(64);
    let ut = if tall { 64 } else { unit_lanes(units) };
    let rg = MV_THREADS / ut;
    let rpt_max = if glu { MV_RPT_MAX_GLU } else { MV_RPT_MAX };
    // About two blocks per SM for the whole product, as many rows per thread as that allows:
    // each thread then loads its activations once for several rows.
    let target_blocks = 2 * inner.sms();
    let rpt = rows.div_ceil(rg * target_blocks).clamp(1, rpt_max);
    let smem = nsum * units * MV_XPAD * 4;
    let x_in_smem = smem <= inner.kernels.matvec_smem_limit() as usize;
    MvPlan {
        ut,
        rpt,
        x_in_smem,
        smem: if x_in_smem { smem as u32 } else { 0 },
    }
}

/// The kernels that run a matvec: the tensor-core ones of a format (`matvec_tc.rs`) or the f32
/// ones.
enum MvPath {
    Tc(matvec_tc::TcFormat),
    F32,
}

/// Whether the plain kernels of `path` for weights of `ty` take several products per launch: the
/// segments they read (kernels-cuda/matvec.cuh `MvSegs`, the `SEGS` of matvec_tc*.cuh's format
/// policies; the fused SwiGLU and expert products always run one).
fn takes_group(path: &MvPath, ty: GgmlType) -> bool {
    match path {
        MvPath::Tc(f) => f.takes.groups,
        MvPath::F32 => !matches!(ty, GgmlType::F16 | GgmlType::Bf16),
    }
}

fn mv_path(m: &Mv) -> MvPath {
    match matvec_tc::applies(m) {
        Some(f) => MvPath::Tc(f),
        None => MvPath::F32,
    }
}

/// `reads` / `writes`: the tensors the product reads and writes (`Inner::submit_rw`).
fn run_mv(inner: &Inner, op: &str, m: &Mv, reads: &[&Tensor], writes: &[&Tensor]) -> Result<()> {
    run_mv_with(inner, op, m, reads, writes, None, None)
}

/// `run_mv`, on the tensor-core path with x already prepared (`ready`) and/or the output
/// prepared by the product itself into a buffer the caller hands on (`out_prep`).
fn run_mv_with(
    inner: &Inner,
    op: &str,
    m: &Mv,
    reads: &[&Tensor],
    writes: &[&Tensor],
    ready: Option<matvec_tc::TcX>,
    out_prep: Option<matvec_tc::OutPrep>,
) -> Result<()> {
    if m.vectors == 0 || m.parts.rows() == 0 {
        return Ok(());
    }
    let glu = m.w2.is_some();
    let path = mv_path(m);
    if m.accumulate && (glu || !matches!(path, MvPath::Tc(_))) {
        // Only the tensor-core kernels' plain epilogue adds into its output.
        return Err(cuda_err(format!("{op}: no {} kernel adds into its output", m.w.suffix)));
    }
    if m.parts.len() > 1 && (glu || m.ids != 0 || m.shared.is_some() || !takes_group(&path, m.w.ty)) {
        // The kernel would read the first product's table entry only.
        return Err(cuda_err(format!(
            "{op}: the {} kernels run one product per launch",
            m.w.suffix
        )));
    }
    let (plan, prefix) = match path {
        MvPath::Tc(f) => {
            // The prepared x is a workspace: held until the product is submitted.
            let ws = inner.workspaces()?;
            let x = match (ready, m.x_t) {
                (Some(x), _) => x,
                (None, Some(t)) => inner.tc_x_of(t, m.n_in, f)?,
                (None, None) => {
                    let rows = matvec_tc::x_rows(m);
                    let dst = ws.get("mvtc x", f.prep_bytes(rows, m.n_in))?;
                    matvec_tc::prep(inner, f, m.x, rows, m.n_in, dst)?
                }
            };
            // The fused SwiGLU prepares its output for the down product itself.
            let out_prep = match (out_prep, glu, writes) {
                (Some(p), ..) => Some(p),
                (None, true, [out]) => {
                    matvec_tc::OutPrep::ask(inner, m, out, matvec_tc::kernel_of(f, m).rows_per_block)?
                }
                _ => None,
            };
            matvec_tc::run(
                inner,
                op,
                f,
                m,
                x,
                |nv| mv_flops(m, nv),
                reads,
                writes,
                out_prep.as_ref(),
            )?;
            // (A MoE layer's hidden rows are a workspace: nothing to keep.)
            if let (Some(p), [out]) = (out_prep, writes) {
                p.made(inner, out)?;
            }
            if let (true, 0, None, [out]) = (glu, m.ids, &m.shared, writes) {
                inner.produced_by(out, matvec_tc::Producer::Glu)?;
            }
            return Ok(());
        }
        MvPath::F32 => (
            mv_plan(inner, m),
            match (glu, m.shared.is_some()) {
                (false, false) => "matvec_",
                (true, false) => "matvec_glu_",
                (false, true) => "matvec_sh_",
                (true, true) => "matvec_glu_sh_",
            },
        ),
    };
    let rows_per_block = plan.rows_per_block();
    let gx = m.grid_x(op, rows_per_block)?;
    for (mut a, nv, x_row0) in m.chunks(rows_per_block) {
        a.p[2] = m.x + 4 * (x_row0 * m.n_in) as u64;
        a.n[7] = plan.ut as i64;
        a.n[8] = plan.rpt as i64;
        a.n[9] = i64::from(plan.x_in_smem);
        a.n[11] = m.n_in as i64;
        inner.kernel_rw(
            Launch {
                name: (prefix, m.w.suffix),
                grid: [gx, nv as u32, 1],
                block: MV_THREADS as u32,
                smem: plan.smem,
                args: a,
                phase: m.w.phase,
            },
            mv_flops(m, nv),
            reads,
            writes,
        )?;
    }
    Ok(())
}

// ---- matmul -------------------------------------------------------------------------------------

/// Floating-point operations of the `nv` output vectors of a matvec launch (2 per multiply-add;
/// a fused SwiGLU does two products).
fn mv_flops(m: &Mv, nv: usize) -> f64 {
    let products = if m.w2.is_some() { 2.0 } else { 1.0 };
    products * 2.0 * (nv * m.nsum) as f64 * m.parts.rows() as f64 * m.n_in as f64
}

pub(crate) fn matmul(inner: &Inner, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
    let op = "matmul";
    let d = check::matmul(w, x, out)?;
    let wt = weight(op, w, d.n_out, d.n_in)?;
    matvec_tc::read_by(inner, x, wt.ty, d.n_in);
    let op_ = ptr(out, op)?;
    if let Some(g) = (d.n_out > MATVEC_MAX_N_OUT)
        .then(|| wt.gemm(inner, d.t, d.n_in))
        .flatten()
    {
        // The f16 copy of x and any split-K partials are workspaces: held until submitted.
        let _ws = inner.workspaces()?;
        let x16 = inner.f16_of(x, g.fmt.split())?;
        return gemm::dense(inner, &g, x16, op_, d.t, d.n_out, d.n_in, &[w], &[out]);
    }
    matmul_dispatch(inner, &wt, x, op_, d, &[w, x], &[out])
}

/// What fixes the bits of a product's rows: its kernel and shape (`kernel_key`).
type KernelKey = (&'static str, usize);

/// What fixes the bits of a product's rows in the kernels of `path` (the kernel and its shape:
/// the tensor-core kernels' K split differs between shapes, the f32 ones' unit lanes), for
/// the product `m` launched alone. Products that agree on it (and on format and phase) share a
/// launch and get exactly what they would get alone; the rows per thread only decide which rows a
/// thread takes.
fn kernel_key(inner: &Inner, path: &MvPath, m: &Mv) -> KernelKey {
    match path {
        MvPath::Tc(f) => {
            let g = matvec_tc::kernel_of(*f, m);
            (g.kernel.prefix(), g.rows_per_block)
        }
        MvPath::F32 => ("matvec_", mv_plan(inner, m).ut),
    }
}

/// `outs[i] = x · ws[i]ᵀ` for the products of one x (a layer's projections). On the decode path
/// (every product a matvec) the products of one format that count in the same profile phase go
/// out as one launch (tensor-core ones whatever their shapes, in the kernel the tallest picks;
/// the others when they run the same kernel in the same shape, `kernel_key`, the same numbers bit
/// for bit), its grid over all their rows (the segment table, kernels-cuda/common.cuh): one
/// launch ramp and tail instead of one per product (where the kernels take groups: `takes_group`;
/// `policy::Policy::group_launch`).
/// A tensor-core launch reads x in the prepared layout its producer wrote or, failing that, one
/// prep per format (`Inner::tc_x_of` keeps the copy for the next launch of the format).
/// Batches take other kernels per product (as `matmul`).
pub(crate) fn matmul_group(inner: &Inner, ws: &[&Tensor], x: &Tensor, outs: &[&Tensor]) -> Result<()> {
    let op = "matmul_group";
    let dims = check::matmul_group(ws, x, outs)?;
    // Every pair reads the same x: one T and n_in.
    let (t, n_in) = (dims[0].t, dims[0].n_in);
    if inner.policy.group_launch(t, n_in) == policy::GroupLaunch::PerProduct {
        return ws.iter().zip(outs).try_for_each(|(w, out)| matmul(inner, w, x, out));
    }
    let weights = ws
        .iter()
        .zip(&dims)
        .map(|(w, d)| weight(op, w, d.n_out, n_in))
        .collect::<Result<Vec<_>>>()?;
    for w in &weights {
        // As `matmul`: the producer of x learns the layouts its readers take.
        matvec_tc::read_by(inner, x, w.ty, n_in);
    }
    let outp = outs.iter().map(|o| ptr(o, op)).collect::<Result<Vec<_>>>()?;
    let mut families = launch_families(inner, &weights, x, &outp, &dims)?;
    // Q4_K_M: a layer's one Q6_K projection joins the Q4_K ones of its input in their launch.
    if let Some((six, four)) = mixed_families(inner, &families, &weights, x, &outp, &dims)? {
        let (m, members) = mixed_mv(&families, six, four, &weights, x, &outp, &dims)?;
        let reads: Vec<&Tensor> = members.iter().map(|&i| ws[i]).chain([x]).collect();
        let writes: Vec<&Tensor> = members.iter().map(|&i| outs[i]).collect();
        let tc = |ty| matvec_tc::TcFormat::of(ty).ok_or_else(|| cuda_err(format!("{op}: no {ty} kernels")));
        // The prepared copies are workspaces (or the producer's): held until submitted.
        let _ws = inner.workspaces()?;
        let x6 = inner.tc_x_of(x, n_in, tc(GgmlType::Q6K)?)?;
        let x4 = inner.tc_x_of(x, n_in, tc(GgmlType::Q4K)?)?;
        let flops = |nv| mv_flops(&m, nv);
        matvec_tc::run_mixed(inner, op, &m, &weights[members[0]], x6, x4, flops, &reads, &writes)?;
        for f in [six.max(four), six.min(four)] {
            families.remove(f);
        }
    }
    for (_, members) in &families {
        let m = family_mv(members, &weights, x, &outp, &dims)?;
        let reads: Vec<&Tensor> = members.iter().map(|&i| ws[i]).chain([x]).collect();
        let writes: Vec<&Tensor> = members.iter().map(|&i| outs[i]).collect();
        run_mv(inner, op, &m, &reads, &writes)?;
    }
    Ok(())
}

/// The launches of a decode `matmul_group`, in the group's order: (kernel key of the first member,
/// members). Products that agree on the key, format and phase share a launch (`MV_SEGS` at most).
fn launch_families(
    inner: &Inner,
    weights: &[Weight],
    x: &Tensor,
    outp: &[DevPtr],
    dims: &[check::MatmulDims],
) -> Result<Vec<(Option<KernelKey>, Vec<usize>)>> {
    let mut families: Vec<(Option<KernelKey>, Vec<usize>)> = Vec::new();
    for (i, d) in dims.iter().enumerate().filter(|(_, d)| d.n_out > 0) {
        let solo = Mv::dense(&weights[i], None, x, outp[i], *d)?;
        let path = mv_path(&solo);
        // None: a kernel that takes one product per launch.
        let key = takes_group(&path, weights[i].ty).then(|| match path {
            // One launch per format: the kernel is the tallest member's (`matvec_tc::kernel_of`).
            MvPath::Tc(_) => ("mvtc", 0),
            _ => kernel_key(inner, &path, &solo),
        });
        let joins = key.and_then(|_| {
            families.iter().position(|(k, members)| {
                let j = members[0];
                *k == key
                    && members.len() < MV_SEGS
                    && weights[j].ty == weights[i].ty
                    && weights[j].phase == weights[i].phase
            })
        });
        match joins {
            Some(f) => families[f].1.push(i),
            None => families.push((key, vec![i])),
        }
    }
    Ok(families)
}

/// The products `members` of a group (one launch family) as one `Mv`, a segment each.
fn family_mv<'a>(
    members: &[usize],
    weights: &'a [Weight],
    x: &'a Tensor,
    outp: &[DevPtr],
    dims: &[check::MatmulDims],
) -> Result<Mv<'a>> {
    let first = members[0];
    let mut m = Mv::dense(&weights[first], None, x, outp[first], dims[first])?;
    m.parts = Parts::of(members.iter().map(|&i| Part {
        w: weights[i].ptr,
        out: outp[i],
        n_out: dims[i].n_out,
    }))?;
    Ok(m)
}

/// The mixed launch of families `six` (one Q6_K product) and `four` (Q4_K, `mixed_families`):
/// the Q6_K product first (the kernel's segment 0), then the Q4_K family; its `Mv` (the Q4_K
/// format's) and members.
fn mixed_mv<'a>(
    families: &[(Option<KernelKey>, Vec<usize>)],
    six: usize,
    four: usize,
    weights: &'a [Weight],
    x: &'a Tensor,
    outp: &[DevPtr],
    dims: &[check::MatmulDims],
) -> Result<(Mv<'a>, Vec<usize>)> {
    let members: Vec<usize> = std::iter::once(families[six].1[0])
        .chain(families[four].1.iter().copied())
        .collect();
    let mut m = family_mv(&members, weights, x, outp, dims)?;
    // The launch's format is the Q4_K family's (its kernel suffix, phase and row bytes).
    m.w = &weights[members[1]];
    Ok((m, members))
}

/// `next.then`'s products of the normed rows `next.out`: their weights, outputs and dims, and the
/// members of their one tensor-core launch family where they form one (decode rows only).
struct NormedFamily {
    weights: Vec<Weight>,
    outp: Vec<DevPtr>,
    dims: Vec<check::MatmulDims>,
    members: Option<Vec<usize>>,
}

fn normed_family(inner: &Inner, next: AddNorm<'_>, g: Group<'_>) -> Result<NormedFamily> {
    let op = "matmul_group";
    let x = next.out;
    let dims = check::matmul_group(g.ws, x, g.outs)?;
    let (t, n_in) = (dims[0].t, dims[0].n_in);
    let weights =
        g.ws.iter()
            .zip(&dims)
            .map(|(w, d)| weight(op, w, d.n_out, n_in))
            .collect::<Result<Vec<_>>>()?;
    let outp = g.outs.iter().map(|o| ptr(o, op)).collect::<Result<Vec<_>>>()?;
    let mut members = None;
    if policy::decode_rows(t) && n_in > 0 {
        let families = launch_families(inner, &weights, x, &outp, &dims)?;
        if let [(Some(("mvtc", 0)), family)] = families.as_slice() {
            let m = family_mv(family, &weights, x, &outp, &dims)?;
            if matches!(mv_path(&m), MvPath::Tc(_)) {
                members = Some(family.clone());
            }
        }
    }
    Ok(NormedFamily {
        weights,
        outp,
        dims,
        members,
    })
}

/// Whether `next.then`'s products take the norm of `next` as their launch's prologue
/// (`policy::Policy::normed_group`). The caller has checked the operands
/// (`check::add_norm_after`).
pub(crate) fn normed_group_choice(inner: &Inner, next: AddNorm<'_>, g: Group<'_>) -> Result<NormedGroup> {
    let f = normed_family(inner, next, g)?;
    let products: Vec<(GgmlType, usize)> = f.weights.iter().zip(&f.dims).map(|(w, d)| (w.ty, d.n_out)).collect();
    Ok(inner.policy.normed_group(&policy::GroupShape {
        t: f.dims[0].t,
        n_in: f.dims[0].n_in,
        products: &products,
        one_tc_launch: f.members.is_some(),
    }))
}

/// `next.then`'s products of the normed rows `next.out` in one tensor-core launch whose blocks each
/// norm the residual row `next.acc` themselves (kernels-cuda/matvec_tc.cuh mv_body NORM; block 0
/// of each vector writes `next.out`): no norm launch between a block's last product and the next
/// block's first ones. For the groups `normed_group_choice` gives `NormedGroup::Prologue`.
pub(crate) fn normed_group(inner: &Inner, next: AddNorm<'_>, g: Group<'_>) -> Result<()> {
    let op = "matmul_group";
    let x = next.out;
    let f = normed_family(inner, next, g)?;
    let Some(members) = &f.members else {
        return Err(cuda_err(format!("{op}: the products are not one tensor-core launch")));
    };
    let m = family_mv(members, &f.weights, x, &f.outp, &f.dims)?;
    let norm = matvec_tc::NormIn {
        h: ptr(next.acc, op)?,
        w: ptr(next.w, op)?,
        out: ptr(x, op)?,
        eps: next.eps,
    };
    let mut reads: Vec<&Tensor> = g.ws.to_vec();
    reads.extend([next.acc, next.w]);
    let mut writes: Vec<&Tensor> = g.outs.to_vec();
    writes.push(x);
    matvec_tc::run_normed(inner, op, &m, norm, |nv| mv_flops(&m, nv), &reads, &writes)
}

/// Whether `acc += x · Wᵀ` runs on the tensor-core kernels, whose plain epilogue adds their rows
/// into `acc` (`Mv::accumulate`): a decode batch whose product they take. The caller has checked
/// the operands (`check::matmul(w, x, acc)`'s rules).
pub(crate) fn accumulates_on_tc(w: &Tensor, x: &Tensor, acc: &Tensor) -> Result<bool> {
    let op = "matmul_add_rms_norm";
    let d = check::matmul(w, x, acc)?;
    if !policy::decode_rows(d.t) || d.n_in == 0 || d.n_out == 0 {
        return Ok(false);
    }
    let wt = weight(op, w, d.n_out, d.n_in)?;
    let m = Mv::dense(&wt, None, x, ptr(acc, op)?, d)?;
    Ok(matches!(mv_path(&m), MvPath::Tc(_)))
}

/// `acc += x · Wᵀ` on the tensor-core kernels (`accumulates_on_tc`; an error where they do not
/// take the product).
pub(crate) fn matmul_accumulate(inner: &Inner, w: &Tensor, x: &Tensor, acc: &Tensor) -> Result<()> {
    let op = "matmul_add_rms_norm";
    let d = check::matmul(w, x, acc)?;
    let wt = weight(op, w, d.n_out, d.n_in)?;
    let mut m = Mv::dense(&wt, None, x, ptr(acc, op)?, d)?;
    m.accumulate = true;
    // As `matmul`: the producer of x learns the layouts its readers take.
    matvec_tc::read_by(inner, x, wt.ty, d.n_in);
    run_mv(inner, op, &m, &[w, x, acc], &[acc])
}

/// Launch families of a decode `matmul_group` that can share one launch of
/// `mvtc_mix_Q6_K_Q4_K` (Q4_K_M: a layer's one Q6_K projection beside its Q4_K ones): a family of
/// one Q6_K product on the tensor cores and a tensor-core Q4_K family of the same profile phase
/// with room for one more product. Their indices in `families`.
fn mixed_families(
    inner: &Inner,
    families: &[(Option<KernelKey>, Vec<usize>)],
    weights: &[Weight],
    x: &Tensor,
    outp: &[DevPtr],
    dims: &[check::MatmulDims],
) -> Result<Option<(usize, usize)>> {
    let tc = |i: usize| -> Result<bool> {
        let solo = Mv::dense(&weights[i], None, x, outp[i], dims[i])?;
        Ok(matches!(mv_path(&solo), MvPath::Tc(_)))
    };
    let Some(six) = families
        .iter()
        .position(|(_, m)| m.len() == 1 && weights[m[0]].ty == GgmlType::Q6K)
    else {
        return Ok(None);
    };
    let i6 = families[six].1[0];
    let four = families.iter().position(|(k, m)| {
        *k == Some(("mvtc", 0))
            && weights[m[0]].ty == GgmlType::Q4K
            && weights[m[0]].phase == weights[i6].phase
            && m.len() < MV_SEGS
    });
    let four_on_tc = match four {
        Some(f) => tc(families[f].1[0])?,
        None => false,
    };
    match (inner.policy.mixed_launch(tc(i6)?, four_on_tc), four) {
        (MixedLaunch::Mixed, Some(f)) => Ok(Some((six, f))),
        _ => Ok(None),
    }
}

/// The exact kernel for `out [T, n_out] = x [T, n_in] · Wᵀ` by batch size.
fn matmul_dispatch(
    inner: &Inner,
    w: &Weight,
    x: &Tensor,
    out: DevPtr,
    d: check::MatmulDims,
    reads: &[&Tensor],
    writes: &[&Tensor],
) -> Result<()> {
    let op = "matmul";
    if d.t == 0 || d.n_out == 0 {
        return Ok(());
    }
    if d.n_in == 0 {
        // An empty sum: zeros (the kernels never run a unit).
        return inner.submit_rw(
            crate::backend::cuda::op::Op::Memset {
                dst: out,
                bytes: d.t * d.n_out * 4,
            },
            reads,
            writes,
        );
    }
    if d.t <= MATVEC_MAX_T || d.n_out <= MATVEC_MAX_N_OUT {
        return run_mv(inner, op, &Mv::dense(w, None, x, out, d)?, reads, writes);
    }
    let x = ptr(x, op)?;
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
        inner.kernel_rw(
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
            2.0 * n as f64 * d.n_out as f64 * d.n_in as f64,
            reads,
            writes,
        )?;
    }
    Ok(())
}

/// `out = silu(W_gate x) * (W_up x)`: one pass over both weights for a few tokens when they share
/// a format; on the tensor cores, the two products then one kernel that writes `out` and its f16
/// copy (the down projection's input); else the two products and `swiglu`.
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
    let (g, u) = (weight(op, w_gate, d.n_out, d.n_in)?, weight(op, w_up, d.n_out, d.n_in)?);
    matvec_tc::read_by(inner, x, g.ty, d.n_in);
    matvec_tc::read_by(inner, x, u.ty, d.n_in);
    if d.t <= MATVEC_MAX_T && w_gate.dtype == w_up.dtype && d.n_in > 0 {
        let m = Mv::dense(&g, Some(&u), x, ptr(out, op)?, d)?;
        return run_mv(inner, op, &m, &[w_gate, w_up, x], &[out]);
    }
    if let (Some(gg), Some(ug)) = (g.gemm(inner, d.t, d.n_in), u.gemm(inner, d.t, d.n_in)) {
        let _ws = inner.workspaces()?;
        let split = gg.fmt.split() || ug.fmt.split();
        let x16 = inner.f16_of(x, split)?;
        let (gp, up, outp) = (ptr(gate_tmp, op)?, ptr(up_tmp, op)?, ptr(out, op)?);
        gemm::dense(inner, &gg, x16, gp, d.t, d.n_out, d.n_in, &[w_gate], &[gate_tmp])?;
        gemm::dense(inner, &ug, x16, up, d.t, d.n_out, d.n_in, &[w_up], &[up_tmp])?;
        // The down projection's input. Its weight is not known here: the lo plane is written
        // when gate/up are of a split format (a model file gives an FFN's three weights one
        // format), and otherwise made from `out` by `f16_of` if a split-format product reads it.
        let (slot, h) = inner.shadow_slot(out, split)?;
        gemm::swiglu_f16(inner, gp, up, h, outp, d.t * d.n_out, g.phase, &[out])?;
        inner.shadow_made(slot, out, split)?;
        // The down product teaches the decode shape's SwiGLU its layouts (from a prompt).
        return inner.produced_by(out, matvec_tc::Producer::Glu);
    }
    matmul(inner, w_gate, x, gate_tmp)?;
    matmul(inner, w_up, x, up_tmp)?;
    super::eltwise::swiglu(inner, gate_tmp, up_tmp, out)?;
    inner.produced_by(out, matvec_tc::Producer::Glu)
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
    if k == 0 || d == 0 || f == 0 {
        return inner.submit(
            crate::backend::cuda::op::Op::Memset {
                dst: ptr(out, op)?,
                bytes: t * d * 4,
            },
            &[out],
        );
    }
    let g = weight(op, gate_exps, e * f, d)?;
    let u = weight(op, up_exps, e * f, d)?;
    let dn = weight(op, down_exps, e * d, f)?;
    matvec_tc::read_by(inner, x, g.ty, d);
    matvec_tc::read_by(inner, x, u.ty, d);
    if let (Some(gg), Some(ug), Some(dg)) = (g.gemm(inner, t, d), u.gemm(inner, t, d), dn.gemm(inner, t, f)) {
        if super::moe::groups_fit(&m) {
            let _ws = inner.workspaces()?;
            return super::moe::grouped_experts(inner, &gg, &ug, &dg, m, x, ids, weights, out);
        }
    }
    let reads = [x, gate_exps, up_exps, down_exps, ids, weights];
    experts_mv(inner, op, m, x, [&g, &u, &dn], ids, weights, None, &reads, out, false)
}

/// The shared expert of `moe_experts_shared` on the matrix-vector path: its weights (the routed
/// experts' formats) and gate logits.
struct SharedMv {
    gate: Weight,
    up: Weight,
    down: Weight,
    gate_logits: DevPtr,
}

/// The shapes of `moe_experts_shared` as `policy::Policy::shared_expert` reads them.
fn shared_expert_shape(x: &Tensor, ex: MoeExperts<'_>, out: &Tensor) -> Result<(check::MoeDims, SharedExpertShape)> {
    let (m, n_ff_shared) = check::moe_experts_shared(x, ex, out)?;
    let sh = ex.sh;
    let shape = SharedExpertShape {
        t: m.t,
        k: m.k,
        d: m.d,
        n_ff: m.n_ff,
        n_ff_shared,
        formats_match: (sh.gate.dtype, sh.up.dtype, sh.down.dtype)
            == (ex.gate_exps.dtype, ex.up_exps.dtype, ex.down_exps.dtype),
    };
    Ok((m, shape))
}

/// Where `moe_experts_shared` runs the shared expert (`policy::Policy::shared_expert`).
pub(crate) fn shared_expert_choice(
    inner: &Inner,
    x: &Tensor,
    ex: MoeExperts<'_>,
    out: &Tensor,
) -> Result<SharedExpert> {
    Ok(inner.policy.shared_expert(&shared_expert_shape(x, ex, out)?.1))
}

/// The routed experts' weights and the shared expert of `moe_experts_shared`, for rows of `d`
/// and hidden rows of `f`.
fn shared_weights(op: &str, ex: MoeExperts<'_>, m: check::MoeDims) -> Result<([Weight; 3], SharedMv)> {
    let (d, e, f) = (m.d, m.n_exp, m.n_ff);
    let sh = ex.sh;
    let routed = [
        weight(op, ex.gate_exps, e * f, d)?,
        weight(op, ex.up_exps, e * f, d)?,
        weight(op, ex.down_exps, e * d, f)?,
    ];
    let shared = SharedMv {
        gate: weight(op, sh.gate, f, d)?,
        up: weight(op, sh.up, f, d)?,
        down: weight(op, sh.down, d, f)?,
        gate_logits: ptr(sh.gate_logit, op)?,
    };
    Ok((routed, shared))
}

/// Whether the down product of `moe_experts_shared` (shared expert inside) runs on the tensor
/// cores, whose epilogue can add it into the residual (`accumulate`).
pub(crate) fn shared_down_on_tc(x: &Tensor, ex: MoeExperts<'_>, out: &Tensor) -> Result<bool> {
    let op = "moe_experts_shared";
    let (m, shape) = shared_expert_shape(x, ex, out)?;
    if !policy::decode_rows(m.t) || shape.n_ff == 0 || shape.d == 0 || shape.k == 0 {
        return Ok(false);
    }
    let ([_, _, dn], shared) = shared_weights(op, ex, m)?;
    let down = down_mv(
        m,
        &dn,
        Some(&shared),
        0,
        ptr(ex.ids, op)?,
        ptr(ex.weights, op)?,
        ptr(out, op)?,
        true,
    );
    Ok(matches!(mv_path(&down), MvPath::Tc(_)))
}

/// `moe_experts_shared` with the shared expert as one more expert per token, entry k of each
/// token's k + 1, inside the experts' launches (its gate/up rows among the routed experts', its
/// down product in each token's sum, scaled in-kernel by `sigmoid(gate logit)`): no launches of
/// its own. For the shapes `shared_expert_choice` gives `SharedExpert::InExpertLaunches`.
/// `accumulate`: add the result into `out` (the residual add of `moe_route_experts_shared`'s
/// `next`), where `shared_down_on_tc` says the down product can.
pub(crate) fn moe_experts_shared(
    inner: &Inner,
    x: &Tensor,
    ex: MoeExperts<'_>,
    out: &Tensor,
    accumulate: bool,
) -> Result<()> {
    let op = "moe_experts_shared";
    let (m, shape) = shared_expert_shape(x, ex, out)?;
    if inner.policy.with_fusion().shared_expert(&shape) != SharedExpert::InExpertLaunches {
        return Err(cuda_err(format!(
            "{op}: the shared expert does not fit the experts' launches"
        )));
    }
    let ([g, u, dn], shared) = shared_weights(op, ex, m)?;
    // As `moe_experts`: the producer of x learns the layouts its readers take.
    matvec_tc::read_by(inner, x, g.ty, m.d);
    matvec_tc::read_by(inner, x, u.ty, m.d);
    let mut reads = vec![x];
    reads.extend(ex.reads());
    experts_mv(
        inner,
        op,
        m,
        x,
        [&g, &u, &dn],
        ex.ids,
        ex.weights,
        Some(&shared),
        &reads,
        out,
        accumulate,
    )
}

/// The down product of the experts: out[t] = sum_j weights[t*k + j] * down_{ids[t*k + j]}
/// h[t*per_token + j] (+ the shared expert's sigmoid(gate logit[t]) * down_sh h[t*per_token + k]).
#[allow(clippy::too_many_arguments)]
fn down_mv<'a>(
    m: check::MoeDims,
    dn: &'a Weight,
    sh: Option<&SharedMv>,
    h: DevPtr,
    idp: DevPtr,
    wp: DevPtr,
    outp: DevPtr,
    accumulate: bool,
) -> Mv<'a> {
    let (t, d, e, f) = (m.t, m.d, m.n_exp, m.n_ff);
    Mv {
        w: dn,
        w2: None,
        x: h,
        x_t: None,
        parts: Parts::one(dn.ptr, outp, d),
        ids: idp,
        scales: wp,
        n_in: f,
        expert_bytes: d * dn.row_bytes,
        n_experts: e,
        x_group: 1,
        nsum: m.k + usize::from(sh.is_some()),
        vectors: t,
        shared: sh.map(|s| MvShared {
            w: s.down.ptr,
            w2: 0,
            gate_logits: s.gate_logits,
        }),
        accumulate,
    }
}

/// The expert products of a few tokens on the matrix-vector kernels: hidden rows
/// h[b] = silu(gate_e x) * up_e x of every (token, expert) entry b, then
/// out[t] = sum of token t's entries' weight * down_e h[b]. `w` holds the gate, up and down
/// weights (every expert's), `reads` every tensor the products read. With a shared expert, each
/// token has k + 1 entries, the shared expert's last (kernels-cuda/common.cuh `MvShared`).
#[allow(clippy::too_many_arguments)]
fn experts_mv<'a>(
    inner: &Inner,
    op: &str,
    m: check::MoeDims,
    x: &'a Tensor,
    w: [&'a Weight; 3],
    ids: &Tensor,
    weights: &Tensor,
    sh: Option<&SharedMv>,
    reads: &[&Tensor],
    out: &Tensor,
    accumulate: bool,
) -> Result<()> {
    let [g, u, dn] = w;
    let (t, d, e, f) = (m.t, m.d, m.n_exp, m.n_ff);
    let per_token = m.k + usize::from(sh.is_some());
    let entries = t * per_token;
    let (xp, idp, wp, outp) = (ptr(x, op)?, ptr(ids, op)?, ptr(weights, op)?, ptr(out, op)?);
    // Hidden rows h[t*per_token + j], in a workspace: held until the down product is submitted, so
    // no other thread's op writes it in between.
    let ws = inner.workspaces()?;
    let h = ws.get("moe_hidden", entries * f * 4)?;
    // The gate/up products of every entry (x row = entry / per_token), one or both weights
    // (`w2`: the fused SwiGLU), the shared expert's given as `shared`.
    let gate_up = |w: &'a Weight, w2: Option<&'a Weight>, shared: Option<MvShared>, dst: DevPtr| Mv {
        w,
        w2,
        x: xp,
        x_t: Some(x),
        parts: Parts::one(w.ptr, dst, f),
        ids: idp,
        scales: 0,
        n_in: d,
        expert_bytes: f * w.row_bytes,
        n_experts: e,
        x_group: per_token,
        nsum: 1,
        vectors: entries,
        shared,
        accumulate: false,
    };
    let shared = |w: &Weight, w2: Option<&Weight>| MvShared {
        w: w.ptr,
        w2: w2.map_or(0, |w| w.ptr),
        gate_logits: 0,
    };
    let down = down_mv(m, dn, sh, h, idp, wp, outp, accumulate);
    if accumulate && !matches!(mv_path(&down), MvPath::Tc(_)) {
        return Err(cuda_err(format!(
            "{op}: the experts' down product cannot add into its output"
        )));
    }
    // With a tensor-core down product, the SwiGLU's own blocks prepare the hidden rows for it
    // (kernels-cuda/out_prep.cuh) instead of a prep launch between the two.
    let mut ready = None;
    if g.ty == u.ty {
        let glu = gate_up(g, Some(u), sh.map(|s| shared(&s.gate, Some(&s.up))), h);
        let mut out_prep = None;
        if let (MvPath::Tc(gf), MvPath::Tc(df)) = (mv_path(&glu), mv_path(&down)) {
            let hx = ws.get("moe_hidden_x", df.prep_bytes(entries, f))?;
            out_prep =
                matvec_tc::OutPrep::into_buffer(inner, &glu, df, hx, matvec_tc::kernel_of(gf, &glu).rows_per_block);
            if out_prep.is_some() {
                ready = Some(df.planes(hx, entries, f));
            }
        }
        run_mv_with(inner, op, &glu, reads, &[], None, out_prep)?;
    } else {
        // Different formats: the two products separately, then swiglu.
        let gt = ws.get("moe_gate", entries * f * 4)?;
        let ut = ws.get("moe_up", entries * f * 4)?;
        run_mv(
            inner,
            op,
            &gate_up(g, None, sh.map(|s| shared(&s.gate, None)), gt),
            reads,
            &[],
        )?;
        run_mv(
            inner,
            op,
            &gate_up(u, None, sh.map(|s| shared(&s.up, None)), ut),
            reads,
            &[],
        )?;
        let mut a = Args::default();
        a.p[0] = gt;
        a.p[1] = ut;
        a.p[2] = h;
        a.n[0] = (entries * f) as i64;
        inner.kernel_rw(
            Launch {
                name: ("swiglu", ""),
                grid: [super::stride_blocks(inner, entries * f), 1, 1],
                block: 256,
                smem: 0,
                args: a,
                phase: Phase::FfnMoe,
            },
            0.0,
            reads,
            &[],
        )?;
    }
    run_mv_with(inner, op, &down, reads, &[out], ready, None)
}
