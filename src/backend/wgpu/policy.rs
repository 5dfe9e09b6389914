//! Which fused decode dispatches run: pure functions of the device's side (`Device`, from
//! `Caps::device`) and the op's shapes and weight formats, each answering with an enum, so that
//! they are tested without a GPU and a plan compiler can ask them ahead of a run. The ops follow
//! the answer where the tensors allow it (a weight bound in pieces, a format the fused kernel
//! does not take: the ops check those and fall back to the unfused dispatches).
//!
//! | fused dispatch | needs | else |
//! |---|---|---|
//! | `matmul_group` of up to 4 (3) same-format products of one input in one dispatch (`matvec_group.wgsl`) | 9 (7) storage buffers per stage | one dispatch per product |
//! | `gdn_conv_gates` in one dispatch (`gdn_conv_gates.wgsl`) | 10 storage buffers per stage | `gdn_gates` + `conv1d_silu_l2qk` |
//! | `attn_qk_prep` in one dispatch (`attn_qk_prep.wgsl`) | 11 storage buffers per stage | q and k/v halves (`attn_prep_q.wgsl`, `attn_prep_kv.wgsl`; 7), else the six separate ops |
//! | the gated attention's output gate (with the packed-dot units, also the output's planes) in the decode merge of the split key range (`attention_combine_gate.wgsl`) | 4 storage buffers per stage | `attention_combine` + `sigmoid_mul_assign` (+ `mv_dot_prep` before the output projection) |
//! | an RMS norm writes its output's packed-dot planes (`*_rms_norm_dot`) | the packed-dot units, whole 256-element rows of whole 32-element groups | the norm, and the product's `mv_dot_prep` |
//! | the dense FFN's one-token SwiGLU writes its output's planes for the down product (`matvec_swiglu_xq`) | the packed-dot units, whole 256-element rows | `matvec_swiglu`, and the down product's `mv_dot_prep` |
//! | a decode MoE layer's shared expert inside the routed experts' dispatches, the weighted sum inside the down products (`moe_swiglu_sh.wgsl` + `moe_down_sh.wgsl`) | 7 storage buffers per stage | `moe_experts` (gate, up, down, `moe_combine`) + `matmul_swiglu` + `matmul` + `sigmoid_scale_add` |
//!
//! With `Device::fusion` off (`RILL_WGPU_FUSION=0`) every answer is the unfused one: one dispatch
//! per op, to tell a fused kernel's bug apart.

use super::geometry::{
    mv_group_bindings, ATT_GATE_BINDINGS, GATES_BINDINGS, MOE_SH_BINDINGS, PREP_BINDINGS, PREP_HALF_BINDINGS,
    SPLIT_MAX_ROWS,
};
use crate::backend::MAX_GROUP;
use crate::gguf::GgmlType;

/// The device's side of the decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Device {
    /// Storage buffers one kernel may bind.
    pub max_storage: u32,
    /// Fused dispatches allowed at all.
    pub fusion: bool,
    /// The packed-integer-dot decode units are on (`Caps::mv_dot`).
    pub dot: bool,
}

impl Device {
    /// Whether a fused kernel binding `n` storage buffers may run.
    fn fits(&self, n: u32) -> bool {
        self.fusion && n <= self.max_storage
    }
}

/// Most products of one input one `matvec_group` dispatch takes (1: a dispatch per product).
pub(crate) fn group_size(dev: Device) -> usize {
    (2..=MAX_GROUP)
        .rev()
        .find(|&n| dev.fits(mv_group_bindings(n as u32)))
        .unwrap_or(1)
}

/// The dispatches of a `matmul_group`: products `0..len` of `members` in one `matvec_group`
/// each (2 to `group_size`), the rest one dispatch each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Group {
    pub members: [usize; MAX_GROUP],
    pub len: usize,
}

impl Group {
    pub fn members(&self) -> &[usize] {
        &self.members[..self.len]
    }
}

/// The groups of the products of one input whose format is `Some` (those that can join one: one
/// token, a single binding, the matrix-vector kernel; the caller decides), in order: each takes
/// the first product not yet taken and those after it of its format, at most `group_size`.
pub(crate) fn product_groups(dev: Device, formats: &[Option<GgmlType>]) -> Vec<Group> {
    let most = group_size(dev);
    let mut taken = vec![false; formats.len()];
    let mut groups = Vec::new();
    if most < 2 {
        return groups;
    }
    for i in 0..formats.len() {
        let Some(ty) = formats[i].filter(|_| !taken[i]) else {
            continue;
        };
        let mut g = Group {
            members: [0; MAX_GROUP],
            len: 0,
        };
        for j in i..formats.len() {
            if g.len < most && !taken[j] && formats[j] == Some(ty) {
                g.members[g.len] = j;
                g.len += 1;
            }
        }
        if g.len >= 2 {
            for &j in g.members() {
                taken[j] = true;
            }
            groups.push(g);
        }
    }
    groups
}

/// How a Gated DeltaNet layer's convolution, q/k norms and gates run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gates {
    /// `gdn_gates` + `conv1d_silu_l2qk`.
    Separate,
    /// `gdn_conv_gates`: one dispatch.
    Fused,
}

pub(crate) fn gdn_gates(dev: Device) -> Gates {
    if dev.fits(GATES_BINDINGS) {
        Gates::Fused
    } else {
        Gates::Separate
    }
}

/// How `attn_qk_prep` runs: its kernels need 11 storage buffers in one dispatch, 7 in two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prep {
    /// The six separate ops.
    Separate,
    /// The q heads and the k/v heads in a dispatch each.
    Halves,
    /// One dispatch.
    One,
}

pub(crate) fn attn_prep(dev: Device) -> Prep {
    if dev.fits(PREP_BINDINGS) {
        Prep::One
    } else if dev.fits(PREP_HALF_BINDINGS) {
        Prep::Halves
    } else {
        Prep::Separate
    }
}

/// Where the gated attention's output gate is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttnGate {
    /// `sigmoid_mul_assign` after the attention.
    Separate,
    /// In the merge of the split key range (`attention_combine_gate`).
    InMerge,
}

/// For `rows` query rows (tokens x query heads): only a split key range has a merge.
pub(crate) fn attn_gate(dev: Device, rows: usize) -> AttnGate {
    if dev.fits(ATT_GATE_BINDINGS) && rows <= SPLIT_MAX_ROWS {
        AttnGate::InMerge
    } else {
        AttnGate::Separate
    }
}

/// What a one-token dense SwiGLU product writes besides its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SwigluOut {
    /// The output only (`matvec_swiglu`): the down product prepares its own planes.
    Plain,
    /// Also the output's packed-dot planes (`matvec_swiglu_xq`), whatever the gate's format: the
    /// down product's decides whether they are read.
    Planes,
}

/// For an output of `n_out` elements: the planes are whole 256-element K-quant rows. With 2 rows
/// per invocation its workgroups, owning whole 32-row blocks, cost more than the prep dispatch
/// saved (H200 9B q4_k_m, 188.6 t/s against 190.6); with the SwiGLU's 4 rows it wins, tg128 213.2
/// against 205.8 (interleaved medians).
pub(crate) fn swiglu_out(dev: Device, n_out: usize) -> SwigluOut {
    if dev.fusion && dev.dot && n_out.is_multiple_of(256) {
        SwigluOut::Planes
    } else {
        SwigluOut::Plain
    }
}

/// What an RMS norm writes besides its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormOut {
    /// The output only: a packed-dot product of it prepares its own planes (`mv_dot_prep`).
    Plain,
    /// Also the output's packed-dot planes, from registers (`*_rms_norm_dot`, ~3 us more than
    /// the plain norm, against `mv_dot_prep`'s ~12 us in the H200 profile).
    Planes,
}

/// For groups of `d` values over `n` elements: the packed-dot products take whole 256-element
/// K-quant rows of whole 32-element blocks.
pub(crate) fn norm_out(dev: Device, d: usize, n: usize) -> NormOut {
    if dev.fusion && dev.dot && d.is_multiple_of(32) && n.is_multiple_of(256) {
        NormOut::Planes
    } else {
        NormOut::Plain
    }
}

/// Most tokens the shared-expert kernels take in one call (decode and short verify steps).
pub(crate) const SHARED_MAX_T: usize = 4;
/// Most experts per token (`moe_route.wgsl`/`moe_combine.wgsl` keep per-slot workgroup arrays).
pub(crate) const MOE_MAX_K: usize = super::geometry::MOE_MAX_K as usize;

/// How a MoE layer's routed experts and shared expert run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MoeShared {
    /// The trait's composition: the experts, the shared expert's products, its gated sum.
    Composed,
    /// The shared expert as one more expert of each token inside the experts' two dispatches.
    InExperts,
}

/// A MoE layer's shape for `moe_shared`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MoeShape {
    pub n_tok: usize,
    /// Experts per token.
    pub k: usize,
    pub n_embd: usize,
    /// Hidden rows of a routed expert and of the shared one (the kernels take them equal).
    pub n_ff: usize,
    pub n_ff_shared: usize,
}

pub(crate) fn moe_shared(dev: Device, m: MoeShape) -> MoeShared {
    let shape_ok = (1..=SHARED_MAX_T).contains(&m.n_tok)
        && (1..=MOE_MAX_K).contains(&m.k)
        && m.n_embd > 0
        && m.n_ff > 0
        && m.n_ff_shared == m.n_ff;
    if dev.fits(MOE_SH_BINDINGS) && shape_ok {
        MoeShared::InExperts
    } else {
        MoeShared::Composed
    }
}

/// The fused dispatches in use on `dev`, in words (`Caps::describe`), e.g.
/// `fused: groups of 4, gates, prep in 1`.
pub(crate) fn describe(dev: Device) -> String {
    let mut parts = Vec::new();
    if group_size(dev) > 1 {
        parts.push(format!("groups of {}", group_size(dev)));
    }
    if gdn_gates(dev) == Gates::Fused {
        parts.push("gates".to_string());
    }
    if attn_gate(dev, 1) == AttnGate::InMerge {
        parts.push("attention gate".to_string());
    }
    let one = MoeShape {
        n_tok: 1,
        k: 1,
        n_embd: 1,
        n_ff: 1,
        n_ff_shared: 1,
    };
    if moe_shared(dev, one) == MoeShared::InExperts {
        parts.push("moe shared expert".to_string());
    }
    if swiglu_out(dev, 256) == SwigluOut::Planes {
        parts.push("swiglu planes".to_string());
    }
    if norm_out(dev, 32, 256) == NormOut::Planes {
        parts.push("norm planes".to_string());
    }
    match attn_prep(dev) {
        Prep::One => parts.push("prep in 1".to_string()),
        Prep::Halves => parts.push("prep in 2".to_string()),
        Prep::Separate => {}
    }
    if parts.is_empty() {
        "no fused decode dispatches".to_string()
    } else {
        format!("fused: {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests;
