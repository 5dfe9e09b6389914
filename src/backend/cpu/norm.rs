//! RMSNorm (plain and gated) and the per-head L2 norm of q/k.

use rayon::prelude::*;

use super::{dot, min_rows, read_f32s, silu, write_f32s};
use crate::backend::{check, GdnDims, Tensor};
use crate::error::Result;

/// `1 / sqrt(mean(x^2) + eps)`.
#[inline]
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ms = dot(x, x) / x.len() as f32;
    1.0 / (ms + eps).sqrt()
}

/// `out = x / sqrt(mean(x^2) + eps) * w` over consecutive groups of `w.len()` values.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let op = "rms_norm";
    let d = check::rms_norm(x, w, out)?;
    let xs = read_f32s(x, op)?;
    let ws = read_f32s(w, op)?;
    let mut ys = write_f32s(out, op)?;
    ys.par_chunks_mut(d)
        .zip(xs.par_chunks(d))
        .with_min_len(min_rows(d))
        .for_each(|(y, x)| {
            let s = rms_scale(x, eps);
            for ((yi, xi), wi) in y.iter_mut().zip(x).zip(ws.iter()) {
                *yi = xi * s * wi;
            }
        });
    Ok(())
}

/// `out = rms_norm(x; w) * silu(z)` per group of `w.len()` values.
pub(crate) fn gated_rms_norm(x: &Tensor, z: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let op = "gated_rms_norm";
    let d = check::gated_rms_norm(x, z, w, out)?;
    let xs = read_f32s(x, op)?;
    let zs = read_f32s(z, op)?;
    let ws = read_f32s(w, op)?;
    let mut ys = write_f32s(out, op)?;
    ys.par_chunks_mut(d)
        .zip(xs.par_chunks(d).zip(zs.par_chunks(d)))
        .with_min_len(min_rows(d))
        .for_each(|(y, (x, z))| {
            let s = rms_scale(x, eps);
            for (((yi, xi), wi), zi) in y.iter_mut().zip(x).zip(ws.iter()).zip(z) {
                *yi = xi * s * wi * silu(*zi);
            }
        });
    Ok(())
}

/// In place on `u` `[T, conv_dim]`: `x / sqrt(sum(x^2) + eps)` for every q and k head (the first
/// `2 * hk` groups of `dk` channels of each row), then q additionally `* 1/sqrt(dk)`.
pub(crate) fn l2_norm_qk(u: &Tensor, dims: GdnDims, eps: f32) -> Result<()> {
    let op = "l2_norm_qk";
    check::l2_norm_qk(u, dims)?;
    let cd = dims.conv_dim();
    let (dk, kd) = (dims.dk, dims.key_dim());
    let q_scale = 1.0 / (dk as f32).sqrt();
    let mut us = write_f32s(u, op)?;
    us.par_chunks_mut(cd).with_min_len(min_rows(cd)).for_each(|row| {
        // q heads [0, kd), k heads [kd, 2 kd); v is untouched.
        for (h, head) in row[..2 * kd].chunks_exact_mut(dk).enumerate() {
            let mut s = 1.0 / (dot(head, head) + eps).sqrt();
            if h < dims.hk {
                s *= q_scale;
            }
            head.iter_mut().for_each(|x| *x *= s);
        }
    });
    Ok(())
}
