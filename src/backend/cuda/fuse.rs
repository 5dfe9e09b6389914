//! The runs of a plan's ops this backend launches as one kernel (`backend::fusion`): which it
//! takes, and how it runs each. A run whose kernel does not fit its operands runs nothing here (or
//! only its first part) and the rest is matched again without that fusion.

use super::{ops, policy, CudaBackend};
use crate::backend::check;
use crate::backend::fusion::{Fuse, Fused, Fusion, FusionSet, MOE_FFN_ROUTED_OPS};
use crate::error::Result;

/// The fusions this backend has kernels for (attention's output gate has none of its own: it is
/// matched as `Attention` and `SigmoidMul`).
pub const FUSIONS: [Fusion; 11] = [
    Fusion::Group,
    Fusion::AddNorm,
    Fusion::MatmulAddNorm,
    Fusion::MatmulSwiglu,
    Fusion::ConvL2,
    Fusion::GdnConvGates,
    Fusion::GdnStep,
    Fusion::AttnPrep,
    Fusion::MoeExpertsShared,
    Fusion::MoeRouteExpertsShared,
    Fusion::MoeFfn,
];

impl Fuse for CudaBackend {
    fn fusions(&self) -> FusionSet {
        // `RILL_CUDA_FUSION=0` (`CudaOptions::fusion`): every op in a launch of its own.
        if self.inner.policy.fusion {
            FusionSet::of(&FUSIONS)
        } else {
            FusionSet::NONE
        }
    }

    fn run_fused(&self, f: &Fused<'_>) -> Result<usize> {
        let inner = &self.inner;
        let all = f.len();
        match *f {
            Fused::Group(ref p) => {
                let g = p.group();
                ops::linear::matmul_group(inner, g.ws, p.x, g.outs)?;
            }
            Fused::AddNorm(ref a) => ops::norm::add_rms_norm(inner, a.acc, a.y, a.w, a.eps, a.out)?,
            Fused::MatmulAddNorm { w, x, ref next } => {
                ops::norm::matmul_add_rms_norm(inner, w, x, next.y, next.add_norm())?;
            }
            Fused::MatmulSwiglu {
                w_gate,
                w_up,
                x,
                gate_tmp,
                up_tmp,
                out,
            } => ops::linear::matmul_swiglu(inner, w_gate, w_up, x, gate_tmp, up_tmp, out)?,
            Fused::ConvL2 {
                x,
                w,
                state,
                out,
                dims,
                eps,
            } => ops::conv::conv1d_silu_l2qk(inner, x, w, state, out, dims, eps)?,
            Fused::GdnConvGates {
                x,
                w,
                state,
                out,
                dims,
                eps,
                gates,
            } => ops::conv::gdn_conv_gates(inner, x, w, state, out, dims, eps, gates)?,
            Fused::GdnStep {
                step,
                dims,
                l2_eps,
                eps,
            } => match ops::gdn_step::gdn_step_choice(inner, step, dims)? {
                policy::GdnStep::OneLaunch => ops::gdn_step::gdn_step(inner, step, dims, l2_eps, eps)?,
                policy::GdnStep::Ops => return Ok(0),
            },
            Fused::AttnPrep {
                prep,
                head_dim,
                n_rot,
                theta,
                eps,
                k_cache,
                v_cache,
                pos,
            } => ops::attention::attn_qk_prep(inner, prep, head_dim, n_rot, theta, eps, k_cache, v_cache, pos)?,
            Fused::MoeExpertsShared { x, experts, out } => {
                match ops::linear::shared_expert_choice(inner, x, experts, out)? {
                    policy::SharedExpert::InExpertLaunches => {
                        ops::linear::moe_experts_shared(inner, x, experts, out, false)?
                    }
                    policy::SharedExpert::OwnLaunches => return Ok(0),
                }
            }
            Fused::MoeRouteExpertsShared {
                x,
                logits,
                k,
                scale,
                experts,
                out,
                ref next,
            } => {
                let n = next.as_ref().map(|n| n.add_norm());
                check::moe_route_experts_shared(x, logits, k, experts, out, n)?;
                ops::moe::moe_route(inner, logits, k, scale, experts.ids, experts.weights)?;
                // In decode the experts' down product adds into the residual itself and the norm
                // reads the finished row; otherwise the experts and `next` are matched again.
                if !experts_add_norm(self, x, experts, n)? {
                    return Ok(1);
                }
            }
            Fused::MoeFfn {
                ref input,
                experts,
                ref next,
                ..
            } => {
                let (Some(m), n) = (f.moe_ffn(), next.as_ref().map(|n| n.add_norm())) else {
                    return Ok(0);
                };
                check::moe_ffn(m, n)?;
                // The residual add, the norm, the router and the routing in one launch.
                match ops::norm::moe_ffn_choice(inner, &m) {
                    policy::MoeFfn::NormRoute => ops::norm::moe_norm_route(inner, &m)?,
                    policy::MoeFfn::Ops => return Ok(0),
                }
                if !experts_add_norm(self, input.out, experts, n)? {
                    return Ok(MOE_FFN_ROUTED_OPS);
                }
            }
            Fused::AttentionGated { .. } => return Ok(0),
        }
        Ok(all)
    }
}

/// The routed and shared experts of `x` with `next`'s residual add and norm, where the experts'
/// down product can add into the residual itself (decode); false (nothing run) otherwise.
fn experts_add_norm(
    be: &CudaBackend,
    x: &crate::backend::Tensor,
    e: crate::backend::MoeExperts<'_>,
    next: Option<crate::backend::AddNorm<'_>>,
) -> Result<bool> {
    let Some(n) = next else { return Ok(false) };
    match ops::norm::moe_experts_add_norm_choice(&be.inner, x, e, n)? {
        policy::AddNorm::InProduct { .. } => {
            ops::norm::moe_experts_add_rms_norm(&be.inner, x, e, n)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}
