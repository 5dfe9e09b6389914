//! RMSNorm (plain, fused with the residual add, gated), the q/k L2 norm, and the decode-shaped
//! gate of the attention output (kernels-cuda/norm.cu). One block per group of values
//! (`norm_threads` sizes it), or in decode one block per slice of 256 of a token row (`slices`),
//! which also prepares the slice for the tensor-core products (`matvec_tc::Preps`).

use super::matvec_tc::{Preps, Producer};
use super::{gemm, grid_u32, group_threads, linear, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::DevPtr;
use crate::backend::cuda::op::Args;
use crate::backend::cuda::policy::{self, NormedGroup, RowBlocks, SharedExpert};
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, AddNorm, DType, GdnDims, MoeExperts, MoeFfn, Tensor};
use crate::error::Result;

/// Threads per block for `g` groups of `d` values. Many groups (prefill) fill the GPU with one
/// block each: `group_threads`. A few (decode: one token's hidden vector of 2048-4096 values) get
/// up to 1024 threads, about 4 values each: a thread's loads then all go out at once instead of
/// 16 round trips to L2 one after another (the norms were ~18% of a 9B decode step in GPU run 1).
fn norm_threads(inner: &Inner, g: usize, d: usize) -> u32 {
    let base = group_threads(d);
    if g >= inner.sms() {
        return base;
    }
    ((d.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32).max(base)
}

/// Token rows of `out` when they are few enough for the decode products
/// (`policy::MATVEC_MAX_T`): the decode shape, in which a kernel can prepare its rows for them.
fn decode_rows(out: &Tensor) -> Option<usize> {
    let t = out.shape.first().copied().unwrap_or(0);
    policy::decode_rows(t).then_some(t)
}

/// Whether `t` token rows of `n` values run over slices of 256 (`policy::Policy::row_blocks`;
/// `barrier`: the RMSNorms' grid barrier).
fn slices_fit(inner: &Inner, t: usize, n: usize, barrier: bool) -> bool {
    inner.policy.row_blocks(t, n, barrier) == RowBlocks::Slices
}

/// Launch `name` (a `*_slices` kernel of norm.cu) over `t` rows of `n` values of `out`: grid
/// (n / 256, t), 256 threads, each block preparing its slice in every layout the products have
/// read from `who`'s outputs.
#[allow(clippy::too_many_arguments)]
fn launch_slices(
    inner: &Inner,
    name: &'static str,
    out: &Tensor,
    t: usize,
    n: usize,
    mut args: Args,
    uses: &[&Tensor],
    who: Producer,
    phase: Phase,
) -> Result<()> {
    let ws = inner.workspaces()?;
    let preps = Preps::ask(inner, who, out, t, n, &mut args)?;
    inner.kernel(
        Launch {
            name: (name, ""),
            grid: [grid_u32(name, "slices", n / 256)?, grid_u32(name, "rows", t)?, 1],
            block: 256,
            smem: 0,
            args,
            phase,
        },
        uses,
    )?;
    if let Some(p) = preps {
        p.made(inner, out)?;
    }
    inner.produced_by(out, who)?;
    drop(ws);
    Ok(())
}

/// `acc += x`, then RMSNorm over slices (norm.cu `rms_norm_slices`, a grid barrier between).
#[allow(clippy::too_many_arguments)]
fn rms_norm_slices(
    inner: &Inner,
    acc: &Tensor,
    x: &Tensor,
    w: &Tensor,
    eps: f32,
    out: &Tensor,
    t: usize,
    d: usize,
) -> Result<()> {
    let op = "rms_norm_slices";
    let mut a = Args::default();
    a.p[0] = ptr(acc, op)?;
    a.p[1] = ptr(x, op)?;
    a.p[2] = ptr(w, op)?;
    a.p[3] = ptr(out, op)?;
    a.n[0] = d as i64;
    a.n[2] = inner.sync_barrier() as i64;
    a.f[0] = eps;
    launch_slices(inner, op, out, t, d, a, &[acc, x, w, out], Producer::Norm, Phase::Norms)
}

/// The token rows of `next.out` (`d` values per row) when the norm of a finished residual row runs
/// over slices with no grid barrier (`rms_norm_slices_whole`, `policy::Policy::norm_reads_whole_rows`).
fn add_norm_rows(inner: &Inner, next: AddNorm<'_>, d: usize) -> Option<usize> {
    let t = decode_rows(next.out)?;
    inner.policy.norm_reads_whole_rows(t, d, next.out.numel()).then_some(t)
}

/// RMSNorm over slices of a row nobody writes meanwhile (norm.cu `rms_norm_slices_whole`: each
/// block reads the whole row, no grid barrier).
fn rms_norm_whole(inner: &Inner, next: AddNorm<'_>, t: usize, d: usize) -> Result<()> {
    let op = "rms_norm_slices_whole";
    let mut a = Args::default();
    a.p[0] = ptr(next.acc, op)?;
    a.p[2] = ptr(next.w, op)?;
    a.p[3] = ptr(next.out, op)?;
    a.n[0] = d as i64;
    a.f[0] = next.eps;
    let uses = [next.acc, next.w, next.out];
    launch_slices(inner, op, next.out, t, d, a, &uses, Producer::Norm, Phase::Norms)
}

/// `Backend::matmul_add_rms_norm`: in decode, the product adds its rows into the residual itself
/// (`linear::matmul_accumulate`) and the norm reads the finished row with no barrier; otherwise
/// the composition (`policy::Policy::add_norm`).
pub(crate) fn matmul_add_rms_norm(inner: &Inner, w: &Tensor, x: &Tensor, y: &Tensor, next: AddNorm<'_>) -> Result<()> {
    let d = check::matmul_add_rms_norm(w, x, y, next)?;
    let t = next.out.shape.first().copied().unwrap_or(0);
    let on_tc = linear::accumulates_on_tc(w, x, next.acc)?;
    match inner.policy.add_norm(t, d.n_out, next.out.numel(), on_tc) {
        policy::AddNorm::InProduct { rows } => {
            linear::matmul_accumulate(inner, w, x, next.acc)?;
            norm_then(inner, next, rows, d.n_out)
        }
        policy::AddNorm::Composed => {
            linear::matmul(inner, w, x, y)?;
            add_rms_norm(inner, next.acc, y, next.w, next.eps, next.out)?;
            group_of_normed(inner, next)
        }
    }
}

/// The norm of a residual row its product has finished (`next.acc` into `next.out`) and
/// `next.then`'s products of it: where those products' launch can take the norm as its prologue
/// (`linear::normed_group`: no norm launch between the two), that launch; else
/// `rms_norm_slices_whole` and the group.
fn norm_then(inner: &Inner, next: AddNorm<'_>, t: usize, d: usize) -> Result<()> {
    if let Some(g) = next.then {
        if linear::normed_group_choice(inner, next, g)? == NormedGroup::Prologue {
            return linear::normed_group(inner, next, g);
        }
    }
    rms_norm_whole(inner, next, t, d)?;
    group_of_normed(inner, next)
}

/// `next.then`'s products of the normed rows, if any.
fn group_of_normed(inner: &Inner, next: AddNorm<'_>) -> Result<()> {
    match next.then {
        Some(g) => linear::matmul_group(inner, g.ws, next.out, g.outs),
        None => Ok(()),
    }
}

/// Whether `moe_experts_shared` and `next` (`moe_route_experts_shared` after its routing) run as
/// `moe_experts_add_rms_norm` (`policy::Policy::add_norm`): the shared expert inside the experts'
/// launches and their down product on the tensor cores. The caller has checked the operands.
pub(crate) fn moe_experts_add_norm_choice(
    inner: &Inner,
    x: &Tensor,
    e: MoeExperts<'_>,
    next: AddNorm<'_>,
) -> Result<policy::AddNorm> {
    let d = x.shape.last().copied().unwrap_or(0);
    let t = next.out.shape.first().copied().unwrap_or(0);
    let on_tc = linear::shared_expert_choice(inner, x, e, next.acc)? == SharedExpert::InExpertLaunches
        && linear::shared_down_on_tc(x, e, next.acc)?;
    Ok(inner.policy.add_norm(t, d, next.out.numel(), on_tc))
}

/// `moe_experts_shared` and `next`: in decode the down product adds the experts' sum into the
/// residual itself and the norm reads the finished row, where `moe_experts_add_norm_choice` says
/// so (an error otherwise). The caller has checked the operands.
pub(crate) fn moe_experts_add_rms_norm(inner: &Inner, x: &Tensor, e: MoeExperts<'_>, next: AddNorm<'_>) -> Result<()> {
    let d = x.shape.last().copied().unwrap_or(0);
    let Some(t) = add_norm_rows(inner, next, d) else {
        return Err(crate::backend::cuda::driver::cuda_err(
            "moe_experts_add_rms_norm: not a decode shape of whole slices",
        ));
    };
    linear::moe_experts_shared(inner, x, e, next.acc, true)?;
    norm_then(inner, next, t, d)
}

/// Router rows per block of `moe_norm_route` (a warp each).
const NORM_ROUTE_ROWS: usize = 8;

/// The operands of norm.cu's `moe_norm_route`, by name; `args` places them in the kernel's slots
/// (several pointers in integer slots: the pointer slots are taken).
struct NormRouteArgs {
    acc: DevPtr,
    y: DevPtr,
    norm_w: DevPtr,
    out: DevPtr,
    router: DevPtr,
    shared_gate: DevPtr,
    logits: DevPtr,
    shared_logit: DevPtr,
    ids: DevPtr,
    weights: DevPtr,
    /// The blocks' counter (`Inner::route_counter`).
    counter: DevPtr,
    d: usize,
    experts: usize,
    k: usize,
    eps: f32,
    scale: f32,
}

impl NormRouteArgs {
    /// The slots (norm.cu): p0 acc, p1 y, p2 w, p3 out, p6 router; n0 d, n1 E, n2 k, n3 shared
    /// gate, n4 logits, n5 shared gate logit, n6 ids, n7 weights, n8 counter; f0 eps, f1 scale.
    /// p4, p5 and p7 are the prepared copies' (`Preps::ask`).
    fn args(&self) -> Args {
        let mut a = Args::default();
        (a.p[0], a.p[1], a.p[2], a.p[3], a.p[6]) = (self.acc, self.y, self.norm_w, self.out, self.router);
        let in_int = |p: DevPtr| p as i64;
        a.n[..9].copy_from_slice(&[
            self.d as i64,
            self.experts as i64,
            self.k as i64,
            in_int(self.shared_gate),
            in_int(self.logits),
            in_int(self.shared_logit),
            in_int(self.ids),
            in_int(self.weights),
            in_int(self.counter),
        ]);
        (a.f[0], a.f[1]) = (self.eps, self.scale);
        a
    }
}

/// The shapes of `moe_ffn` as `policy::Policy::moe_ffn` reads them.
fn moe_ffn_shape(m: &MoeFfn<'_>) -> policy::MoeFfnShape {
    let x = m.input.out;
    policy::MoeFfnShape {
        t: x.shape.first().copied().unwrap_or(0),
        d: x.cols(),
        numel: x.numel(),
        n_experts: m.logits.cols(),
        router_f32: m.router.dtype == DType::F32 && m.shared_gate.dtype == DType::F32,
    }
}

/// Whether `moe_ffn` runs as `moe_norm_route` (`policy::Policy::moe_ffn`). The caller has checked
/// the operands (`check::moe_ffn`).
pub(crate) fn moe_ffn_choice(inner: &Inner, m: &MoeFfn<'_>) -> policy::MoeFfn {
    inner.policy.moe_ffn(&moe_ffn_shape(m))
}

/// `moe_ffn`'s residual add, input norm (with its prepared copies), router and shared-gate
/// products and routing in one launch (norm.cu `moe_norm_route`), for the shapes `moe_ffn_choice`
/// gives `MoeFfn::NormRoute` (an error otherwise). The caller has checked the operands
/// (`check::moe_ffn`).
pub(crate) fn moe_norm_route(inner: &Inner, m: &MoeFfn<'_>) -> Result<()> {
    let op = "moe_norm_route";
    let x = m.input.out;
    let (d, e) = (x.cols(), m.logits.cols());
    if inner.policy.with_fusion().moe_ffn(&moe_ffn_shape(m)) != policy::MoeFfn::NormRoute {
        return Err(crate::backend::cuda::driver::cuda_err(format!(
            "{op}: the shape does not fit the one-launch kernel"
        )));
    }
    let mut a = NormRouteArgs {
        acc: ptr(m.input.acc, op)?,
        y: ptr(m.y, op)?,
        norm_w: ptr(m.input.w, op)?,
        out: ptr(x, op)?,
        router: ptr(m.router, op)?,
        shared_gate: ptr(m.shared_gate, op)?,
        logits: ptr(m.logits, op)?,
        shared_logit: ptr(m.experts.sh.gate_logit, op)?,
        ids: ptr(m.experts.ids, op)?,
        weights: ptr(m.experts.weights, op)?,
        counter: inner.route_counter(),
        d,
        experts: e,
        k: m.k,
        eps: m.input.eps,
        scale: m.scale,
    }
    .args();
    let blocks = d / 256 + (e + 1).div_ceil(NORM_ROUTE_ROWS);
    let ws = inner.workspaces()?;
    let preps = Preps::ask(inner, Producer::Norm, x, 1, d, &mut a)?;
    let uses = [
        m.input.acc,
        m.y,
        m.input.w,
        x,
        m.router,
        m.shared_gate,
        m.logits,
        m.experts.sh.gate_logit,
        m.experts.ids,
        m.experts.weights,
    ];
    inner.kernel(
        Launch {
            name: (op, ""),
            grid: [grid_u32(op, "blocks", blocks)?, 1, 1],
            block: 256,
            smem: (d * 4) as u32,
            args: a,
            phase: Phase::FfnMoe,
        },
        &uses,
    )?;
    if let Some(p) = preps {
        p.made(inner, x)?;
    }
    inner.produced_by(x, Producer::Norm)?;
    drop(ws);
    Ok(())
}

/// The token rows of a decode-shaped RMSNorm over `out` (`d` values per row) that runs over slices,
/// if it does: not when the fast prefill path wants `out`'s f16 copy (never at decode sizes).
fn norm_slices_rows(inner: &Inner, out: &Tensor, d: usize) -> Option<usize> {
    let t = decode_rows(out)?;
    (out.numel() == t * d && slices_fit(inner, t, d, true) && !gemm::fast_batch(inner, t)).then_some(t)
}

/// What a launch of norm.cu writes besides `out`, and who it is.
#[derive(Clone, Copy)]
struct Extra {
    /// `out`'s f16 copy (slot p6), registered (`shadow.rs`): saves the fast path's next product a
    /// conversion launch.
    f16: bool,
    /// The producer kind the products learn from (`matvec_tc::read_by`).
    who: Option<Producer>,
}

impl Extra {
    /// A decode-shaped kernel of producer `who`, one block per row of `out`. Its output is
    /// prepared for the tensor-core products by prep launches: a row's single block paying for
    /// the layouts in series measured slower than they cost (dev/cuda/DECISIONS.md).
    fn rows(who: Producer) -> Extra {
        Extra {
            f16: false,
            who: Some(who),
        }
    }
}

/// One launch of a kernel of norm.cu: `blocks` blocks of `threads`, with `extra`.
#[allow(clippy::too_many_arguments)]
fn launch(
    inner: &Inner,
    name: &'static str,
    out: &Tensor,
    blocks: usize,
    threads: u32,
    mut args: Args,
    uses: &[&Tensor],
    extra: Extra,
    phase: Phase,
) -> Result<()> {
    // The copies' memory is a workspace, held until the kernel is submitted.
    let ws = inner.workspaces()?;
    let copy = if extra.f16 {
        let (slot, planes) = inner.shadow_slot(out, false)?;
        args.p[6] = planes.hi;
        Some(slot)
    } else {
        None
    };
    inner.kernel(
        Launch {
            name: (name, ""),
            grid: [grid_u32(name, "blocks", blocks)?, 1, 1],
            block: threads,
            smem: 0,
            args,
            phase,
        },
        uses,
    )?;
    if let Some(slot) = copy {
        inner.shadow_made(slot, out, false)?;
    }
    if let Some(who) = extra.who {
        inner.produced_by(out, who)?;
    }
    drop(ws);
    Ok(())
}

/// Launch RMSNorm kernel `name` over the groups of `out` (`d` values each), with the f16 copy of
/// `out` when the batch takes the tensor-core path (`gemm::fast_batch`: the norm's output is the
/// next product's input). `who`: the producer kind of `out` (`matvec_tc::read_by`); a kernel of
/// one group per token row (rms_norm, add_rms_norm) also prepares its rows in decode.
fn norm_groups(
    inner: &Inner,
    name: &'static str,
    out: &Tensor,
    d: usize,
    args: Args,
    uses: &[&Tensor],
    who: Option<Producer>,
) -> Result<()> {
    let g = out.numel() / d;
    if g == 0 {
        return Ok(());
    }
    let tokens = out.shape.first().copied().unwrap_or(0);
    let extra = Extra {
        f16: gemm::fast_batch(inner, tokens),
        who,
    };
    launch(
        inner,
        name,
        out,
        g,
        norm_threads(inner, g, d),
        args,
        uses,
        extra,
        Phase::Norms,
    )
}

pub(crate) fn rms_norm(inner: &Inner, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let op = "rms_norm";
    let d = check::rms_norm(x, w, out)?;
    // x is not written here (nor aliased by out): every slice's block may read the whole row, no
    // grid barrier.
    let whole = AddNorm {
        acc: x,
        w,
        eps,
        out,
        then: None,
    };
    if let Some(t) = add_norm_rows(inner, whole, d) {
        return rms_norm_whole(inner, whole, t, d);
    }
    let mut a = Args::default();
    a.p[0] = ptr(x, op)?;
    a.p[1] = ptr(w, op)?;
    a.p[2] = ptr(out, op)?;
    a.n[0] = d as i64;
    a.f[0] = eps;
    norm_groups(inner, "rms_norm", out, d, a, &[x, w, out], Some(Producer::Norm))
}

pub(crate) fn add_rms_norm(inner: &Inner, acc: &Tensor, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let op = "add_rms_norm";
    let d = check::add_rms_norm(acc, x, w, out)?;
    if let Some(t) = norm_slices_rows(inner, out, d) {
        return rms_norm_slices(inner, acc, x, w, eps, out, t, d);
    }
    let mut a = Args::default();
    a.p[0] = ptr(acc, op)?;
    a.p[1] = ptr(x, op)?;
    a.p[2] = ptr(w, op)?;
    a.p[3] = ptr(out, op)?;
    a.n[0] = d as i64;
    a.f[0] = eps;
    norm_groups(
        inner,
        "add_rms_norm",
        out,
        d,
        a,
        &[acc, x, w, out],
        Some(Producer::Norm),
    )
}

pub(crate) fn gated_rms_norm(inner: &Inner, x: &Tensor, z: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let op = "gated_rms_norm";
    let d = check::gated_rms_norm(x, z, w, out)?;
    let mut a = Args::default();
    a.p[0] = ptr(x, op)?;
    a.p[1] = ptr(z, op)?;
    a.p[2] = ptr(w, op)?;
    a.p[3] = ptr(out, op)?;
    a.n[0] = d as i64;
    a.f[0] = eps;
    let uses = [x, z, w, out];
    match decode_rows(out) {
        // A block per slice of 256: 256 / d groups of d / 32 warps.
        Some(t)
            if d.is_multiple_of(32)
                && 256 % d == 0
                && out.numel().is_multiple_of(t * 256)
                && slices_fit(inner, t, out.numel() / t, false) =>
        {
            let n = out.numel() / t;
            a.n[1] = n as i64;
            launch_slices(
                inner,
                "gated_rms_norm_slices",
                out,
                t,
                n,
                a,
                &uses,
                Producer::GatedNorm,
                Phase::Norms,
            )
        }
        // A warp per group of d: up to 32 values per lane.
        Some(t) if d <= 1024 && out.numel().is_multiple_of(t * d) => {
            let n = out.numel() / t;
            a.n[1] = n as i64;
            let extra = Extra::rows(Producer::GatedNorm);
            launch(
                inner,
                "gated_rms_norm_rows",
                out,
                t,
                norm_threads(inner, t, n),
                a,
                &uses,
                extra,
                Phase::Norms,
            )
        }
        _ => norm_groups(inner, "gated_rms_norm", out, d, a, &uses, Some(Producer::GatedNorm)),
    }
}

/// `x *= sigmoid(gate)` (the attention output's gate): elementwise.cu's grid-stride kernel, or in
/// decode norm.cu's row kernels, which prepare x for the output projection (here, beside the
/// other producers of a product's input).
pub(crate) fn sigmoid_mul_assign(inner: &Inner, x: &Tensor, gate: &Tensor) -> Result<()> {
    let n = check::sigmoid_mul_assign(x, gate)?;
    if let Some(t) = decode_rows(x) {
        // Decode: one block per token row (or slice), which also prepares x for the next product.
        return sigmoid_mul_rows(inner, x, gate, t);
    }
    let mut a = Args::default();
    a.p[0] = ptr(x, "sigmoid_mul_assign")?;
    a.p[1] = ptr(gate, "sigmoid_mul_assign")?;
    a.n[0] = n as i64;
    super::eltwise::stride(inner, "sigmoid_mul_assign", n, a, Phase::Attention, &[x, gate])?;
    // The products that read x teach the decode shape's kernel their layouts (from a prompt).
    inner.produced_by(x, Producer::SigmoidMul)
}

/// `x *= sigmoid(gate)` on a few token rows (`decode_rows(x)` is `Some(t)`), one block per row
/// (kernels-cuda/norm.cu `sigmoid_mul_rows`, the same values as elementwise.cu's kernel), which
/// prepares the gated attention output for its projection.
fn sigmoid_mul_rows(inner: &Inner, x: &Tensor, gate: &Tensor, t: usize) -> Result<()> {
    let op = "sigmoid_mul_assign";
    let n = x.numel() / t;
    let mut a = Args::default();
    a.p[0] = ptr(x, op)?;
    a.p[1] = ptr(gate, op)?;
    a.n[1] = n as i64;
    if x.numel() == t * n && slices_fit(inner, t, n, false) {
        return launch_slices(
            inner,
            "sigmoid_mul_slices",
            x,
            t,
            n,
            a,
            &[x, gate],
            Producer::SigmoidMul,
            Phase::Attention,
        );
    }
    let extra = Extra::rows(Producer::SigmoidMul);
    launch(
        inner,
        "sigmoid_mul_rows",
        x,
        t,
        norm_threads(inner, t, n),
        a,
        &[x, gate],
        extra,
        Phase::Attention,
    )
}

pub(crate) fn l2_norm_qk(inner: &Inner, u: &Tensor, dims: GdnDims, eps: f32) -> Result<()> {
    let op = "l2_norm_qk";
    let t = check::l2_norm_qk(u, dims)?;
    let mut a = Args::default();
    a.p[0] = ptr(u, op)?;
    a.n[0] = dims.conv_dim() as i64;
    a.n[1] = dims.hk as i64;
    a.n[2] = dims.dk as i64;
    a.f[0] = eps;
    inner.kernel(
        Launch {
            name: ("l2_norm_qk", ""),
            grid: [grid_u32(op, "heads", 2 * dims.hk)?, grid_u32(op, "tokens", t)?, 1],
            block: group_threads(dims.dk),
            smem: 0,
            args: a,
            phase: Phase::Conv,
        },
        &[u],
    )
}

#[cfg(test)]
mod tests {
    use super::NormRouteArgs;

    /// The named operands land in the slots norm.cu's `moe_norm_route` reads.
    #[test]
    fn norm_route_slots() {
        let a = NormRouteArgs {
            acc: 1,
            y: 2,
            norm_w: 3,
            out: 4,
            router: 5,
            shared_gate: 6,
            logits: 7,
            shared_logit: 8,
            ids: 9,
            weights: 10,
            counter: 11,
            d: 2048,
            experts: 256,
            k: 8,
            eps: 0.5,
            scale: 2.0,
        }
        .args();
        assert_eq!((a.p[0], a.p[1], a.p[2], a.p[3], a.p[6]), (1, 2, 3, 4, 5));
        assert_eq!((a.p[4], a.p[5], a.p[7]), (0, 0, 0));
        assert_eq!(a.n[..9], [2048, 256, 8, 6, 7, 8, 9, 10, 11]);
        assert_eq!((a.f[0], a.f[1]), (0.5, 2.0));
    }
}
