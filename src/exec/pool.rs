//! A pool of sequence slots: the state of many sequences in one set of device buffers, so that
//! one step can read and write the state of each of its rows (`backend::rows` gives the layouts).
//!
//! A sequence enters a slot from a `Session` (`StatePool::load`: after its prompt ran, or
//! restored from a snapshot or the prefix cache) and leaves it into one (`StatePool::store`), so
//! sessions, snapshots and the prefix cache keep working as they are.

use crate::backend::{Backend, DType, Tensor};
use crate::error::{Error, Result};
use crate::model::Config;

use super::session::{LayerState, Session};

/// The pool's buffers of one layer.
pub enum PoolLayer {
    Gdn {
        /// `[S * (K-1), conv_dim]`.
        conv: Tensor,
        /// `[S * Hv * dv, dk]`.
        delta: Tensor,
    },
    Attn {
        /// `[S * n_ctx, Hkv*D]`.
        k: Tensor,
        v: Tensor,
    },
}

/// `n_slots` sequences of up to `n_ctx` tokens each.
pub struct StatePool {
    pub layers: Vec<PoolLayer>,
    /// Tokens each slot's sequence has processed (= the position of its next token).
    pos: Vec<usize>,
    pub n_ctx: usize,
    /// Names the pool's buffers in the keys of recorded steps (`super::next_uid`).
    pub(crate) uid: u64,
}

impl StatePool {
    pub(crate) fn new(backend: &dyn Backend, cfg: &Config, n_slots: usize, n_ctx: usize) -> Result<StatePool> {
        if n_slots == 0 || n_ctx == 0 {
            return Err(Error::InvalidArgument(
                "a state pool needs at least one slot and one token of context".into(),
            ));
        }
        if u32::try_from(n_ctx).is_err() || u32::try_from(n_slots).is_err() {
            return Err(Error::InvalidArgument(format!(
                "{n_slots} slots of {n_ctx} tokens exceed the largest supported ({})",
                u32::MAX
            )));
        }
        let needed = StatePool::bytes_needed(cfg, n_slots, n_ctx);
        if let Some(available) = backend.memory_available() {
            if needed > available {
                return Err(Error::OutOfMemory {
                    what: format!("a state pool of {n_slots} sequences of {n_ctx} tokens"),
                    needed,
                    available,
                });
            }
        }
        let g = cfg.gdn;
        let kv_width = cfg.attn.n_head_kv * cfg.attn.head_dim;
        let rows = |per_slot: usize| {
            per_slot
                .checked_mul(n_slots)
                .ok_or_else(|| Error::InvalidArgument(format!("{n_slots} slots of {per_slot} rows overflow")))
        };
        let layers = cfg
            .is_linear
            .iter()
            .map(|&linear| {
                Ok(if linear {
                    PoolLayer::Gdn {
                        conv: backend.alloc(DType::F32, &[rows(cfg.conv_kernel - 1)?, g.conv_dim()])?,
                        delta: backend.alloc(DType::F32, &[rows(g.hv * g.dv)?, g.dk])?,
                    }
                } else {
                    PoolLayer::Attn {
                        k: backend.alloc(DType::F32, &[rows(n_ctx)?, kv_width])?,
                        v: backend.alloc(DType::F32, &[rows(n_ctx)?, kv_width])?,
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(StatePool {
            layers,
            pos: vec![0; n_slots],
            n_ctx,
            uid: super::next_uid(),
        })
    }

    /// Bytes of device memory a pool of `n_slots` sequences of `n_ctx` tokens holds.
    pub fn bytes_needed(cfg: &Config, n_slots: usize, n_ctx: usize) -> u64 {
        Session::bytes_needed(cfg, n_ctx).saturating_mul(n_slots as u64)
    }

    pub fn n_slots(&self) -> usize {
        self.pos.len()
    }

    /// The position of the next token of slot `slot`'s sequence.
    pub fn pos(&self, slot: usize) -> Result<usize> {
        self.pos.get(slot).copied().ok_or_else(|| self.no_slot(slot))
    }

    pub(crate) fn advance(&mut self, slot: usize) {
        if let Some(p) = self.pos.get_mut(slot) {
            *p += 1;
        }
    }

    fn no_slot(&self, slot: usize) -> Error {
        Error::InvalidArgument(format!("slot {slot} of a pool of {}", self.n_slots()))
    }

    /// Copy `s`'s state into slot `slot`; the slot continues where `s` stands.
    pub(crate) fn load(&mut self, be: &dyn Backend, slot: usize, s: &Session) -> Result<()> {
        self.check_transfer(slot, s, s.pos)?;
        for (pl, sl) in self.layers.iter().zip(&s.layers) {
            match (pl, sl) {
                (PoolLayer::Gdn { conv, delta }, LayerState::Gdn { conv: sc, delta: sd }) => {
                    let n = sc.rows();
                    be.copy_rows(sc, 0, conv, slot * n, n)?;
                    let sd = as_rows(sd)?;
                    let n = sd.rows();
                    be.copy_rows(&sd, 0, delta, slot * n, n)?;
                }
                (PoolLayer::Attn { k, v }, LayerState::Attn { k: sk, v: sv }) => {
                    if s.pos > 0 {
                        be.copy_rows(sk, 0, k, slot * self.n_ctx, s.pos)?;
                        be.copy_rows(sv, 0, v, slot * self.n_ctx, s.pos)?;
                    }
                }
                _ => return Err(mismatch()),
            }
        }
        self.pos[slot] = s.pos;
        Ok(())
    }

    /// Copy slot `slot`'s state into `s`, which then continues where the slot stands.
    pub(crate) fn store(&self, be: &dyn Backend, slot: usize, s: &mut Session) -> Result<()> {
        let pos = self.pos(slot)?;
        self.check_transfer(slot, s, pos)?;
        for (pl, sl) in self.layers.iter().zip(&s.layers) {
            match (pl, sl) {
                (PoolLayer::Gdn { conv, delta }, LayerState::Gdn { conv: sc, delta: sd }) => {
                    let n = sc.rows();
                    be.copy_rows(conv, slot * n, sc, 0, n)?;
                    let sd = as_rows(sd)?;
                    let n = sd.rows();
                    be.copy_rows(delta, slot * n, &sd, 0, n)?;
                }
                (PoolLayer::Attn { k, v }, LayerState::Attn { k: sk, v: sv }) => {
                    if pos > 0 {
                        be.copy_rows(k, slot * self.n_ctx, sk, 0, pos)?;
                        be.copy_rows(v, slot * self.n_ctx, sv, 0, pos)?;
                    }
                }
                _ => return Err(mismatch()),
            }
        }
        s.pos = pos;
        Ok(())
    }

    /// A slot of this pool, a session of the same model, and `pos` tokens that fit both.
    fn check_transfer(&self, slot: usize, s: &Session, pos: usize) -> Result<()> {
        if slot >= self.n_slots() {
            return Err(self.no_slot(slot));
        }
        if s.layers.len() != self.layers.len() {
            return Err(mismatch());
        }
        let room = self.n_ctx.min(s.n_ctx);
        if pos > room {
            return Err(Error::ContextOverflow {
                prompt: pos,
                generate: 0,
                ctx: room,
            });
        }
        Ok(())
    }
}

/// A session's delta state `[Hv, dv, dk]` seen as rows `[Hv*dv, dk]`.
fn as_rows(delta: &Tensor) -> Result<Tensor> {
    let dk = delta.cols();
    delta.reshaped(&[delta.numel() / dk.max(1), dk])
}

fn mismatch() -> Error {
    Error::Backend("session does not match the pool's layer types".into())
}
