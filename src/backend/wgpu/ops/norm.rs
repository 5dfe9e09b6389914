//! RMSNorm (plain, fused with the residual add, gated) and the per-head L2 norm of q/k: one
//! workgroup per normalised group, sum of squares by the workgroup reduction of the selected
//! variant (subgroups or workgroup memory).

use super::u32_of;
use crate::backend::wgpu::kernels::Kernel;
use crate::backend::wgpu::WgpuBackend;
use crate::backend::{check, GdnDims, Tensor};
use crate::error::Result;

/// One workgroup per group of `d` values over `n` elements.
fn norm(be: &WgpuBackend, op: &str, kernel: Kernel, n: usize, d: usize, eps: f32, binds: &[&Tensor]) -> Result<()> {
    let groups = u32_of(op, "elements", n)? / d as u32;
    let mut enc = be.encoder()?;
    let [gx, gy] = enc.grid(groups);
    let b: [_; 4] = std::array::from_fn(|i| binds[i.min(binds.len() - 1)].into());
    enc.run(kernel, None, &[d as u32, eps.to_bits()], &b[..binds.len()], [gx, gy, 1])
}

/// `out = x / sqrt(mean(x^2) + eps) * w` over consecutive groups of `w.len()` values.
pub(crate) fn rms_norm(be: &WgpuBackend, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let d = check::rms_norm(x, w, out)?;
    norm(be, "rms_norm", Kernel::RmsNorm, x.numel(), d, eps, &[x, w, out])
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
