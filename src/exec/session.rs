//! Per-sequence state: conv and delta state per GDN layer, KV cache per attention layer.

use crate::backend::{Backend, DType, Tensor};
use crate::error::{Error, Result};
use crate::model::Config;

/// State of one layer.
pub enum LayerState {
    Gdn {
        /// `[K-1, conv_dim]` raw projections of the previous K-1 tokens, oldest first.
        conv: Tensor,
        /// `[Hv, dv, dk]` value-major delta state (fp32).
        delta: Tensor,
    },
    Attn {
        /// `[n_ctx, Hkv*D]` RoPE'd, normed keys.
        k: Tensor,
        /// `[n_ctx, Hkv*D]` values.
        v: Tensor,
    },
}

/// One sequence's caches. Decode continues from exactly the state prefill left.
pub struct Session {
    /// Unique per set of state buffers (`super::next_uid`): a backend that records decode steps
    /// keys them by it. Restoring a snapshot copies into these buffers and keeps the uid.
    pub(crate) uid: u64,
    pub layers: Vec<LayerState>,
    /// Tokens processed so far (= position of the next token).
    pub pos: usize,
    /// Capacity of the KV cache in tokens.
    pub n_ctx: usize,
}

impl Session {
    pub(crate) fn new(backend: &dyn Backend, cfg: &Config, n_ctx: usize) -> Result<Session> {
        if n_ctx == 0 {
            return Err(Error::InvalidArgument("context size must be at least 1".into()));
        }
        // Positions reach the device as u32.
        if u32::try_from(n_ctx).is_err() {
            return Err(Error::InvalidArgument(format!(
                "context size {n_ctx} exceeds the largest supported ({})",
                u32::MAX
            )));
        }
        let g = cfg.gdn;
        let kv_width = cfg.attn.n_head_kv * cfg.attn.head_dim;
        let needed = Session::bytes_needed(cfg, n_ctx);
        if let Some(available) = backend.memory_available() {
            if needed > available {
                return Err(Error::OutOfMemory {
                    what: format!("a session of {n_ctx} tokens of context (KV cache and recurrent state)"),
                    needed,
                    available,
                });
            }
        }
        let layers = cfg
            .is_linear
            .iter()
            .map(|&linear| {
                Ok(if linear {
                    LayerState::Gdn {
                        conv: backend.alloc(DType::F32, &[cfg.conv_kernel - 1, g.conv_dim()])?,
                        delta: backend.alloc(DType::F32, &[g.hv, g.dv, g.dk])?,
                    }
                } else {
                    LayerState::Attn {
                        k: backend.alloc(DType::F32, &[n_ctx, kv_width])?,
                        v: backend.alloc(DType::F32, &[n_ctx, kv_width])?,
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Session {
            uid: super::next_uid(),
            layers,
            pos: 0,
            n_ctx,
        })
    }

    /// Bytes of state a session of `n_ctx` tokens holds (f32 KV caches, conv and delta states).
    pub fn bytes_needed(cfg: &Config, n_ctx: usize) -> u64 {
        let g = cfg.gdn;
        let kv_width = (cfg.attn.n_head_kv * cfg.attn.head_dim) as u64;
        let per_layer = |linear: bool| -> u64 {
            if linear {
                ((cfg.conv_kernel.saturating_sub(1) * g.conv_dim()) as u64).saturating_add((g.hv * g.dv * g.dk) as u64)
            } else {
                2u64.saturating_mul(n_ctx as u64).saturating_mul(kv_width)
            }
        };
        cfg.is_linear
            .iter()
            .fold(0u64, |acc, &l| acc.saturating_add(per_layer(l)))
            .saturating_mul(4)
    }

    /// Forget everything: zero all state and restart at position 0.
    pub fn reset(&mut self, backend: &dyn Backend) -> Result<()> {
        for l in &self.layers {
            match l {
                LayerState::Gdn { conv, delta } => {
                    backend.zero(conv)?;
                    backend.zero(delta)?;
                }
                LayerState::Attn { .. } => {} // rows past `pos` are never read
            }
        }
        self.pos = 0;
        Ok(())
    }

    /// A deep copy of the state (for multi-turn reuse, prompt caching, rollback).
    pub fn snapshot(&self, backend: &dyn Backend) -> Result<Session> {
        let copy = |t: &Tensor| -> Result<Tensor> {
            let n = backend.alloc(t.dtype, &t.shape)?;
            backend.copy(t, &n)?;
            Ok(n)
        };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(match l {
                    LayerState::Gdn { conv, delta } => LayerState::Gdn {
                        conv: copy(conv)?,
                        delta: copy(delta)?,
                    },
                    LayerState::Attn { k, v } => LayerState::Attn {
                        k: copy(k)?,
                        v: copy(v)?,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Session {
            uid: super::next_uid(),
            layers,
            pos: self.pos,
            n_ctx: self.n_ctx,
        })
    }
}
