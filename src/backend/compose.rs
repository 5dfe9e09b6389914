//! The runs of ops that GPU backends fuse (`fusion::Fusion`), each as a small plan run through
//! `Backend::run_plan`: the CPU runs the ops one by one, a GPU backend takes its fused kernel where
//! it has one. Each function first checks its operands against the run's rules (`check`), so a
//! bad combination is refused the same way on every backend. The op tests compare backends
//! through these.

use super::fusion::{AddNorm, AttnPrep, GdnGates, GdnStep, MoeExperts, MoeFfn};
use super::plan::{DeltaAlgo, Op, Plan};
use super::{check, AttnDims, Backend, GdnDims, Pos, Tensor};
use crate::error::Result;

fn run(be: &dyn Backend, ops: Vec<Op<'_>>) -> Result<()> {
    be.run_plan(&Plan::from(ops))
}

/// `outs[i] = matmul(ws[i], x)`.
pub fn matmul_group(be: &dyn Backend, ws: &[&Tensor], x: &Tensor, outs: &[&Tensor]) -> Result<()> {
    check::matmul_group(ws, x, outs)?;
    run(be, group_ops(ws, x, outs))
}

fn group_ops<'a>(ws: &[&'a Tensor], x: &'a Tensor, outs: &[&'a Tensor]) -> Vec<Op<'a>> {
    ws.iter().zip(outs).map(|(&w, &out)| Op::Matmul { w, x, out }).collect()
}

/// `acc += x; out = rms_norm(acc; w)`.
pub fn add_rms_norm(be: &dyn Backend, acc: &Tensor, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    check::add_rms_norm(acc, x, w, out)?;
    run(be, vec![Op::Add { acc, x }, Op::RmsNorm { x: acc, w, eps, out }])
}

/// `next`'s residual add of `y`, its norm and the products of the normed rows (`next.then`).
fn add_norm_ops<'a>(ops: &mut Vec<Op<'a>>, y: &'a Tensor, next: AddNorm<'a>) {
    ops.push(Op::Add { acc: next.acc, x: y });
    ops.push(Op::RmsNorm {
        x: next.acc,
        w: next.w,
        eps: next.eps,
        out: next.out,
    });
    if let Some(g) = next.then {
        ops.extend(group_ops(g.ws, next.out, g.outs));
    }
}

/// A block's last product and what follows it: `y = matmul(w, x)`, `next.acc += y`,
/// `next.out = rms_norm(next.acc)` and `next.then`'s products of it. `y` is left unspecified.
pub fn matmul_add_rms_norm(be: &dyn Backend, w: &Tensor, x: &Tensor, y: &Tensor, next: AddNorm<'_>) -> Result<()> {
    check::matmul_add_rms_norm(w, x, y, next)?;
    let mut ops = vec![Op::Matmul { w, x, out: y }];
    add_norm_ops(&mut ops, y, next);
    run(be, ops)
}

/// `out = silu(W_gate x) * (W_up x)`; `gate_tmp` and `up_tmp` are left unspecified.
pub fn matmul_swiglu(
    be: &dyn Backend,
    w_gate: &Tensor,
    w_up: &Tensor,
    x: &Tensor,
    gate_tmp: &Tensor,
    up_tmp: &Tensor,
    out: &Tensor,
) -> Result<()> {
    check::matmul_swiglu(w_gate, w_up, x, gate_tmp, up_tmp, out)?;
    run(be, swiglu_ops(w_gate, w_up, x, gate_tmp, up_tmp, out).to_vec())
}

fn swiglu_ops<'a>(
    w_gate: &'a Tensor,
    w_up: &'a Tensor,
    x: &'a Tensor,
    gate_tmp: &'a Tensor,
    up_tmp: &'a Tensor,
    out: &'a Tensor,
) -> [Op<'a>; 3] {
    [
        Op::Matmul {
            w: w_gate,
            x,
            out: gate_tmp,
        },
        Op::Matmul {
            w: w_up,
            x,
            out: up_tmp,
        },
        Op::Swiglu {
            gate: gate_tmp,
            up: up_tmp,
            out,
        },
    ]
}

/// `conv1d_causal_silu` then `l2_norm_qk` of its output.
pub fn conv1d_silu_l2qk(
    be: &dyn Backend,
    x: &Tensor,
    w: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    eps: f32,
) -> Result<()> {
    check::conv1d(x, w, state, out)?;
    check::l2_norm_qk(out, dims)?;
    run(
        be,
        vec![Op::Conv1dSilu { x, w, state, out }, Op::L2NormQk { u: out, dims, eps }],
    )
}

fn gates_op(g: GdnGates<'_>) -> Op<'_> {
    Op::GdnGates {
        a: g.a,
        b: g.b,
        ssm_a: g.ssm_a,
        dt_bias: g.dt_bias,
        g: g.g,
        beta: g.beta,
    }
}

/// The Gated DeltaNet's per-token preparation: `gdn_gates`, then the conv and the q/k norm.
#[allow(clippy::too_many_arguments)]
pub fn gdn_conv_gates(
    be: &dyn Backend,
    x: &Tensor,
    w: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    eps: f32,
    gates: GdnGates<'_>,
) -> Result<()> {
    check::gdn_conv_gates(x, w, state, out, dims, gates)?;
    run(
        be,
        vec![
            gates_op(gates),
            Op::Conv1dSilu { x, w, state, out },
            Op::L2NormQk { u: out, dims, eps },
        ],
    )
}

/// The recurrent middle of a Gated DeltaNet layer; `conv_out` and `o` are left unspecified.
pub fn gdn_recurrent_step(be: &dyn Backend, s: GdnStep<'_>, dims: GdnDims, l2_eps: f32, eps: f32) -> Result<()> {
    check::gdn_recurrent_step(s, dims)?;
    let ops = vec![
        gates_op(s.gates),
        Op::Conv1dSilu {
            x: s.qkv,
            w: s.conv_w,
            state: s.conv_state,
            out: s.conv_out,
        },
        Op::L2NormQk {
            u: s.conv_out,
            dims,
            eps: l2_eps,
        },
        Op::DeltaRule {
            u: s.conv_out,
            g: s.gates.g,
            beta: s.gates.beta,
            state: s.state,
            out: s.o,
            dims,
            algo: DeltaAlgo::Recurrent,
        },
        Op::GatedRmsNorm {
            x: s.o,
            z: s.z,
            w: s.norm_w,
            eps,
            out: s.out,
        },
    ];
    run(be, ops)
}

/// The attention's q/k preparation: split, per-head norms, RoPE and the cache append; `a.q` is
/// left unspecified.
#[allow(clippy::too_many_arguments)]
pub fn attn_qk_prep(
    be: &dyn Backend,
    a: AttnPrep<'_>,
    head_dim: usize,
    n_rot: usize,
    theta: f32,
    eps: f32,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
) -> Result<()> {
    check::attn_qk_prep(a, head_dim, n_rot, theta, k_cache, v_cache, pos)?;
    let rope = |x| Op::Rope {
        x,
        head_dim,
        n_rot,
        theta,
        pos,
    };
    let ops = vec![
        Op::SplitQGate {
            qg: a.qg,
            head_dim,
            q: a.q,
            gate: a.gate,
        },
        Op::RmsNorm {
            x: a.q,
            w: a.q_norm,
            eps,
            out: a.q_normed,
        },
        Op::RmsNorm {
            x: a.k,
            w: a.k_norm,
            eps,
            out: a.k_normed,
        },
        rope(a.q_normed),
        rope(a.k_normed),
        Op::KvStore {
            k: a.k_normed,
            v: a.v,
            k_cache,
            v_cache,
            pos,
        },
    ];
    run(be, ops)
}

/// `attention` then `out *= sigmoid(gate)`.
#[allow(clippy::too_many_arguments)]
pub fn attention_gated(
    be: &dyn Backend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos,
    dims: AttnDims,
    scale: f32,
    gate: &Tensor,
    out: &Tensor,
) -> Result<()> {
    check::attention_gated(q, k_cache, v_cache, pos, dims, gate, out)?;
    run(
        be,
        vec![
            Op::Attention {
                q,
                k_cache,
                v_cache,
                pos,
                dims,
                scale,
                out,
            },
            Op::SigmoidMul { x: out, gate },
        ],
    )
}

fn experts_shared_ops<'a>(ops: &mut Vec<Op<'a>>, x: &'a Tensor, e: MoeExperts<'a>, out: &'a Tensor) {
    let sh = e.sh;
    ops.push(Op::MoeExperts {
        x,
        gate_exps: e.gate_exps,
        up_exps: e.up_exps,
        down_exps: e.down_exps,
        ids: e.ids,
        weights: e.weights,
        out,
    });
    ops.extend(swiglu_ops(sh.gate, sh.up, x, sh.gate_tmp, sh.up_tmp, sh.act));
    ops.push(Op::Matmul {
        w: sh.down,
        x: sh.act,
        out: sh.out,
    });
    ops.push(Op::SigmoidScaleAdd {
        acc: out,
        x: sh.out,
        gate_logit: sh.gate_logit,
    });
}

/// The routed experts and the shared expert:
/// `out = moe_experts(x) + sigmoid(sh.gate_logit) * down_sh(silu(gate_sh x) * up_sh x)`.
pub fn moe_experts_shared(be: &dyn Backend, x: &Tensor, e: MoeExperts<'_>, out: &Tensor) -> Result<()> {
    check::moe_experts_shared(x, e, out)?;
    let mut ops = Vec::new();
    experts_shared_ops(&mut ops, x, e, out);
    run(be, ops)
}

fn route_op<'a>(logits: &'a Tensor, k: usize, scale: f32, e: &MoeExperts<'a>) -> Op<'a> {
    Op::MoeRoute {
        logits,
        k,
        scale,
        ids: e.ids,
        weights: e.weights,
    }
}

/// The routing and the experts, then with `next` the residual add of their output, its norm and
/// `next.then`'s products (`out` then left unspecified).
#[allow(clippy::too_many_arguments)]
pub fn moe_route_experts_shared(
    be: &dyn Backend,
    x: &Tensor,
    logits: &Tensor,
    k: usize,
    scale: f32,
    e: MoeExperts<'_>,
    out: &Tensor,
    next: Option<AddNorm<'_>>,
) -> Result<()> {
    check::moe_route_experts_shared(x, logits, k, e, out, next)?;
    let mut ops = vec![route_op(logits, k, scale, &e)];
    experts_shared_ops(&mut ops, x, e, out);
    if let Some(n) = next {
        add_norm_ops(&mut ops, out, n);
    }
    run(be, ops)
}

/// A MoE layer's FFN from its mixer's output `m.y`: residual add and norm, router and shared
/// gate products, routing, experts, and `next` as in `moe_route_experts_shared`.
pub fn moe_ffn(be: &dyn Backend, m: MoeFfn<'_>, next: Option<AddNorm<'_>>) -> Result<()> {
    check::moe_ffn(m, next)?;
    let x = m.input.out;
    let e = m.experts;
    let mut ops = Vec::new();
    add_norm_ops(&mut ops, m.y, m.input);
    ops.extend(group_ops(&[m.router, m.shared_gate], x, &[m.logits, e.sh.gate_logit]));
    ops.push(route_op(m.logits, m.k, m.scale, &e));
    experts_shared_ops(&mut ops, x, e, m.out);
    if let Some(n) = next {
        add_norm_ops(&mut ops, m.out, n);
    }
    run(be, ops)
}
