//! RMSNorm (plain, fused with the residual add, gated) and the per-head L2 norm of q/k: one
//! workgroup per normalised group, sum of squares by the workgroup reduction of the selected
//! variant (subgroups or workgroup memory).

use super::u32_of;
use crate::backend::wgpu::kernels::{self, Kernel};
use crate::backend::wgpu::policy::{self, NormOut};
use crate::backend::wgpu::WgpuBackend;
use crate::backend::{check, DType, GdnDims, Tensor};
use crate::error::Result;

/// One workgroup per group of `d` values over `n` elements. With `dot` (the norm's variant that
/// also writes its output's packed-dot planes, lib_norm_dot.wgsl) where the planes can serve a
/// product: the output (the last binding) is recorded with them, so a product of it needs no
/// `mv_dot_prep` dispatch (linear.rs `mv_dot_x`).
#[allow(clippy::too_many_arguments)]
fn norm(
    be: &WgpuBackend,
    op: &str,
    kernel: Kernel,
    dot: Option<Kernel>,
    n: usize,
    d: usize,
    eps: f32,
    binds: &[&Tensor],
) -> Result<()> {
    let groups = u32_of(op, "elements", n)? / d as u32;
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(groups);
    let out = binds[binds.len() - 1];
    let mut b: [_; 5] = std::array::from_fn(|i| binds[i.min(binds.len() - 1)].into());
    let params = [d as u32, eps.to_bits()];
    match dot.filter(|_| policy::norm_out(be.caps.device(), d, n) == NormOut::Planes) {
        Some(dot) => {
            let xq = enc.scratch("norm_xq", DType::U32, &[kernels::xq_words(n)])?;
            b[binds.len()] = (&xq).into();
            enc.run(dot, None, &params, &b[..=binds.len()], [gx, gy, 1])?;
            enc.set_dot_x(out, xq);
            Ok(())
        }
        None => enc.run(kernel, None, &params, &b[..binds.len()], [gx, gy, 1]),
    }
}

/// `out = x / sqrt(mean(x^2) + eps) * w` over consecutive groups of `w.len()` values.
pub(crate) fn rms_norm(be: &WgpuBackend, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let d = check::rms_norm(x, w, out)?;
    // Only a single row: a per-head norm (q, k) feeds no product.
    let dot = (x.numel() == d).then_some(Kernel::RmsNormDot);
    norm(be, "rms_norm", Kernel::RmsNorm, dot, x.numel(), d, eps, &[x, w, out])
}

/// `acc += x; out = rms_norm(acc; w)` in one dispatch.
pub(crate) fn add_rms_norm(
    be: &WgpuBackend,
    acc: &Tensor,
    x: &Tensor,
    w: &Tensor,
    eps: f32,
    out: &Tensor,
) -> Result<()> {
    let d = check::add_rms_norm(acc, x, w, out)?;
    norm(
        be,
        "add_rms_norm",
        Kernel::AddRmsNorm,
        (acc.numel() == d).then_some(Kernel::AddRmsNormDot),
        acc.numel(),
        d,
        eps,
        &[acc, x, w, out],
    )
}

/// `out = rms_norm(x; w) * silu(z)` per group of `w.len()` values.
pub(crate) fn gated_rms_norm(
    be: &WgpuBackend,
    x: &Tensor,
    z: &Tensor,
    w: &Tensor,
    eps: f32,
    out: &Tensor,
) -> Result<()> {
    let d = check::gated_rms_norm(x, z, w, out)?;
    norm(
        be,
        "gated_rms_norm",
        Kernel::GatedRmsNorm,
        // Per head, but the heads together are the output projection's input; its products read
        // planes only for one token (linear.rs: the matrix-vector kernels), so a prompt batch
        // writes none.
        (x.rows() == 1).then_some(Kernel::GatedRmsNormDot),
        x.numel(),
        d,
        eps,
        &[x, z, w, out],
    )
}

/// In place on `u` `[T, conv_dim]`: L2-normalise the `hk` q heads and `hk` k heads of `dk`
/// channels at the start of every row, q also times `1/sqrt(dk)`; one workgroup per (token, head).
pub(crate) fn l2_norm_qk(be: &WgpuBackend, u: &Tensor, dims: GdnDims, eps: f32) -> Result<()> {
    let op = "l2_norm_qk";
    let t = check::l2_norm_qk(u, dims)?;
    u32_of(op, "elements", u.numel())?;
    let heads = u32_of(op, "heads", t * 2 * dims.hk)?;
    let params = [
        dims.conv_dim() as u32,
        dims.hk as u32,
        dims.dk as u32,
        eps.to_bits(),
        q_scale(dims).to_bits(),
    ];
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(heads);
    enc.run(Kernel::L2NormQk, None, &params, &[u.into()], [gx, gy, 1])
}

/// `1/sqrt(dk)` rounded in f32, exactly as the CPU backend does.
pub(crate) fn q_scale(dims: GdnDims) -> f32 {
    1.0 / (dims.dk as f32).sqrt()
}
