//! Step plans: what one forward step computes, as a list of the model's plain ops over named
//! tensors (spec/MODEL.md's equations, one op each), in the order they run.
//!
//! The executor (`crate::exec`) builds a plan per step shape and hands it to the backend
//! (`Backend::run_plan`). The CPU backend runs it op by op (`run_ops`) and is the reference;
//! a GPU backend may run several consecutive ops as one launch where it has such a kernel
//! (`super::fusion`), which is its own business: the plan never says what is fused.

use super::{AttnDims, Backend, GdnDims, Pos, Rows, Tensor};
use crate::error::Result;

/// Which algorithm a delta-rule op runs (the same result up to f32 rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaAlgo {
    /// Token by token (spec/DELTANET.md A.2): decode.
    Recurrent,
    /// Chunks of 64 (spec/DELTANET.md B): prefill.
    Chunked,
}

/// One op of a plan. Each is one `Backend` primitive with the same operands and rules.
#[derive(Clone, Copy)]
pub enum Op<'a> {
    /// `out[t] = table[ids[t]]` (`Backend::embed`).
    Embed {
        table: &'a Tensor,
        ids: &'a Tensor,
        out: &'a Tensor,
    },
    /// `out = rms_norm(x; w)` over groups of `w.len()` (`Backend::rms_norm`).
    RmsNorm {
        x: &'a Tensor,
        w: &'a Tensor,
        eps: f32,
        out: &'a Tensor,
    },
    /// `out = x W^T` (`Backend::matmul`).
    Matmul {
        w: &'a Tensor,
        x: &'a Tensor,
        out: &'a Tensor,
    },
    /// `acc += x`: a residual add (`Backend::add_assign`).
    Add { acc: &'a Tensor, x: &'a Tensor },
    /// `out = silu(gate) * up` (`Backend::swiglu`).
    Swiglu {
        gate: &'a Tensor,
        up: &'a Tensor,
        out: &'a Tensor,
    },
    /// `x *= sigmoid(gate)` (`Backend::sigmoid_mul_assign`).
    SigmoidMul { x: &'a Tensor, gate: &'a Tensor },
    /// `acc[t] += sigmoid(gate_logit[t]) * x[t]` (`Backend::sigmoid_scale_add`).
    SigmoidScaleAdd {
        acc: &'a Tensor,
        x: &'a Tensor,
        gate_logit: &'a Tensor,
    },
    /// Causal conv1d + SiLU, updating the rolling state (`Backend::conv1d_causal_silu`).
    Conv1dSilu {
        x: &'a Tensor,
        w: &'a Tensor,
        state: &'a Tensor,
        out: &'a Tensor,
    },
    /// The delta rule's per-head gates `g` and `beta` (`Backend::gdn_gates`).
    GdnGates {
        a: &'a Tensor,
        b: &'a Tensor,
        ssm_a: &'a Tensor,
        dt_bias: &'a Tensor,
        g: &'a Tensor,
        beta: &'a Tensor,
    },
    /// L2 norm of the q and k heads of the conv output, q scaled (`Backend::l2_norm_qk`).
    L2NormQk { u: &'a Tensor, dims: GdnDims, eps: f32 },
    /// The gated delta rule, updating the state (`Backend::delta_rule_recurrent` / `_chunked`).
    DeltaRule {
        u: &'a Tensor,
        g: &'a Tensor,
        beta: &'a Tensor,
        state: &'a Tensor,
        out: &'a Tensor,
        dims: GdnDims,
        algo: DeltaAlgo,
    },
    /// `out = rms_norm(x; w) * silu(z)` per head (`Backend::gated_rms_norm`).
    GatedRmsNorm {
        x: &'a Tensor,
        z: &'a Tensor,
        w: &'a Tensor,
        eps: f32,
        out: &'a Tensor,
    },
    /// The interleaved query/gate projection split (`Backend::split_qgate`).
    SplitQGate {
        qg: &'a Tensor,
        head_dim: usize,
        q: &'a Tensor,
        gate: &'a Tensor,
    },
    /// NeoX RoPE in place (`Backend::rope_neox`).
    Rope {
        x: &'a Tensor,
        head_dim: usize,
        n_rot: usize,
        theta: f32,
        pos: Pos<'a>,
    },
    /// Append the step's k and v rows to the cache (`Backend::kv_store`).
    KvStore {
        k: &'a Tensor,
        v: &'a Tensor,
        k_cache: &'a Tensor,
        v_cache: &'a Tensor,
        pos: Pos<'a>,
    },
    /// Causal GQA attention over the cache (`Backend::attention`).
    Attention {
        q: &'a Tensor,
        k_cache: &'a Tensor,
        v_cache: &'a Tensor,
        pos: Pos<'a>,
        dims: AttnDims,
        scale: f32,
        out: &'a Tensor,
    },
    /// `Conv1dSilu` of one token per row on its slot (`Backend::conv1d_silu_rows`).
    Conv1dSiluRows {
        x: &'a Tensor,
        w: &'a Tensor,
        states: &'a Tensor,
        rows: Rows<'a>,
        out: &'a Tensor,
    },
    /// The recurrent delta rule of one token per row on its slot (`Backend::delta_rule_rows`).
    DeltaRuleRows {
        u: &'a Tensor,
        g: &'a Tensor,
        beta: &'a Tensor,
        states: &'a Tensor,
        out: &'a Tensor,
        dims: GdnDims,
        rows: Rows<'a>,
    },
    /// RoPE with each row at its own position (`Backend::rope_neox_rows`).
    RopeRows {
        x: &'a Tensor,
        head_dim: usize,
        n_rot: usize,
        theta: f32,
        rows: Rows<'a>,
    },
    /// Each row's k and v into its slot's cache (`Backend::kv_store_rows`).
    KvStoreRows {
        k: &'a Tensor,
        v: &'a Tensor,
        k_pool: &'a Tensor,
        v_pool: &'a Tensor,
        ctx: usize,
        rows: Rows<'a>,
    },
    /// Each row's attention over its slot's cache (`Backend::attention_rows`).
    AttentionRows {
        q: &'a Tensor,
        k_pool: &'a Tensor,
        v_pool: &'a Tensor,
        ctx: usize,
        rows: Rows<'a>,
        dims: AttnDims,
        scale: f32,
        out: &'a Tensor,
    },
    /// Softmax top-k routing (`Backend::moe_route`).
    MoeRoute {
        logits: &'a Tensor,
        k: usize,
        scale: f32,
        ids: &'a Tensor,
        weights: &'a Tensor,
    },
    /// The routed experts' weighted SwiGLU FFNs (`Backend::moe_experts`).
    MoeExperts {
        x: &'a Tensor,
        gate_exps: &'a Tensor,
        up_exps: &'a Tensor,
        down_exps: &'a Tensor,
        ids: &'a Tensor,
        weights: &'a Tensor,
        out: &'a Tensor,
    },
    /// `dst[dst_row..] = src[src_row..]`, `n` rows (`Backend::copy_rows`).
    CopyRows {
        src: &'a Tensor,
        src_row: usize,
        dst: &'a Tensor,
        dst_row: usize,
        n: usize,
    },
    /// Row-wise argmax on the device (`Backend::argmax`).
    Argmax { logits: &'a Tensor, out: &'a Tensor },
}

impl<'a> Op<'a> {
    /// The op's name: its `Backend` method (what a backend that fuses nothing launches).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embed { .. } => "embed",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Matmul { .. } => "matmul",
            Op::Add { .. } => "add_assign",
            Op::Swiglu { .. } => "swiglu",
            Op::SigmoidMul { .. } => "sigmoid_mul_assign",
            Op::SigmoidScaleAdd { .. } => "sigmoid_scale_add",
            Op::Conv1dSilu { .. } => "conv1d_causal_silu",
            Op::GdnGates { .. } => "gdn_gates",
            Op::L2NormQk { .. } => "l2_norm_qk",
            Op::DeltaRule {
                algo: DeltaAlgo::Recurrent,
                ..
            } => "delta_rule_recurrent",
            Op::DeltaRule {
                algo: DeltaAlgo::Chunked,
                ..
            } => "delta_rule_chunked",
            Op::GatedRmsNorm { .. } => "gated_rms_norm",
            Op::SplitQGate { .. } => "split_qgate",
            Op::Rope { .. } => "rope_neox",
            Op::KvStore { .. } => "kv_store",
            Op::Attention { .. } => "attention",
            Op::Conv1dSiluRows { .. } => "conv1d_silu_rows",
            Op::DeltaRuleRows { .. } => "delta_rule_rows",
            Op::RopeRows { .. } => "rope_neox_rows",
            Op::KvStoreRows { .. } => "kv_store_rows",
            Op::AttentionRows { .. } => "attention_rows",
            Op::MoeRoute { .. } => "moe_route",
            Op::MoeExperts { .. } => "moe_experts",
            Op::CopyRows { .. } => "copy_rows",
            Op::Argmax { .. } => "argmax",
        }
    }

    /// The tensors the op reads (the weights included; an in-place operand is read and written).
    pub fn reads(&self) -> Vec<&'a Tensor> {
        match *self {
            Op::Embed { table, ids, .. } => vec![table, ids],
            Op::RmsNorm { x, w, .. } => vec![x, w],
            Op::Matmul { w, x, .. } => vec![w, x],
            Op::Add { acc, x } => vec![acc, x],
            Op::Swiglu { gate, up, .. } => vec![gate, up],
            Op::SigmoidMul { x, gate } => vec![x, gate],
            Op::SigmoidScaleAdd { acc, x, gate_logit } => vec![acc, x, gate_logit],
            Op::Conv1dSilu { x, w, state, .. } => vec![x, w, state],
            Op::GdnGates {
                a, b, ssm_a, dt_bias, ..
            } => vec![a, b, ssm_a, dt_bias],
            Op::L2NormQk { u, .. } => vec![u],
            Op::DeltaRule { u, g, beta, state, .. } => vec![u, g, beta, state],
            Op::GatedRmsNorm { x, z, w, .. } => vec![x, z, w],
            Op::SplitQGate { qg, .. } => vec![qg],
            Op::Rope { x, pos, .. } => vec![x, pos.dev],
            Op::KvStore { k, v, pos, .. } => vec![k, v, pos.dev],
            Op::Attention {
                q,
                k_cache,
                v_cache,
                pos,
                ..
            } => vec![q, k_cache, v_cache, pos.dev],
            Op::Conv1dSiluRows { x, w, states, rows, .. } => vec![x, w, states, rows.dev],
            Op::DeltaRuleRows {
                u,
                g,
                beta,
                states,
                rows,
                ..
            } => vec![u, g, beta, states, rows.dev],
            Op::RopeRows { x, rows, .. } => vec![x, rows.dev],
            Op::KvStoreRows { k, v, rows, .. } => vec![k, v, rows.dev],
            Op::AttentionRows {
                q,
                k_pool,
                v_pool,
                rows,
                ..
            } => vec![q, k_pool, v_pool, rows.dev],
            Op::MoeRoute { logits, .. } => vec![logits],
            Op::MoeExperts {
                x,
                gate_exps,
                up_exps,
                down_exps,
                ids,
                weights,
                ..
            } => vec![x, gate_exps, up_exps, down_exps, ids, weights],
            Op::CopyRows { src, .. } => vec![src],
            Op::Argmax { logits, .. } => vec![logits],
        }
    }

    /// The tensors the op writes.
    pub fn writes(&self) -> Vec<&'a Tensor> {
        match *self {
            Op::Embed { out, .. }
            | Op::RmsNorm { out, .. }
            | Op::Matmul { out, .. }
            | Op::Swiglu { out, .. }
            | Op::GatedRmsNorm { out, .. }
            | Op::Attention { out, .. }
            | Op::AttentionRows { out, .. }
            | Op::MoeExperts { out, .. }
            | Op::Argmax { out, .. } => vec![out],
            Op::Add { acc, .. } | Op::SigmoidScaleAdd { acc, .. } => vec![acc],
            Op::SigmoidMul { x, .. } | Op::Rope { x, .. } | Op::RopeRows { x, .. } => vec![x],
            Op::Conv1dSiluRows { states, out, .. } | Op::DeltaRuleRows { states, out, .. } => vec![states, out],
            Op::KvStoreRows { k_pool, v_pool, .. } => vec![k_pool, v_pool],
            Op::Conv1dSilu { state, out, .. } => vec![state, out],
            Op::GdnGates { g, beta, .. } => vec![g, beta],
            Op::L2NormQk { u, .. } => vec![u],
            Op::DeltaRule { state, out, .. } => vec![state, out],
            Op::SplitQGate { q, gate, .. } => vec![q, gate],
            Op::KvStore { k_cache, v_cache, .. } => vec![k_cache, v_cache],
            Op::MoeRoute { ids, weights, .. } => vec![ids, weights],
            Op::CopyRows { dst, .. } => vec![dst],
        }
    }
}

/// One step's ops, in order.
#[derive(Clone, Default)]
pub struct Plan<'a> {
    ops: Vec<Op<'a>>,
}

impl<'a> Plan<'a> {
    pub fn new() -> Plan<'a> {
        Plan { ops: Vec::new() }
    }
    pub fn push(&mut self, op: Op<'a>) {
        self.ops.push(op);
    }
    pub fn ops(&self) -> &[Op<'a>] {
        &self.ops
    }
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl<'a> From<Vec<Op<'a>>> for Plan<'a> {
    fn from(ops: Vec<Op<'a>>) -> Plan<'a> {
        Plan { ops }
    }
}

/// Run one op on its `Backend` primitive.
pub fn run_op<B: Backend + ?Sized>(be: &B, op: &Op<'_>) -> Result<()> {
    match *op {
        Op::Embed { table, ids, out } => be.embed(table, ids, out),
        Op::RmsNorm { x, w, eps, out } => be.rms_norm(x, w, eps, out),
        Op::Matmul { w, x, out } => be.matmul(w, x, out),
        Op::Add { acc, x } => be.add_assign(acc, x),
        Op::Swiglu { gate, up, out } => be.swiglu(gate, up, out),
        Op::SigmoidMul { x, gate } => be.sigmoid_mul_assign(x, gate),
        Op::SigmoidScaleAdd { acc, x, gate_logit } => be.sigmoid_scale_add(acc, x, gate_logit),
        Op::Conv1dSilu { x, w, state, out } => be.conv1d_causal_silu(x, w, state, out),
        Op::GdnGates {
            a,
            b,
            ssm_a,
            dt_bias,
            g,
            beta,
        } => be.gdn_gates(a, b, ssm_a, dt_bias, g, beta),
        Op::L2NormQk { u, dims, eps } => be.l2_norm_qk(u, dims, eps),
        Op::DeltaRule {
            u,
            g,
            beta,
            state,
            out,
            dims,
            algo: DeltaAlgo::Recurrent,
        } => be.delta_rule_recurrent(u, g, beta, state, out, dims),
        Op::DeltaRule {
            u,
            g,
            beta,
            state,
            out,
            dims,
            algo: DeltaAlgo::Chunked,
        } => be.delta_rule_chunked(u, g, beta, state, out, dims),
        Op::GatedRmsNorm { x, z, w, eps, out } => be.gated_rms_norm(x, z, w, eps, out),
        Op::SplitQGate { qg, head_dim, q, gate } => be.split_qgate(qg, head_dim, q, gate),
        Op::Rope {
            x,
            head_dim,
            n_rot,
            theta,
            pos,
        } => be.rope_neox(x, head_dim, n_rot, theta, pos),
        Op::KvStore {
            k,
            v,
            k_cache,
            v_cache,
            pos,
        } => be.kv_store(k, v, k_cache, v_cache, pos),
        Op::Attention {
            q,
            k_cache,
            v_cache,
            pos,
            dims,
            scale,
            out,
        } => be.attention(q, k_cache, v_cache, pos, dims, scale, out),
        Op::Conv1dSiluRows {
            x,
            w,
            states,
            rows,
            out,
        } => be.conv1d_silu_rows(x, w, states, rows, out),
        Op::DeltaRuleRows {
            u,
            g,
            beta,
            states,
            out,
            dims,
            rows,
        } => be.delta_rule_rows(u, g, beta, states, out, dims, rows),
        Op::RopeRows {
            x,
            head_dim,
            n_rot,
            theta,
            rows,
        } => be.rope_neox_rows(x, head_dim, n_rot, theta, rows),
        Op::KvStoreRows {
            k,
            v,
            k_pool,
            v_pool,
            ctx,
            rows,
        } => be.kv_store_rows(k, v, k_pool, v_pool, ctx, rows),
        Op::AttentionRows {
            q,
            k_pool,
            v_pool,
            ctx,
            rows,
            dims,
            scale,
            out,
        } => be.attention_rows(q, k_pool, v_pool, ctx, rows, dims, scale, out),
        Op::MoeRoute {
            logits,
            k,
            scale,
            ids,
            weights,
        } => be.moe_route(logits, k, scale, ids, weights),
        Op::MoeExperts {
            x,
            gate_exps,
            up_exps,
            down_exps,
            ids,
            weights,
            out,
        } => be.moe_experts(x, gate_exps, up_exps, down_exps, ids, weights, out),
        Op::CopyRows {
            src,
            src_row,
            dst,
            dst_row,
            n,
        } => be.copy_rows(src, src_row, dst, dst_row, n),
        Op::Argmax { logits, out } => be.argmax(logits, out),
    }
}

/// Run ops one by one on their primitives: the reference execution of a plan.
pub fn run_ops<B: Backend + ?Sized>(be: &B, ops: &[Op<'_>]) -> Result<()> {
    ops.iter().try_for_each(|op| run_op(be, op))
}
