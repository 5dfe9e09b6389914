//! The forward pass as a step plan: spec/MODEL.md's equations, one op each, in order (§8):
//!
//! ```text
//! h = token_embd[token]
//! for each layer:  h += mixer(rms_norm(h; attn_norm));  h += ffn(rms_norm(h; post_attention_norm))
//! logits = W_out rms_norm(h; output_norm)
//! ```
//!
//! Nothing here knows which ops a backend launches together (`backend::fusion`).

use crate::backend::{DeltaAlgo, Op, Plan, Pos, Tensor};
use crate::error::{Error, Result};
use crate::model::weights::{AttnWeights, Ffn, GdnWeights, Layer, Mixer};
use crate::model::{Config, Weights};

use super::scratch::{Head, HeadBuffers, Scratch};
use super::session::LayerState;

/// HF's kernel uses a fixed 1e-6 for the q/k L2 norm of the delta rule (spec/MODEL.md §4.1).
const L2_EPS: f32 = 1e-6;

/// What one step reads: the model, its activation buffers, and the sequence's state and position.
pub struct Forward<'a> {
    pub cfg: &'a Config,
    pub w: &'a Weights,
    pub sc: &'a Scratch,
    pub state: &'a [LayerState],
    /// The position of the step's first token.
    pub pos: usize,
}

impl<'a> Forward<'a> {
    fn pos(&self) -> Pos<'a> {
        Pos {
            host: self.pos,
            dev: &self.sc.pos,
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
        match (&l.mixer, self.state.get(i)) {
            (Mixer::Gdn(w), Some(LayerState::Gdn { conv, delta })) => self.gated_delta_net(p, w, conv, delta),
            (Mixer::Attn(w), Some(LayerState::Attn { k, v })) => self.gated_attention(p, w, k, v),
            _ => return Err(Error::Backend("session does not match the model's layer types".into())),
        }
        p.push(Op::Add { acc: &sc.h, x: &sc.mix });
        // x = RMSNorm(h; post_attention_norm);  h += ffn(x)
        p.push(norm(&sc.h, &l.post_norm, &sc.xn));
        self.ffn(p, &l.ffn)?;
        p.push(Op::Add { acc: &sc.h, x: &sc.mix });
        Ok(())
    }

    /// Gated DeltaNet (spec/MODEL.md §5): xn -> mix.
    fn gated_delta_net(&self, p: &mut Plan<'a>, w: &'a GdnWeights, conv: &'a Tensor, delta: &'a Tensor) {
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
        p.push(Op::Conv1dSilu {
            x: &sc.qkv,
            w: &w.conv1d,
            state: conv,
            out: &sc.conv_out,
        });
        p.push(Op::L2NormQk {
            u: &sc.conv_out,
            dims,
            eps: L2_EPS,
        });
        // §5.5 gated delta rule: the recurrence for one token, the chunked form for a batch
        let algo = if sc.t > 1 {
            DeltaAlgo::Chunked
        } else {
            DeltaAlgo::Recurrent
        };
        p.push(Op::DeltaRule {
            u: &sc.conv_out,
            g: &sc.g,
            beta: &sc.beta,
            state: delta,
            out: &sc.o,
            dims,
            algo,
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
    fn gated_attention(&self, p: &mut Plan<'a>, w: &'a AttnWeights, k_cache: &'a Tensor, v_cache: &'a Tensor) {
        let (sc, cfg) = (self.sc, self.cfg);
        let dims = cfg.attn;
        let head_dim = dims.head_dim;
        let pos = self.pos();
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
        for x in [&sc.q_normed, &sc.k_normed] {
            p.push(Op::Rope {
                x,
                head_dim,
                n_rot: cfg.n_rot,
                theta: cfg.rope_theta,
                pos,
            });
        }
        // §6.5 attention over the cache with this step's rows appended
        p.push(Op::KvStore {
            k: &sc.k_normed,
            v: &sc.v,
            k_cache,
            v_cache,
            pos,
        });
        p.push(Op::Attention {
            q: &sc.q_normed,
            k_cache,
            v_cache,
            pos,
            dims,
            scale: 1.0 / (head_dim as f32).sqrt(),
            out: &sc.att,
        });
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
            Head::AllLogits => (
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
        if head == Head::LastArgmax {
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
