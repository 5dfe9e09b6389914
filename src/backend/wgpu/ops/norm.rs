//! RMSNorm (plain and gated) and the per-head L2 norm of q/k: one workgroup per normalised group,
//! sum of squares by a tree reduction in workgroup memory.

use crate::backend::wgpu::WgpuBackend;
use crate::backend::{check, GdnDims, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[
    ("rms_norm", include_str!("../../../../shaders-wgsl/rms_norm.wgsl")),
    (
        "gated_rms_norm",
        include_str!("../../../../shaders-wgsl/gated_rms_norm.wgsl"),
    ),
    ("l2_norm_qk", include_str!("../../../../shaders-wgsl/l2_norm_qk.wgsl")),
];

/// `out = x / sqrt(mean(x^2) + eps) * w` over consecutive groups of `w.len()` values.
pub(crate) fn rms_norm(be: &WgpuBackend, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let op = "rms_norm";
    let d = check::rms_norm(x, w, out)?;
    let groups = check::u32_index(op, "elements", x.numel())? / d as u32;
    let [gx, gy] = be.grid(groups);
    be.dispatch(op, "", &[d as u32, eps.to_bits()], &[x, w, out], [gx, gy, 1])
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
    let op = "gated_rms_norm";
    let d = check::gated_rms_norm(x, z, w, out)?;
    let groups = check::u32_index(op, "elements", x.numel())? / d as u32;
    let [gx, gy] = be.grid(groups);
    be.dispatch(op, "", &[d as u32, eps.to_bits()], &[x, z, w, out], [gx, gy, 1])
}

/// In place on `u` `[T, conv_dim]`: L2-normalise the `hk` q heads and `hk` k heads of `dk`
/// channels at the start of every row, q also times `1/sqrt(dk)`; one workgroup per (token, head).
pub(crate) fn l2_norm_qk(be: &WgpuBackend, u: &Tensor, dims: GdnDims, eps: f32) -> Result<()> {
    let op = "l2_norm_qk";
    let t = check::l2_norm_qk(u, dims)?;
    let cd = dims.conv_dim();
    check::u32_index(op, "elements", u.numel())?;
    let heads = check::u32_index(op, "heads", t * 2 * dims.hk)?;
    // Same rounding as the CPU backend: 1/sqrt(dk) in f32.
    let q_scale = 1.0 / (dims.dk as f32).sqrt();
    let params = [
        cd as u32,
        dims.hk as u32,
        dims.dk as u32,
        eps.to_bits(),
        q_scale.to_bits(),
    ];
    let [gx, gy] = be.grid(heads);
    be.dispatch(op, "", &params, &[u], [gx, gy, 1])
}
