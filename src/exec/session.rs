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
        let g = cfg.gdn;
        let kv_width = cfg.attn.n_head_kv * cfg.attn.head_dim;
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
        Ok(Session { layers, pos: 0, n_ctx })
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
            layers,
            pos: self.pos,
            n_ctx: self.n_ctx,
        })
    }
}
