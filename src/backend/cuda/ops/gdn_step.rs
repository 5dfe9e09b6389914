//! `gdn_recurrent_step` for one decode token in one launch (kernels-cuda/gdn_step.cu: conv + SiLU,
//! q/k L2 norm, gates, delta rule, gated RMSNorm and its prepared copies); other shapes take the
//! three launches of the trait's default.

use super::matvec_tc::{Preps, Producer};
use super::{grid_u32, Launch};
use crate::backend::cuda::buffer::ptr;
use crate::backend::cuda::driver::cuda_err;
use crate::backend::cuda::op::Args;
use crate::backend::cuda::policy::{self, GdnStepShape};
use crate::backend::cuda::profile::Phase;
use crate::backend::cuda::Inner;
use crate::backend::{check, GdnDims, GdnStep};
use crate::error::Result;

/// `GdnStepParams` (gdn_step.cu; size asserted there).
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct GdnStepParams {
    qkv: u64,
    conv_w: u64,
    conv_state: u64,
    a: u64,
    b: u64,
    ssm_a: u64,
    dt_bias: u64,
    state: u64,
    z: u64,
    norm_w: u64,
    o: u64,
    out: u64,
    counters: u64,
    p7: u64,
    p5: u64,
    p4: u64,
    c: i32,
    hk: i32,
    hv: i32,
    dk: i32,
    dv: i32,
    eps_l2: f32,
    eps: f32,
    _pad: i32,
}

/// State rows per block of the kernel (`GS_ROWS`).
const ROWS: usize = 16;

/// The shapes of `gdn_recurrent_step` as `policy::Policy::gdn_step` reads them.
fn shape(s: GdnStep<'_>, dims: GdnDims) -> Result<GdnStepShape> {
    let (c, norm_group) = check::gdn_recurrent_step(s, dims)?;
    Ok(GdnStepShape {
        t: c.t,
        taps: c.k,
        norm_group,
        dims,
    })
}

/// Whether the step runs in one launch (`policy::Policy::gdn_step`); checks the operands.
pub(crate) fn gdn_step_choice(inner: &Inner, s: GdnStep<'_>, dims: GdnDims) -> Result<policy::GdnStep> {
    Ok(inner.policy.gdn_step(&shape(s, dims)?))
}

/// The step in one launch, for the shapes `gdn_step_choice` gives `GdnStep::OneLaunch` (an error
/// otherwise).
pub(crate) fn gdn_step(inner: &Inner, s: GdnStep<'_>, dims: GdnDims, l2_eps: f32, eps: f32) -> Result<()> {
    let op = "gdn_recurrent_step";
    let (c, _) = check::gdn_recurrent_step(s, dims)?;
    if inner.policy.with_fusion().gdn_step(&shape(s, dims)?) != policy::GdnStep::OneLaunch {
        return Err(cuda_err(format!("{op}: the shape does not fit the one-launch kernel")));
    }
    let n = dims.hv * dims.dv;
    let ws = inner.workspaces()?;
    let mut prep_slots = Args::default();
    let preps = Preps::ask(inner, Producer::GatedNorm, s.out, 1, n, &mut prep_slots)?;
    let i32_of = |v: usize| i32::try_from(v).map_err(|_| cuda_err(format!("{op}: {v} exceeds i32")));
    let p = GdnStepParams {
        qkv: ptr(s.qkv, op)?,
        conv_w: ptr(s.conv_w, op)?,
        conv_state: ptr(s.conv_state, op)?,
        a: ptr(s.gates.a, op)?,
        b: ptr(s.gates.b, op)?,
        ssm_a: ptr(s.gates.ssm_a, op)?,
        dt_bias: ptr(s.gates.dt_bias, op)?,
        state: ptr(s.state, op)?,
        z: ptr(s.z, op)?,
        norm_w: ptr(s.norm_w, op)?,
        o: ptr(s.o, op)?,
        out: ptr(s.out, op)?,
        counters: inner.sync_counters(),
        p7: prep_slots.p[7],
        p5: prep_slots.p[5],
        p4: prep_slots.p[4],
        c: i32_of(c.c)?,
        hk: i32_of(dims.hk)?,
        hv: i32_of(dims.hv)?,
        dk: i32_of(dims.dk)?,
        dv: i32_of(dims.dv)?,
        eps_l2: l2_eps,
        eps,
        _pad: 0,
    };
    inner.kernel_rw(
        Launch {
            name: ("gdn_step", ""),
            grid: [grid_u32(op, "blocks", n / ROWS)?, 1, 1],
            block: 256,
            smem: 0,
            args: Args::from_pod(&p),
            phase: Phase::DeltaRule,
        },
        0.0,
        &[
            s.qkv,
            s.z,
            s.conv_w,
            s.gates.a,
            s.gates.b,
            s.gates.ssm_a,
            s.gates.dt_bias,
            s.norm_w,
        ],
        &[s.conv_state, s.state, s.o, s.out],
    )?;
    if let Some(p) = preps {
        p.made(inner, s.out)?;
    }
    inner.produced_by(s.out, Producer::GatedNorm)?;
    drop(ws);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn params_layout() {
        assert_eq!(std::mem::size_of::<super::GdnStepParams>(), 160);
    }
}
