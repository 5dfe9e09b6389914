//! Activation buffers for a batch of T tokens, allocated once per batch size and reused
//! (decode reuses its T = 1 set every token: no allocation in the token loop).

use crate::backend::{Backend, DType, Tensor};
use crate::error::Result;
use crate::model::Config;

/// Which logits a step's head computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// None (a prefill batch whose logits nobody wants).
    None,
    /// The logits of the last position.
    LastLogits,
    /// The logits of every position.
    AllLogits,
    /// The argmax of the last position's logits, computed on the device.
    LastArgmax,
    /// The argmax of every position's logits (one per row of a batch of sequences).
    AllArgmax,
}

/// Final norm + LM head buffers for `rows` positions.
pub struct HeadBuffers {
    /// `[1, d]`: the last residual row of a multi-token batch, when only its logits are wanted.
    pub last_row: Tensor,
    /// `[rows, d]` normed hidden states.
    pub normed: Tensor,
    /// `[rows, n_vocab]`.
    pub logits: Tensor,
    /// U32 `[rows]` on-device argmax.
    pub argmax: Tensor,
}

impl HeadBuffers {
    pub fn new(backend: &dyn Backend, cfg: &Config, rows: usize) -> Result<HeadBuffers> {
        Ok(HeadBuffers {
            last_row: backend.alloc(DType::F32, &[1, cfg.n_embd])?,
            normed: backend.alloc(DType::F32, &[rows, cfg.n_embd])?,
            logits: backend.alloc(DType::F32, &[rows, cfg.n_vocab])?,
            argmax: backend.alloc(DType::U32, &[rows])?,
        })
    }
}

pub struct Scratch {
    /// Unique among the executor's scratches and sessions (`super::next_uid`): recorded steps
    /// are keyed by it, so new buffers never replay an old recording.
    pub uid: u64,
    pub t: usize,
    /// U32 `[T]` token ids of the batch.
    pub ids: Tensor,
    /// U32 `[1]` position of the batch's first token (`Pos::dev`).
    pub pos: Tensor,
    /// U32 `[T, 2]` `(slot, pos)` of each row of a step of many sequences (`Rows::dev`).
    pub rows: Tensor,
    /// Residual stream `[T, d]`.
    pub h: Tensor,
    /// Normed input of a mixer/FFN `[T, d]`.
    pub xn: Tensor,
    /// Output of a mixer/FFN `[T, d]`, added into `h`.
    pub mix: Tensor,
    // Gated DeltaNet
    /// The raw `[q | k | v]` projection `[T, conv_dim]` (conv input).
    pub qkv: Tensor,
    pub conv_out: Tensor,
    pub z: Tensor,
    pub a: Tensor,
    pub b: Tensor,
    pub g: Tensor,
    pub beta: Tensor,
    pub o: Tensor,
    pub o_normed: Tensor,
    // attention
    pub qg: Tensor,
    pub q: Tensor,
    pub q_normed: Tensor,
    pub gate: Tensor,
    pub k: Tensor,
    pub k_normed: Tensor,
    pub v: Tensor,
    pub att: Tensor,
    // FFN (dense width, or the shared expert's width for MoE)
    pub ff_gate: Tensor,
    pub ff_up: Tensor,
    pub ff_act: Tensor,
    // MoE
    pub router_logits: Option<Tensor>,
    pub expert_ids: Option<Tensor>,
    pub expert_w: Option<Tensor>,
    pub shared_out: Option<Tensor>,
    pub shared_gate: Option<Tensor>,
    /// LM head of the last position.
    pub head_last: HeadBuffers,
    /// LM head of all T positions, made when first asked for.
    pub head_all: Option<HeadBuffers>,
}

impl Scratch {
    pub fn new(backend: &dyn Backend, cfg: &Config, t: usize, uid: u64) -> Result<Scratch> {
        let f = |shape: &[usize]| backend.alloc(DType::F32, shape);
        let d = cfg.n_embd;
        let g = cfg.gdn;
        let a = cfg.attn;
        let hd = a.n_head * a.head_dim;
        let kvd = a.n_head_kv * a.head_dim;
        let ff = match &cfg.moe {
            Some(m) => m.n_ff_shexp,
            None => cfg.n_ff,
        };
        let moe = cfg.moe.as_ref();
        Ok(Scratch {
            uid,
            t,
            ids: backend.alloc(DType::U32, &[t])?,
            pos: backend.alloc(DType::U32, &[1])?,
            rows: backend.alloc(DType::U32, &[t, 2])?,
            h: f(&[t, d])?,
            xn: f(&[t, d])?,
            mix: f(&[t, d])?,
            qkv: f(&[t, g.conv_dim()])?,
            conv_out: f(&[t, g.conv_dim()])?,
            z: f(&[t, g.value_dim()])?,
            a: f(&[t, g.hv])?,
            b: f(&[t, g.hv])?,
            g: f(&[t, g.hv])?,
            beta: f(&[t, g.hv])?,
            o: f(&[t, g.value_dim()])?,
            o_normed: f(&[t, g.value_dim()])?,
            qg: f(&[t, 2 * hd])?,
            q: f(&[t, hd])?,
            q_normed: f(&[t, hd])?,
            gate: f(&[t, hd])?,
            k: f(&[t, kvd])?,
            k_normed: f(&[t, kvd])?,
            v: f(&[t, kvd])?,
            att: f(&[t, hd])?,
            ff_gate: f(&[t, ff])?,
            ff_up: f(&[t, ff])?,
            ff_act: f(&[t, ff])?,
            router_logits: moe.map(|m| f(&[t, m.n_expert])).transpose()?,
            expert_ids: moe
                .map(|m| backend.alloc(DType::U32, &[t, m.n_expert_used]))
                .transpose()?,
            expert_w: moe.map(|m| f(&[t, m.n_expert_used])).transpose()?,
            shared_out: moe.map(|_| f(&[t, d])).transpose()?,
            shared_gate: moe.map(|_| f(&[t, 1])).transpose()?,
            head_last: HeadBuffers::new(backend, cfg, 1)?,
            head_all: None,
        })
    }

    /// The head's buffers for `head`: those of every position are made when first asked for.
    pub fn ensure_head(&mut self, backend: &dyn Backend, cfg: &Config, head: Head) -> Result<()> {
        if matches!(head, Head::AllLogits | Head::AllArgmax) && self.head_all.is_none() {
            self.head_all = Some(HeadBuffers::new(backend, cfg, self.t)?);
        }
        Ok(())
    }
}
