//! Fusion: runs of a plan's ops that a GPU backend may launch as one kernel.
//!
//! A plan (`super::plan`) lists the model's plain ops. This module finds the runs a backend can
//! take in one launch (`match_at`: pure pattern matching over the ops' operands, with the rule that
//! a fused kernel may leave an intermediate unwritten only when no later op reads it) and drives a
//! backend through a plan (`run`). Which fusions a backend takes is its own decision
//! (`Fuse::fusions`, from its policy), and so is how it runs each one (`Fuse::run_fused`); where a
//! fused kernel turns out not to fit, the backend runs a prefix or none of the run's ops and the
//! rest is matched again without that fusion, down to the plain ops.
//!
//! The operand structs below are what the fused kernels take. They are not part of the backend
//! contract: the executor never builds them.

use super::plan::{DeltaAlgo, Op};
use super::{Backend, GdnDims, Tensor};
use crate::error::Result;

/// Most products of one input a group takes (a Gated DeltaNet layer has four).
pub const MAX_GROUP: usize = 4;

/// The kinds of fused runs, each named after what it computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fusion {
    /// Products of one input: `Matmul` x 2..=`MAX_GROUP`.
    Group,
    /// A residual add and the norm of the sum: `Add`, `RmsNorm`.
    AddNorm,
    /// A block's last product, its residual add and the next norm, with the next block's first
    /// products of the normed rows when they follow: `Matmul`, `Add`, `RmsNorm` [, `Group`].
    MatmulAddNorm,
    /// The FFN's input side: `Matmul` (gate), `Matmul` (up), `Swiglu`.
    MatmulSwiglu,
    /// The conv and the q/k L2 norm: `Conv1dSilu`, `L2NormQk`.
    ConvL2,
    /// The Gated DeltaNet's per-token preparation: `GdnGates`, `Conv1dSilu`, `L2NormQk`.
    GdnConvGates,
    /// The recurrent middle of a Gated DeltaNet layer: `GdnConvGates`' ops, `DeltaRule`
    /// (recurrent), `GatedRmsNorm`.
    GdnStep,
    /// The attention's q/k preparation: `SplitQGate`, `RmsNorm` x 2, `Rope` x 2, `KvStore`.
    AttnPrep,
    /// Attention and its output gate: `Attention`, `SigmoidMul`.
    AttentionGated,
    /// The routed and the shared experts: `MoeExperts`, `Matmul` x 2, `Swiglu`, `Matmul`,
    /// `SigmoidScaleAdd`.
    MoeExpertsShared,
    /// The routing and `MoeExpertsShared` [, `AddNorm` of the output [, `Group`]].
    MoeRouteExpertsShared,
    /// A MoE FFN from the mixer's output: `AddNorm`, `Matmul` (router), `Matmul` (shared gate),
    /// `MoeRouteExpertsShared`.
    MoeFfn,
}

impl Fusion {
    pub const ALL: [Fusion; 12] = [
        Fusion::Group,
        Fusion::AddNorm,
        Fusion::MatmulAddNorm,
        Fusion::MatmulSwiglu,
        Fusion::ConvL2,
        Fusion::GdnConvGates,
        Fusion::GdnStep,
        Fusion::AttnPrep,
        Fusion::AttentionGated,
        Fusion::MoeExpertsShared,
        Fusion::MoeRouteExpertsShared,
        Fusion::MoeFfn,
    ];

    /// The name a plan's launch list shows.
    pub fn name(self) -> &'static str {
        match self {
            Fusion::Group => "matmul_group",
            Fusion::AddNorm => "add_rms_norm",
            Fusion::MatmulAddNorm => "matmul_add_rms_norm",
            Fusion::MatmulSwiglu => "matmul_swiglu",
            Fusion::ConvL2 => "conv1d_silu_l2qk",
            Fusion::GdnConvGates => "gdn_conv_gates",
            Fusion::GdnStep => "gdn_step",
            Fusion::AttnPrep => "attn_qk_prep",
            Fusion::AttentionGated => "attention_gated",
            Fusion::MoeExpertsShared => "moe_experts_shared",
            Fusion::MoeRouteExpertsShared => "moe_route_experts_shared",
            Fusion::MoeFfn => "moe_ffn",
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A set of fusions (what a backend takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FusionSet(u32);

impl FusionSet {
    pub const NONE: FusionSet = FusionSet(0);

    pub fn of(kinds: &[Fusion]) -> FusionSet {
        FusionSet(kinds.iter().fold(0, |s, k| s | k.bit()))
    }
    pub fn has(self, k: Fusion) -> bool {
        self.0 & k.bit() != 0
    }
    pub fn without(self, k: Fusion) -> FusionSet {
        FusionSet(self.0 & !k.bit())
    }
}

// ---- the fused kernels' operands --------------------------------------------------------------

/// Products of one input: `outs[i] = matmul(ws[i], x)`.
#[derive(Clone, Copy)]
pub struct Group<'a> {
    pub ws: &'a [&'a Tensor],
    pub outs: &'a [&'a Tensor],
}

/// The residual update and RMSNorm that follow a block's output `y`: `acc += y`, then
/// `out = rms_norm(acc; w, eps)`, and with `then` the next block's first products of `out`.
#[derive(Clone, Copy)]
pub struct AddNorm<'a> {
    pub acc: &'a Tensor,
    pub w: &'a Tensor,
    pub eps: f32,
    pub out: &'a Tensor,
    pub then: Option<Group<'a>>,
}

/// The inputs and outputs of `gdn_gates`.
#[derive(Clone, Copy)]
pub struct GdnGates<'a> {
    pub a: &'a Tensor,
    pub b: &'a Tensor,
    pub ssm_a: &'a Tensor,
    pub dt_bias: &'a Tensor,
    pub g: &'a Tensor,
    pub beta: &'a Tensor,
}

/// The recurrent middle of a Gated DeltaNet layer: the projections `qkv` `[T, conv_dim]` and `z`
/// `[T, Hv*dv]`, the conv weights `[conv_dim, K]` and state `[K-1, conv_dim]` (updated), the gates'
/// inputs and outputs, the delta-rule state `[Hv, dv, dk]` (updated), the gated norm's weight `[dv]`,
/// the intermediates `conv_out` `[T, conv_dim]` and `o` `[T, Hv*dv]` (a fused kernel may leave them
/// unwritten), and the output `out` `[T, Hv*dv]`.
#[derive(Clone, Copy)]
pub struct GdnStep<'a> {
    pub qkv: &'a Tensor,
    pub z: &'a Tensor,
    pub conv_w: &'a Tensor,
    pub conv_state: &'a Tensor,
    pub gates: GdnGates<'a>,
    pub state: &'a Tensor,
    pub norm_w: &'a Tensor,
    pub conv_out: &'a Tensor,
    pub o: &'a Tensor,
    pub out: &'a Tensor,
}

/// The attention's q/k preparation: the projections `qg` `[T, 2*H*D]` (query and gate interleaved
/// per head), `k` and `v` `[T, Hkv*D]`; the per-head norm weights `[D]`; the intermediate `q` and
/// the outputs `gate`, `q_normed` `[T, H*D]` and `k_normed` `[T, Hkv*D]`.
#[derive(Clone, Copy)]
pub struct AttnPrep<'a> {
    pub qg: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub q_norm: &'a Tensor,
    pub k_norm: &'a Tensor,
    pub q: &'a Tensor,
    pub gate: &'a Tensor,
    pub q_normed: &'a Tensor,
    pub k_normed: &'a Tensor,
}

/// The shared expert of a MoE FFN: its weights `gate`, `up` `[n_ff_sh, d]` and `down`
/// `[d, n_ff_sh]`, the logit of its gate `gate_logit` `[T, 1]`, and the intermediates `gate_tmp`,
/// `up_tmp`, `act` `[T, n_ff_sh]` and `out` `[T, d]`.
#[derive(Clone, Copy)]
pub struct SharedExpert<'a> {
    pub gate: &'a Tensor,
    pub up: &'a Tensor,
    pub down: &'a Tensor,
    pub gate_logit: &'a Tensor,
    pub gate_tmp: &'a Tensor,
    pub up_tmp: &'a Tensor,
    pub act: &'a Tensor,
    pub out: &'a Tensor,
}

/// A routed MoE FFN's experts: gate and up `[E, n_ff, d]`, down `[E, d, n_ff]`, the routing's
/// `ids` (U32) and `weights` `[T, k]`, and the shared expert `sh`.
#[derive(Clone, Copy)]
pub struct MoeExperts<'a> {
    pub gate_exps: &'a Tensor,
    pub up_exps: &'a Tensor,
    pub down_exps: &'a Tensor,
    pub ids: &'a Tensor,
    pub weights: &'a Tensor,
    pub sh: SharedExpert<'a>,
}

impl<'a> MoeExperts<'a> {
    /// What the experts' products read besides x.
    pub fn reads(&self) -> [&'a Tensor; 9] {
        let sh = self.sh;
        [
            self.gate_exps,
            self.up_exps,
            self.down_exps,
            self.ids,
            self.weights,
            sh.gate,
            sh.up,
            sh.down,
            sh.gate_logit,
        ]
    }
    /// The shared expert's intermediates (written).
    pub fn scratch(&self) -> [&'a Tensor; 4] {
        [self.sh.gate_tmp, self.sh.up_tmp, self.sh.act, self.sh.out]
    }
}

/// A MoE layer's FFN from its mixer's output `y` on: the residual add and input norm `input`, the
/// router `[E, d]` and the shared expert's gate `[1, d]` with their products `logits` `[T, E]` and
/// `experts.sh.gate_logit`, the routing (`k`, `scale`), the experts and their output `out`.
#[derive(Clone, Copy)]
pub struct MoeFfn<'a> {
    pub input: AddNorm<'a>,
    pub y: &'a Tensor,
    pub router: &'a Tensor,
    pub shared_gate: &'a Tensor,
    pub logits: &'a Tensor,
    pub k: usize,
    pub scale: f32,
    pub experts: MoeExperts<'a>,
    pub out: &'a Tensor,
}

// ---- matched runs -----------------------------------------------------------------------------

/// The products of one input, as matched.
#[derive(Clone, Copy)]
pub struct Products<'a> {
    pub x: &'a Tensor,
    ws: [&'a Tensor; MAX_GROUP],
    outs: [&'a Tensor; MAX_GROUP],
    n: usize,
}

impl<'a> Products<'a> {
    pub fn group(&self) -> Group<'_> {
        Group {
            ws: &self.ws[..self.n],
            outs: &self.outs[..self.n],
        }
    }
    pub fn len(&self) -> usize {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// A residual add and norm as matched, with the products of the normed rows that follow.
#[derive(Clone, Copy)]
pub struct AddNormRun<'a> {
    /// The added value.
    pub y: &'a Tensor,
    pub acc: &'a Tensor,
    pub w: &'a Tensor,
    pub eps: f32,
    pub out: &'a Tensor,
    pub then: Option<Products<'a>>,
}

impl<'a> AddNormRun<'a> {
    pub fn add_norm(&self) -> AddNorm<'_> {
        AddNorm {
            acc: self.acc,
            w: self.w,
            eps: self.eps,
            out: self.out,
            then: self.then.as_ref().map(|p| p.group()),
        }
    }
    /// Ops of the run: the add, the norm and the products.
    pub fn len(&self) -> usize {
        2 + self.then.map_or(0, |p| p.n)
    }
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A run of ops matched as one fusion, with the operands its kernel takes.
#[derive(Clone, Copy)]
pub enum Fused<'a> {
    Group(Products<'a>),
    AddNorm(AddNormRun<'a>),
    MatmulAddNorm {
        w: &'a Tensor,
        x: &'a Tensor,
        next: AddNormRun<'a>,
    },
    MatmulSwiglu {
        w_gate: &'a Tensor,
        w_up: &'a Tensor,
        x: &'a Tensor,
        gate_tmp: &'a Tensor,
        up_tmp: &'a Tensor,
        out: &'a Tensor,
    },
    ConvL2 {
        x: &'a Tensor,
        w: &'a Tensor,
        state: &'a Tensor,
        out: &'a Tensor,
        dims: GdnDims,
        eps: f32,
    },
    GdnConvGates {
        x: &'a Tensor,
        w: &'a Tensor,
        state: &'a Tensor,
        out: &'a Tensor,
        dims: GdnDims,
        eps: f32,
        gates: GdnGates<'a>,
    },
    GdnStep {
        step: GdnStep<'a>,
        dims: GdnDims,
        l2_eps: f32,
        eps: f32,
    },
    AttnPrep {
        prep: AttnPrep<'a>,
        head_dim: usize,
        n_rot: usize,
        theta: f32,
        eps: f32,
        k_cache: &'a Tensor,
        v_cache: &'a Tensor,
        pos: super::Pos<'a>,
    },
    AttentionGated {
        q: &'a Tensor,
        k_cache: &'a Tensor,
        v_cache: &'a Tensor,
        pos: super::Pos<'a>,
        dims: super::AttnDims,
        scale: f32,
        gate: &'a Tensor,
        out: &'a Tensor,
    },
    MoeExpertsShared {
        x: &'a Tensor,
        experts: MoeExperts<'a>,
        out: &'a Tensor,
    },
    MoeRouteExpertsShared {
        x: &'a Tensor,
        logits: &'a Tensor,
        k: usize,
        scale: f32,
        experts: MoeExperts<'a>,
        out: &'a Tensor,
        next: Option<AddNormRun<'a>>,
    },
    MoeFfn {
        input: AddNormRun<'a>,
        router: &'a Tensor,
        shared_gate: &'a Tensor,
        logits: &'a Tensor,
        k: usize,
        scale: f32,
        experts: MoeExperts<'a>,
        out: &'a Tensor,
        next: Option<AddNormRun<'a>>,
    },
}

/// Ops of `MoeExpertsShared`'s run.
const EXPERTS_SHARED_OPS: usize = 6;
/// Ops of a `MoeFfn` run up to and including its routing.
pub const MOE_FFN_ROUTED_OPS: usize = 5;

impl<'a> Fused<'a> {
    pub fn kind(&self) -> Fusion {
        match self {
            Fused::Group(_) => Fusion::Group,
            Fused::AddNorm(_) => Fusion::AddNorm,
            Fused::MatmulAddNorm { .. } => Fusion::MatmulAddNorm,
            Fused::MatmulSwiglu { .. } => Fusion::MatmulSwiglu,
            Fused::ConvL2 { .. } => Fusion::ConvL2,
            Fused::GdnConvGates { .. } => Fusion::GdnConvGates,
            Fused::GdnStep { .. } => Fusion::GdnStep,
            Fused::AttnPrep { .. } => Fusion::AttnPrep,
            Fused::AttentionGated { .. } => Fusion::AttentionGated,
            Fused::MoeExpertsShared { .. } => Fusion::MoeExpertsShared,
            Fused::MoeRouteExpertsShared { .. } => Fusion::MoeRouteExpertsShared,
            Fused::MoeFfn { .. } => Fusion::MoeFfn,
        }
    }

    /// How many of the plan's ops the run covers.
    pub fn len(&self) -> usize {
        match self {
            Fused::Group(p) => p.n,
            Fused::AddNorm(a) => a.len(),
            Fused::MatmulAddNorm { next, .. } => 1 + next.len(),
            Fused::MatmulSwiglu { .. } => 3,
            Fused::ConvL2 { .. } => 2,
            Fused::GdnConvGates { .. } => 3,
            Fused::GdnStep { .. } => 5,
            Fused::AttnPrep { .. } => 6,
            Fused::AttentionGated { .. } => 2,
            Fused::MoeExpertsShared { .. } => EXPERTS_SHARED_OPS,
            Fused::MoeRouteExpertsShared { next, .. } => 1 + EXPERTS_SHARED_OPS + next.map_or(0, |n| n.len()),
            Fused::MoeFfn { next, .. } => MOE_FFN_ROUTED_OPS + EXPERTS_SHARED_OPS + next.map_or(0, |n| n.len()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> Fused<'a> {
    /// `MoeFfn`'s operands as its kernels take them.
    pub fn moe_ffn(&self) -> Option<MoeFfn<'_>> {
        match self {
            Fused::MoeFfn {
                input,
                router,
                shared_gate,
                logits,
                k,
                scale,
                experts,
                out,
                ..
            } => Some(MoeFfn {
                input: input.add_norm(),
                y: input.y,
                router,
                shared_gate,
                logits,
                k: *k,
                scale: *scale,
                experts: *experts,
                out,
            }),
            _ => None,
        }
    }
}

// ---- matching ---------------------------------------------------------------------------------

fn same(a: &Tensor, b: &Tensor) -> bool {
    a.same_buffer(b)
}

/// Whether no op from `from` on reads `t` before writing all of it: a fused kernel may then leave
/// it unwritten. An in-place op (which reads and writes) counts as a read.
fn dead_after(ops: &[Op<'_>], from: usize, t: &Tensor) -> bool {
    for op in ops.iter().skip(from) {
        if op.reads().iter().any(|r| same(r, t)) {
            return false;
        }
        if op.writes().iter().any(|w| same(w, t)) {
            return true;
        }
    }
    true
}

/// The products of one input starting at `i` (at least two, at most `MAX_GROUP`, ending before
/// `end` and before a `MatmulSwiglu` run).
fn products<'a>(ops: &[Op<'a>], i: usize, end: usize, x: Option<&Tensor>) -> Option<Products<'a>> {
    let Some(&Op::Matmul { w, x: x0, out }) = ops.get(i) else {
        return None;
    };
    if i >= end || x.is_some_and(|x| !same(x, x0)) || swiglu_at(ops, i, end).is_some() {
        return None;
    }
    let mut p = Products {
        x: x0,
        ws: [w; MAX_GROUP],
        outs: [out; MAX_GROUP],
        n: 1,
    };
    while p.n < MAX_GROUP && i + p.n < end {
        match ops[i + p.n] {
            Op::Matmul { w, x, out } if same(x, x0) && swiglu_at(ops, i + p.n, end).is_none() => {
                // No product may read another's output.
                if p.outs[..p.n].iter().any(|o| same(o, x) || same(o, out)) {
                    break;
                }
                p.ws[p.n] = w;
                p.outs[p.n] = out;
                p.n += 1;
            }
            _ => break,
        }
    }
    (p.n >= 2).then_some(p)
}

/// `Add` then the norm of the sum at `i`, with the following products of the normed rows when
/// `then` is asked for and they follow.
fn add_norm_at<'a>(ops: &[Op<'a>], i: usize, end: usize, then: bool) -> Option<AddNormRun<'a>> {
    if i + 2 > end {
        return None;
    }
    let (Op::Add { acc, x: y }, Op::RmsNorm { x, w, eps, out }) = (ops[i], ops[i + 1]) else {
        return None;
    };
    if !same(acc, x) || same(out, acc) || same(out, y) {
        return None;
    }
    let then = if then {
        products(ops, i + 2, end, Some(out))
    } else {
        None
    };
    Some(AddNormRun {
        y,
        acc,
        w,
        eps,
        out,
        then,
    })
}

/// `Matmul` (gate), `Matmul` (up) of one input and their SwiGLU at `i`.
fn swiglu_at<'a>(ops: &[Op<'a>], i: usize, end: usize) -> Option<Fused<'a>> {
    if i + 3 > end {
        return None;
    }
    let (Op::Matmul { w: wg, x, out: g }, Op::Matmul { w: wu, x: x2, out: u }, Op::Swiglu { gate, up, out }) =
        (ops[i], ops[i + 1], ops[i + 2])
    else {
        return None;
    };
    if !same(x, x2) || !same(g, gate) || !same(u, up) || same(g, u) {
        return None;
    }
    if !dead_after(ops, i + 3, g) || !dead_after(ops, i + 3, u) {
        return None;
    }
    Some(Fused::MatmulSwiglu {
        w_gate: wg,
        w_up: wu,
        x,
        gate_tmp: g,
        up_tmp: u,
        out,
    })
}

fn conv_l2_at<'a>(ops: &[Op<'a>], i: usize, end: usize) -> Option<Fused<'a>> {
    if i + 2 > end {
        return None;
    }
    let (Op::Conv1dSilu { x, w, state, out }, Op::L2NormQk { u, dims, eps }) = (ops[i], ops[i + 1]) else {
        return None;
    };
    same(u, out).then_some(Fused::ConvL2 {
        x,
        w,
        state,
        out,
        dims,
        eps,
    })
}

fn gdn_conv_gates_at<'a>(ops: &[Op<'a>], i: usize, end: usize) -> Option<Fused<'a>> {
    let Some(&Op::GdnGates {
        a,
        b,
        ssm_a,
        dt_bias,
        g,
        beta,
    }) = ops.get(i)
    else {
        return None;
    };
    let Some(Fused::ConvL2 {
        x,
        w,
        state,
        out,
        dims,
        eps,
    }) = conv_l2_at(ops, i + 1, end)
    else {
        return None;
    };
    Some(Fused::GdnConvGates {
        x,
        w,
        state,
        out,
        dims,
        eps,
        gates: GdnGates {
            a,
            b,
            ssm_a,
            dt_bias,
            g,
            beta,
        },
    })
}

fn gdn_step_at<'a>(ops: &[Op<'a>], i: usize, end: usize) -> Option<Fused<'a>> {
    if i + 5 > end {
        return None;
    }
    let Some(Fused::GdnConvGates {
        x,
        w,
        state: conv_state,
        out: conv_out,
        dims,
        eps: l2_eps,
        gates,
    }) = gdn_conv_gates_at(ops, i, end)
    else {
        return None;
    };
    let (
        Op::DeltaRule {
            u,
            g,
            beta,
            state,
            out: o,
            dims: d2,
            algo: DeltaAlgo::Recurrent,
        },
        Op::GatedRmsNorm {
            x: gx,
            z,
            w: norm_w,
            eps,
            out,
        },
    ) = (ops[i + 3], ops[i + 4])
    else {
        return None;
    };
    let wired = same(u, conv_out) && same(g, gates.g) && same(beta, gates.beta) && same(gx, o) && d2 == dims;
    // The fused kernel may keep the intermediates on chip.
    let on_chip = [conv_out, o, gates.g, gates.beta];
    if !wired || !on_chip.iter().all(|t| dead_after(ops, i + 5, t)) {
        return None;
    }
    Some(Fused::GdnStep {
        step: GdnStep {
            qkv: x,
            z,
            conv_w: w,
            conv_state,
            gates,
            state,
            norm_w,
            conv_out,
            o,
            out,
        },
        dims,
        l2_eps,
        eps,
    })
}

fn attn_prep_at<'a>(ops: &[Op<'a>], i: usize, end: usize) -> Option<Fused<'a>> {
    if i + 6 > end {
        return None;
    }
    let (
        Op::SplitQGate { qg, head_dim, q, gate },
        Op::RmsNorm {
            x: qx,
            w: q_norm,
            eps,
            out: q_normed,
        },
        Op::RmsNorm {
            x: k,
            w: k_norm,
            eps: eps_k,
            out: k_normed,
        },
    ) = (ops[i], ops[i + 1], ops[i + 2])
    else {
        return None;
    };
    let (
        Op::Rope {
            x: rq,
            head_dim: hq,
            n_rot,
            theta,
            pos,
        },
        Op::Rope {
            x: rk,
            head_dim: hk,
            n_rot: n_rot_k,
            theta: theta_k,
            ..
        },
        Op::KvStore {
            k: kk,
            v,
            k_cache,
            v_cache,
            ..
        },
    ) = (ops[i + 3], ops[i + 4], ops[i + 5])
    else {
        return None;
    };
    let wired = same(qx, q)
        && same(rq, q_normed)
        && same(rk, k_normed)
        && same(kk, k_normed)
        && eps == eps_k
        && (hq, hk) == (head_dim, head_dim)
        && n_rot == n_rot_k
        && theta == theta_k;
    if !wired || !dead_after(ops, i + 6, q) {
        return None;
    }
    Some(Fused::AttnPrep {
        prep: AttnPrep {
            qg,
            k,
            v,
            q_norm,
            k_norm,
            q,
            gate,
            q_normed,
            k_normed,
        },
        head_dim,
        n_rot,
        theta,
        eps,
        k_cache,
        v_cache,
        pos,
    })
}

fn attention_gated_at<'a>(ops: &[Op<'a>], i: usize, end: usize) -> Option<Fused<'a>> {
    if i + 2 > end {
        return None;
    }
    let (
        Op::Attention {
            q,
            k_cache,
            v_cache,
            pos,
            dims,
            scale,
            out,
        },
        Op::SigmoidMul { x, gate },
    ) = (ops[i], ops[i + 1])
    else {
        return None;
    };
    same(x, out).then_some(Fused::AttentionGated {
        q,
        k_cache,
        v_cache,
        pos,
        dims,
        scale,
        gate,
        out,
    })
}

fn experts_shared_at<'a>(ops: &[Op<'a>], i: usize, end: usize) -> Option<Fused<'a>> {
    if i + EXPERTS_SHARED_OPS > end {
        return None;
    }
    let Op::MoeExperts {
        x,
        gate_exps,
        up_exps,
        down_exps,
        ids,
        weights,
        out,
    } = ops[i]
    else {
        return None;
    };
    let Some(Fused::MatmulSwiglu {
        w_gate,
        w_up,
        x: sx,
        gate_tmp,
        up_tmp,
        out: act,
    }) = swiglu_at(ops, i + 1, end)
    else {
        return None;
    };
    let (
        Op::Matmul {
            w: down,
            x: dx,
            out: sh_out,
        },
        Op::SigmoidScaleAdd { acc, x: ax, gate_logit },
    ) = (ops[i + 4], ops[i + 5])
    else {
        return None;
    };
    let wired = same(sx, x) && same(dx, act) && same(acc, out) && same(ax, sh_out);
    let done = i + EXPERTS_SHARED_OPS;
    if !wired || !dead_after(ops, done, act) || !dead_after(ops, done, sh_out) {
        return None;
    }
    Some(Fused::MoeExpertsShared {
        x,
        experts: MoeExperts {
            gate_exps,
            up_exps,
            down_exps,
            ids,
            weights,
            sh: SharedExpert {
                gate: w_gate,
                up: w_up,
                down,
                gate_logit,
                gate_tmp,
                up_tmp,
                act,
                out: sh_out,
            },
        },
        out,
    })
}

/// The residual add of an op's output `y` and the norm after it, at `i`, when `y` is not needed
/// afterwards (a fused kernel may add into the residual without writing `y`).
fn next_of<'a>(ops: &[Op<'a>], i: usize, end: usize, y: &Tensor) -> Option<AddNormRun<'a>> {
    let n = add_norm_at(ops, i, end, true)?;
    (same(n.y, y) && dead_after(ops, i + n.len(), y)).then_some(n)
}

fn route_experts_shared_at<'a>(ops: &[Op<'a>], i: usize, end: usize) -> Option<Fused<'a>> {
    let Some(&Op::MoeRoute {
        logits,
        k,
        scale,
        ids,
        weights,
    }) = ops.get(i)
    else {
        return None;
    };
    let Some(Fused::MoeExpertsShared { x, experts, out }) = experts_shared_at(ops, i + 1, end) else {
        return None;
    };
    if !same(experts.ids, ids) || !same(experts.weights, weights) {
        return None;
    }
    let next = next_of(ops, i + 1 + EXPERTS_SHARED_OPS, end, out);
    Some(Fused::MoeRouteExpertsShared {
        x,
        logits,
        k,
        scale,
        experts,
        out,
        next,
    })
}

fn moe_ffn_at<'a>(ops: &[Op<'a>], i: usize, end: usize) -> Option<Fused<'a>> {
    let input = add_norm_at(ops, i, end, false)?;
    let (
        Some(&Op::Matmul {
            w: router,
            x: rx,
            out: logits,
        }),
        Some(&Op::Matmul {
            w: shared_gate,
            x: gx,
            out: gl,
        }),
    ) = (ops.get(i + 2), ops.get(i + 3))
    else {
        return None;
    };
    let Some(Fused::MoeRouteExpertsShared {
        x,
        logits: l2,
        k,
        scale,
        experts,
        out,
        next,
    }) = route_experts_shared_at(ops, i + 4, end)
    else {
        return None;
    };
    let wired = same(rx, input.out)
        && same(gx, input.out)
        && same(x, input.out)
        && same(l2, logits)
        && same(gl, experts.sh.gate_logit);
    // The mixer's output `y` is consumed by the residual add inside the fused launch.
    let y_free = same(input.y, out) || dead_after(ops, i + 2, input.y);
    let done = i + MOE_FFN_ROUTED_OPS + EXPERTS_SHARED_OPS + next.map_or(0, |n| n.len());
    (wired && y_free && dead_after(ops, done, logits)).then_some(Fused::MoeFfn {
        input,
        router,
        shared_gate,
        logits,
        k,
        scale,
        experts,
        out,
        next,
    })
}

fn matmul_add_norm_at<'a>(ops: &[Op<'a>], i: usize, end: usize, enabled: FusionSet) -> Option<Fused<'a>> {
    let Some(&Op::Matmul { w, x, out: y }) = ops.get(i) else {
        return None;
    };
    // A MoE FFN takes the residual add and its input norm itself.
    if enabled.has(Fusion::MoeFfn) && moe_ffn_at(ops, i + 1, end).is_some() {
        return None;
    }
    let next = next_of(ops, i + 1, end, y)?;
    Some(Fused::MatmulAddNorm { w, x, next })
}

/// The fusion taken at op `i` of `ops` (runs end before `end`; `ops` past `end` are what runs
/// after, read to know which intermediates are still needed), the largest first.
pub fn match_at<'a>(ops: &[Op<'a>], i: usize, end: usize, enabled: FusionSet) -> Option<Fused<'a>> {
    let end = end.min(ops.len());
    for k in [
        Fusion::MoeFfn,
        Fusion::MatmulAddNorm,
        Fusion::MoeRouteExpertsShared,
        Fusion::MoeExpertsShared,
        Fusion::GdnStep,
        Fusion::GdnConvGates,
        Fusion::ConvL2,
        Fusion::AttnPrep,
        Fusion::AttentionGated,
        Fusion::MatmulSwiglu,
        Fusion::Group,
        Fusion::AddNorm,
    ] {
        if !enabled.has(k) {
            continue;
        }
        let m = match k {
            Fusion::MoeFfn => moe_ffn_at(ops, i, end),
            Fusion::MatmulAddNorm => matmul_add_norm_at(ops, i, end, enabled),
            Fusion::MoeRouteExpertsShared => route_experts_shared_at(ops, i, end),
            Fusion::MoeExpertsShared => experts_shared_at(ops, i, end),
            Fusion::GdnStep => gdn_step_at(ops, i, end),
            Fusion::GdnConvGates => gdn_conv_gates_at(ops, i, end),
            Fusion::ConvL2 => conv_l2_at(ops, i, end),
            Fusion::AttnPrep => attn_prep_at(ops, i, end),
            Fusion::AttentionGated => attention_gated_at(ops, i, end),
            Fusion::MatmulSwiglu => swiglu_at(ops, i, end),
            Fusion::Group => products(ops, i, end, None).map(Fused::Group),
            Fusion::AddNorm => add_norm_at(ops, i, end, false).map(Fused::AddNorm),
        };
        if let Some(m) = m {
            return Some(m);
        }
    }
    None
}

// ---- running ----------------------------------------------------------------------------------

/// A backend that launches some runs of ops as one kernel.
pub trait Fuse: Backend {
    /// The fusions this backend takes (none when its fusion switch is off).
    fn fusions(&self) -> FusionSet;
    /// Run `f` in its fused form. Returns how many of its ops ran: all of them (`f.len()`), or a
    /// prefix (0 when the fused kernel does not fit these operands: nothing ran) after which the
    /// rest of the run is matched again without `f`'s kind.
    fn run_fused(&self, f: &Fused<'_>) -> Result<usize>;
}

/// Run `ops` on `be`, fusing what `enabled` allows; `launched` collects the name of each fused
/// run and plain op as it runs.
pub fn run<B: Fuse + ?Sized>(
    be: &B,
    ops: &[Op<'_>],
    enabled: FusionSet,
    launched: &mut Option<&mut Vec<&'static str>>,
) -> Result<()> {
    run_range(be, ops, 0, ops.len(), enabled, launched)
}

fn run_range<B: Fuse + ?Sized>(
    be: &B,
    ops: &[Op<'_>],
    start: usize,
    end: usize,
    enabled: FusionSet,
    launched: &mut Option<&mut Vec<&'static str>>,
) -> Result<()> {
    let mut i = start;
    while i < end {
        let Some(m) = match_at(ops, i, end, enabled) else {
            super::plan::run_op(be, &ops[i])?;
            if let Some(l) = launched.as_mut() {
                l.push(ops[i].name());
            }
            i += 1;
            continue;
        };
        let len = m.len();
        let ran = be.run_fused(&m)?.min(len);
        if ran > 0 {
            if let Some(l) = launched.as_mut() {
                l.push(m.kind().name());
            }
        }
        if ran < len {
            run_range(be, ops, i + ran, i + len, enabled.without(m.kind()), launched)?;
        }
        i += len;
    }
    Ok(())
}

/// What `run` would launch for `ops` if every fused kernel fit: the plan as a backend with
/// `enabled` compiles it (pure; no device).
pub fn launches(ops: &[Op<'_>], enabled: FusionSet) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        match match_at(ops, i, ops.len(), enabled) {
            Some(m) => {
                out.push(m.kind().name());
                i += m.len();
            }
            None => {
                out.push(ops[i].name());
                i += 1;
            }
        }
    }
    out
}
