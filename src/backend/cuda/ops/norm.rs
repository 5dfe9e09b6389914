//! RMSNorm (plain, fused with the residual add, gated) and the q/k L2 norm
//! (kernels-cuda/norm.cu). One block per group of values (`norm_threads` sizes it).

use super::{gemm, grid_u32, group_threads, linear, matvec_tc, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::launch::Args;
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, GdnDims, Tensor};
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

/// Launch RMSNorm kernel `name` over the groups of `out` (`d` values each). When the batch takes
/// the tensor-core path (`gemm::fast_batch`: the norm's output is the next product's input), the
/// kernel also writes `out`'s f16 copy (slot p6) and registers it (`shadow.rs`), which saves the
/// product a conversion launch. `prep`: the kernel can also write the copy the tensor-core decode
/// products read (slot p7, `matvec_tc.rs`), which it does for a few tokens' rows.
fn norm_groups(
    inner: &Inner,
    name: &'static str,
    out: &Tensor,
    d: usize,
    mut args: Args,
    uses: &[&Tensor],
    prep: bool,
) -> Result<()> {
    let g = out.numel() / d;
    if g == 0 {
        return Ok(());
    }
    let tokens = out.shape.first().copied().unwrap_or(0);
    let threads = norm_threads(inner, g, d);
    // The copies' memory is a workspace, held until the kernel is submitted.
    let ws = inner.workspaces()?;
    let copy = if gemm::fast_batch(inner, tokens) {
        let (slot, planes) = inner.shadow_slot(out, false)?;
        args.p[6] = planes.hi;
        Some(slot)
    } else {
        None
    };
    // One row per token, a whole number of super-blocks, 256 threads per super-block.
    let tc = if prep && g == tokens && tokens <= linear::MATVEC_MAX_T && matvec_tc::prep_fits(inner, d, threads) {
        let (slot, base) = inner.tc_slot(out, d, matvec_tc::TcFormat::norm())?;
        args.p[7] = base;
        Some(slot)
    } else {
        None
    };
    inner.kernel(
        Launch {
            name: (name, ""),
            grid: [grid_u32(name, "groups", g)?, 1, 1],
            block: threads,
            smem: 0,
            args,
            phase: Phase::Norms,
        },
        uses,
    )?;
    if let Some(slot) = copy {
        inner.shadow_made(slot, out, false)?;
    }
    if let Some(slot) = tc {
        inner.tc_made(slot, out, matvec_tc::TcFormat::norm())?;
    }
    drop(ws);
    Ok(())
}

pub(crate) fn rms_norm(inner: &Inner, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let op = "rms_norm";
    let d = check::rms_norm(x, w, out)?;
    let mut a = Args::default();
    a.p[0] = ptr(x, op)?;
    a.p[1] = ptr(w, op)?;
    a.p[2] = ptr(out, op)?;
    a.n[0] = d as i64;
    a.f[0] = eps;
    norm_groups(inner, "rms_norm", out, d, a, &[x, w, out], true)
}

pub(crate) fn add_rms_norm(inner: &Inner, acc: &Tensor, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let op = "add_rms_norm";
    let d = check::add_rms_norm(acc, x, w, out)?;
    let mut a = Args::default();
    a.p[0] = ptr(acc, op)?;
    a.p[1] = ptr(x, op)?;
    a.p[2] = ptr(w, op)?;
    a.p[3] = ptr(out, op)?;
    a.n[0] = d as i64;
    a.f[0] = eps;
    norm_groups(inner, "add_rms_norm", out, d, a, &[acc, x, w, out], true)
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
    norm_groups(inner, "gated_rms_norm", out, d, a, &[x, z, w, out], false)
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
