//! The op implementations, one module per family; each lists its WGSL files in `SHADERS`.

mod attention;
mod conv;
mod delta;
mod eltwise;
mod linear;
mod moe;
mod norm;

pub(crate) use attention::{attention, rope_neox};
pub(crate) use conv::conv1d_causal_silu;
pub(crate) use delta::{delta_rule_chunked, delta_rule_recurrent};
pub(crate) use eltwise::{add_assign, argmax, gdn_gates, sigmoid_mul_assign, sigmoid_scale_add, split_qgate, swiglu};
pub(crate) use linear::{embed, matmul};
pub(crate) use moe::{moe_experts, moe_route};
pub(crate) use norm::{gated_rms_norm, l2_norm_qk, rms_norm};

/// Every op family's WGSL sources: (file stem, source).
pub(crate) const SHADERS: &[&[(&str, &str)]] = &[
    linear::SHADERS,
    eltwise::SHADERS,
    norm::SHADERS,
    conv::SHADERS,
    attention::SHADERS,
    delta::SHADERS,
    moe::SHADERS,
];
