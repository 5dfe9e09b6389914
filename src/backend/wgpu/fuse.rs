//! The runs of a plan's ops this backend launches as one dispatch sequence (`backend::fusion`):
//! which it takes, and how it runs each. A run whose kernel does not fit its operands (the
//! adapter's binding limits, shapes) runs nothing here and is matched again without that fusion.

use super::{ops, WgpuBackend};
use crate::backend::fusion::{Fuse, Fused, Fusion, FusionSet};
use crate::error::Result;

/// The fusions this backend has kernels for. A MoE FFN's norm, router and routing and a block's
/// last product with its residual add have none of their own here: those runs are matched as
/// their parts (`AddNorm`, `Group`, `MoeExpertsShared`).
pub const FUSIONS: [Fusion; 8] = [
    Fusion::Group,
    Fusion::AddNorm,
    Fusion::MatmulSwiglu,
    Fusion::ConvL2,
    Fusion::GdnConvGates,
    Fusion::AttnPrep,
    Fusion::AttentionGated,
    Fusion::MoeExpertsShared,
];

impl Fuse for WgpuBackend {
    fn fusions(&self) -> FusionSet {
        // `RILL_WGPU_FUSION=0` (`WgpuOptions::fusion`): one dispatch per op.
        if self.caps.fusion {
            FusionSet::of(&FUSIONS)
        } else {
            FusionSet::NONE
        }
    }

    fn run_fused(&self, f: &Fused<'_>) -> Result<usize> {
        let all = f.len();
        match *f {
            Fused::Group(ref p) => {
                let g = p.group();
                ops::matmul_group(self, g.ws, p.x, g.outs)?;
            }
            Fused::AddNorm(ref a) => ops::add_rms_norm(self, a.acc, a.y, a.w, a.eps, a.out)?,
            Fused::MatmulSwiglu {
                w_gate,
                w_up,
                x,
                gate_tmp,
                up_tmp,
                out,
            } => ops::matmul_swiglu(self, w_gate, w_up, x, gate_tmp, up_tmp, out)?,
            Fused::ConvL2 {
                x,
                w,
                state,
                out,
                dims,
                eps,
            } => ops::conv1d_silu_l2qk(self, x, w, state, out, dims, eps)?,
            Fused::GdnConvGates {
                x,
                w,
                state,
                out,
                dims,
                eps,
                gates,
            } => ops::gdn_conv_gates(self, x, w, state, out, dims, eps, gates)?,
            Fused::AttnPrep {
                prep,
                head_dim,
                n_rot,
                theta,
                eps,
                k_cache,
                v_cache,
                pos,
            } => ops::attn_qk_prep(self, prep, head_dim, n_rot, theta, eps, k_cache, v_cache, pos)?,
            Fused::AttentionGated {
                q,
                k_cache,
                v_cache,
                pos,
                dims,
                scale,
                gate,
                out,
            } => ops::attention_gated(self, q, k_cache, v_cache, pos, dims, scale, gate, out)?,
            Fused::MoeExpertsShared { x, experts, out } => {
                if !ops::moe_experts_shared(self, x, experts, out)? {
                    return Ok(0);
                }
            }
            Fused::MatmulAddNorm { .. }
            | Fused::GdnStep { .. }
            | Fused::MoeRouteExpertsShared { .. }
            | Fused::MoeFfn { .. } => return Ok(0),
        }
        Ok(all)
    }
}
