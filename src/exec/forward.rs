//! The forward pass as a step plan: spec/MODEL.md's equations, one op each, in order (§8):
//!
//! ```text
//! h = token_embd[token]
//! for each layer:  h += mixer(rms_norm(h; attn_norm));  h += ffn(rms_norm(h; post_attention_norm))
//! logits = W_out rms_norm(h; output_norm)
//! ```
//!
//! Nothing here knows which ops a backend launches together (`backend::fusion`).

use crate::backend::{DeltaAlgo, Op, Plan, Pos, Rows, Tensor};
use crate::error::{Error, Result};
use crate::model::weights::{AttnWeights, Ffn, GdnWeights, Layer, Mixer};
use crate::model::{Config, Weights};

use super::pool::{PoolLayer, StatePool};
use super::scratch::{Head, HeadBuffers, Scratch};
use super::session::LayerState;

/// HF's kernel uses a fixed 1e-6 for the q/k L2 norm of the delta rule (spec/MODEL.md §4.1).
const L2_EPS: f32 = 1e-6;

/// Whose state a step reads and writes.
pub enum Seqs<'a> {
    /// One sequence's T tokens from position `pos` on.
    One { state: &'a [LayerState], pos: usize },
    /// One token per row, each of its own sequence in a slot of `pool` (DESIGN.md "Many
    /// sequences in one step").
    Pool { pool: &'a StatePool, rows: Rows<'a> },
}

/// A GDN layer's conv and delta state.
enum GdnState<'a> {
    One {
        conv: &'a Tensor,
        delta: &'a Tensor,
    },
    Rows {
        conv: &'a Tensor,
        delta: &'a Tensor,
        rows: Rows<'a>,
    },
}

/// An attention layer's KV cache and where the step's rows go in it.
enum KvState<'a> {
    One {
        k: &'a Tensor,
        v: &'a Tensor,
        pos: Pos<'a>,
    },
    Rows {
        k: &'a Tensor,
        v: &'a Tensor,
        ctx: usize,
        rows: Rows<'a>,
    },
}

/// What one step reads: the model, its activation buffers, and its sequences' state.
pub struct Forward<'a> {
    pub cfg: &'a Config,
    pub w: &'a Weights,
    pub sc: &'a Scratch,
    pub seqs: Seqs<'a>,
}

impl<'a> Forward<'a> {
    fn gdn_state(&self, i: usize) -> Result<GdnState<'a>> {
        match self.seqs {
            Seqs::One { state, .. } => match state.get(i) {
                Some(LayerState::Gdn { conv, delta }) => Ok(GdnState::One { conv, delta }),
                _ => Err(mismatch()),
            },
            Seqs::Pool { pool, rows } => match pool.layers.get(i) {
                Some(PoolLayer::Gdn { conv, delta }) => Ok(GdnState::Rows { conv, delta, rows }),
                _ => Err(mismatch()),
            },
        }
    }

    fn kv_state(&self, i: usize) -> Result<KvState<'a>> {
        match self.seqs {
            Seqs::One { state, pos } => match state.get(i) {
                Some(LayerState::Attn { k, v }) => Ok(KvState::One {
                    k,
                    v,
                    pos: Pos {
                        host: pos,
                        dev: &self.sc.pos,
                    },
                }),
                _ => Err(mismatch()),
            },
            Seqs::Pool { pool, rows } => match pool.layers.get(i) {
                Some(PoolLayer::Attn { k, v }) => Ok(KvState::Rows {
                    k,
                    v,
                    ctx: pool.n_ctx,
                    rows,
                }),
                _ => Err(mismatch()),
            },
        }
    }

    /// The whole step: embedding, every layer, the head.
    pub fn step(&self, head: Head) -> Result<Plan<'a>> {
        let mut p = Plan::new();
        self.embed(&mut p);
        for i in 0..self.w.layers.len() {
            self.layer(&mut p, i)?;
        }
        self.head(&mut p, head)?;
        Ok(p)
    }

    /// `h = token_embd[token]`.
    pub fn embed(&self, p: &mut Plan<'a>) {
        let sc = self.sc;
        p.push(Op::Embed {
            table: &self.w.token_embd,
            ids: &sc.ids,
            out: &sc.h,
        });
    }

    /// Decoder layer `i` (spec/MODEL.md §8).
    pub fn layer(&self, p: &mut Plan<'a>, i: usize) -> Result<()> {
        let (sc, eps) = (self.sc, self.cfg.eps);
        let l: &'a Layer = &self.w.layers[i];
        let norm = |x, w, out| Op::RmsNorm { x, w, eps, out };
        // x = RMSNorm(h; attn_norm);  h += mixer(x)
        p.push(norm(&sc.h, &l.attn_norm, &sc.xn));
        match &l.mixer {
            Mixer::Gdn(w) => self.gated_delta_net(p, w, self.gdn_state(i)?),
            Mixer::Attn(w) => self.gated_attention(p, w, self.kv_state(i)?),
        }
        p.push(Op::Add { acc: &sc.h, x: &sc.mix });
        // x = RMSNorm(h; post_attention_norm);  h += ffn(x)
        p.push(norm(&sc.h, &l.post_norm, &sc.xn));
        self.ffn(p, &l.ffn)?;
        p.push(Op::Add { acc: &sc.h, x: &sc.mix });
        Ok(())
    }

    /// Gated DeltaNet (spec/MODEL.md §5): xn -> mix.
    fn gated_delta_net(&self, p: &mut Plan<'a>, w: &'a GdnWeights, state: GdnState<'a>) {
        let sc = self.sc;
        let dims = self.cfg.gdn;
        // §5.1 projections
        for (w, out) in [(&w.qkv, &sc.qkv), (&w.gate, &sc.z), (&w.beta, &sc.b), (&w.alpha, &sc.a)] {
            p.push(Op::Matmul { w, x: &sc.xn, out });
        }
        // §5.2 per-head scalars
        p.push(Op::GdnGates {
            a: &sc.a,
            b: &sc.b,
            ssm_a: &w.ssm_a,
            dt_bias: &w.dt_bias,
            g: &sc.g,
            beta: &sc.beta,
        });
        // §5.3 causal conv1d + SiLU, §5.4 L2 norm of q and k, q scaled
        let (x, w_conv, out) = (&sc.qkv, &w.conv1d, &sc.conv_out);
        p.push(match state {
            GdnState::One { conv, .. } => Op::Conv1dSilu {
                x,
                w: w_conv,
                state: conv,
                out,
            },
            GdnState::Rows { conv, rows, .. } => Op::Conv1dSiluRows {
                x,
                w: w_conv,
                states: conv,
                rows,
                out,
            },
        });
        p.push(Op::L2NormQk {
            u: &sc.conv_out,
            dims,
            eps: L2_EPS,
        });
        // §5.5 gated delta rule: the recurrence for one token, the chunked form for a batch
        let (u, g, beta, out) = (&sc.conv_out, &sc.g, &sc.beta, &sc.o);
        p.push(match state {
            GdnState::One { delta, .. } => Op::DeltaRule {
                u,
                g,
                beta,
                state: delta,
                out,
                dims,
                algo: if sc.t > 1 {
                    DeltaAlgo::Chunked
                } else {
                    DeltaAlgo::Recurrent
                },
            },
            GdnState::Rows { delta, rows, .. } => Op::DeltaRuleRows {
                u,
                g,
                beta,
                states: delta,
                out,
                dims,
                rows,
            },
        });
        // §5.6 gated RMSNorm, output projection
        p.push(Op::GatedRmsNorm {
            x: &sc.o,
            z: &sc.z,
            w: &w.ssm_norm,
            eps: self.cfg.eps,
            out: &sc.o_normed,
        });
        p.push(Op::Matmul {
            w: &w.out,
            x: &sc.o_normed,
            out: &sc.mix,
        });
    }

    /// Gated full attention (spec/MODEL.md §6): xn -> mix, appending to the KV cache.
    fn gated_attention(&self, p: &mut Plan<'a>, w: &'a AttnWeights, kv: KvState<'a>) {
        let (sc, cfg) = (self.sc, self.cfg);
        let dims = cfg.attn;
        let head_dim = dims.head_dim;
        // §6.1 projections, the per-head query/gate split
        for (w, out) in [(&w.q, &sc.qg), (&w.k, &sc.k), (&w.v, &sc.v)] {
            p.push(Op::Matmul { w, x: &sc.xn, out });
        }
        p.push(Op::SplitQGate {
            qg: &sc.qg,
            head_dim,
            q: &sc.q,
            gate: &sc.gate,
        });
        // §6.2 q/k norms, §6.3 partial RoPE
        p.push(Op::RmsNorm {
            x: &sc.q,
            w: &w.q_norm,
            eps: cfg.eps,
            out: &sc.q_normed,
        });
        p.push(Op::RmsNorm {
            x: &sc.k,
            w: &w.k_norm,
            eps: cfg.eps,
            out: &sc.k_normed,
        });
        let (n_rot, theta) = (cfg.n_rot, cfg.rope_theta);
        for x in [&sc.q_normed, &sc.k_normed] {
            p.push(match kv {
                KvState::One { pos, .. } => Op::Rope {
                    x,
                    head_dim,
                    n_rot,
                    theta,
                    pos,
                },
                KvState::Rows { rows, .. } => Op::RopeRows {
                    x,
                    head_dim,
                    n_rot,
                    theta,
                    rows,
                },
            });
        }
        // §6.5 attention over the cache with this step's rows appended
        let (k, v, q, out) = (&sc.k_normed, &sc.v, &sc.q_normed, &sc.att);
        let scale = 1.0 / (head_dim as f32).sqrt();
        match kv {
            KvState::One {
                k: k_cache,
                v: v_cache,
                pos,
            } => {
                p.push(Op::KvStore {
                    k,
                    v,
                    k_cache,
                    v_cache,
                    pos,
                });
                p.push(Op::Attention {
                    q,
                    k_cache,
                    v_cache,
                    pos,
                    dims,
                    scale,
                    out,
                });
            }
            KvState::Rows {
                k: k_pool,
                v: v_pool,
                ctx,
                rows,
            } => {
                p.push(Op::KvStoreRows {
                    k,
                    v,
                    k_pool,
                    v_pool,
                    ctx,
                    rows,
                });
                p.push(Op::AttentionRows {
                    q,
                    k_pool,
                    v_pool,
                    ctx,
                    rows,
                    dims,
                    scale,
                    out,
                });
            }
        }
        // §6.6 output gate and projection
        p.push(Op::SigmoidMul {
            x: &sc.att,
            gate: &sc.gate,
        });
        p.push(Op::Matmul {
            w: &w.out,
            x: &sc.att,
            out: &sc.mix,
        });
    }

    /// FFN (spec/MODEL.md §7): xn -> mix.
    fn ffn(&self, p: &mut Plan<'a>, f: &'a Ffn) -> Result<()> {
        let sc = self.sc;
        let xn = &sc.xn;
        match f {
            // §7.1 W_down (silu(W_gate x) * (W_up x))
            Ffn::Dense { gate, up, down } => {
                swiglu(p, gate, up, xn, [&sc.ff_gate, &sc.ff_up, &sc.ff_act]);
                p.push(Op::Matmul {
                    w: down,
                    x: &sc.ff_act,
                    out: &sc.mix,
                });
            }
            // §7.2 routed experts + sigmoid(shared gate) * shared expert
            Ffn::Moe {
                router,
                gate_exps,
                up_exps,
                down_exps,
                shexp_gate,
                gate_sh,
                up_sh,
                down_sh,
            } => {
                let missing = || Error::Backend("MoE scratch missing".into());
                let m = self.cfg.moe.as_ref().ok_or_else(missing)?;
                let logits = sc.router_logits.as_ref().ok_or_else(missing)?;
                let ids = sc.expert_ids.as_ref().ok_or_else(missing)?;
                let weights = sc.expert_w.as_ref().ok_or_else(missing)?;
                let shared = sc.shared_out.as_ref().ok_or_else(missing)?;
                let shared_logit = sc.shared_gate.as_ref().ok_or_else(missing)?;
                p.push(Op::Matmul {
                    w: router,
                    x: xn,
                    out: logits,
                });
                p.push(Op::Matmul {
                    w: shexp_gate,
                    x: xn,
                    out: shared_logit,
                });
                p.push(Op::MoeRoute {
                    logits,
                    k: m.n_expert_used,
                    scale: m.weights_scale,
                    ids,
                    weights,
                });
                p.push(Op::MoeExperts {
                    x: xn,
                    gate_exps,
                    up_exps,
                    down_exps,
                    ids,
                    weights,
                    out: &sc.mix,
                });
                swiglu(p, gate_sh, up_sh, xn, [&sc.ff_gate, &sc.ff_up, &sc.ff_act]);
                p.push(Op::Matmul {
                    w: down_sh,
                    x: &sc.ff_act,
                    out: shared,
                });
                p.push(Op::SigmoidScaleAdd {
                    acc: &sc.mix,
                    x: shared,
                    gate_logit: shared_logit,
                });
            }
        }
        Ok(())
    }

    /// The final norm and the LM head, on the positions whose logits are wanted (§8).
    pub fn head(&self, p: &mut Plan<'a>, head: Head) -> Result<()> {
        let sc = self.sc;
        let (norm, eps) = (&self.w.output_norm, self.cfg.eps);
        let (rows, hb): (&Tensor, &HeadBuffers) = match head {
            Head::None => return Ok(()),
            Head::AllLogits | Head::AllArgmax => (
                &sc.h,
                sc.head_all
                    .as_ref()
                    .ok_or_else(|| Error::Backend("head buffers missing".into()))?,
            ),
            Head::LastLogits | Head::LastArgmax if sc.t == 1 => (&sc.h, &sc.head_last),
            Head::LastLogits | Head::LastArgmax => {
                let hb = &sc.head_last;
                p.push(Op::CopyRows {
                    src: &sc.h,
                    src_row: sc.t - 1,
                    dst: &hb.last_row,
                    dst_row: 0,
                    n: 1,
                });
                (&hb.last_row, hb)
            }
        };
        p.push(Op::RmsNorm {
            x: rows,
            w: norm,
            eps,
            out: &hb.normed,
        });
        p.push(Op::Matmul {
            w: &self.w.output,
            x: &hb.normed,
            out: &hb.logits,
        });
        if matches!(head, Head::LastArgmax | Head::AllArgmax) {
            p.push(Op::Argmax {
                logits: &hb.logits,
                out: &hb.argmax,
            });
        }
        Ok(())
    }
}

/// `out = silu(W_gate x) * (W_up x)` into `[gate, up, out]`.
fn swiglu<'a>(p: &mut Plan<'a>, gate: &'a Tensor, up: &'a Tensor, x: &'a Tensor, bufs: [&'a Tensor; 3]) {
    let [g, u, out] = bufs;
    p.push(Op::Matmul { w: gate, x, out: g });
    p.push(Op::Matmul { w: up, x, out: u });
    p.push(Op::Swiglu { gate: g, up: u, out });
}

fn mismatch() -> Error {
    Error::Backend("the sequences' state does not match the model's layer types".into())
}
