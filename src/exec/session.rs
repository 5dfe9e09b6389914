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

/// The state of one layer inside a [`Snapshot`].
pub enum SnapshotLayer {
    Gdn {
        conv: Tensor,
        delta: Tensor,
    },
    /// Only the `pos` cache rows in use, `[pos, Hkv*D]` (absent at `pos == 0`).
    Attn {
        kv: Option<(Tensor, Tensor)>,
    },
}

/// A compact, device-resident copy of a session's state at a token boundary: the conv and delta
/// states plus only the KV rows in use, so a snapshot at position `p` costs
/// `p * kv_width` floats per attention layer, not the whole context. Restoring copies it back into
/// a session's existing buffers (`Session::restore_from`), which keeps every buffer a backend may
/// have recorded work against (CUDA graphs) in place.
pub struct Snapshot {
    pub layers: Vec<SnapshotLayer>,
    /// Tokens the state has consumed (the session's `pos` when it was taken).
    pub pos: usize,
    bytes: u64,
}

impl Snapshot {
    /// Device memory the snapshot holds, in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Build a snapshot from tensors made elsewhere (e.g. read from a state file). Shapes are
    /// checked against a session when it is restored.
    pub fn from_parts(layers: Vec<SnapshotLayer>, pos: usize) -> Snapshot {
        let bytes = layers
            .iter()
            .map(|l| match l {
                SnapshotLayer::Gdn { conv, delta } => tensor_bytes(conv) + tensor_bytes(delta),
                SnapshotLayer::Attn { kv: Some((k, v)) } => tensor_bytes(k) + tensor_bytes(v),
                SnapshotLayer::Attn { kv: None } => 0,
            })
            .sum();
        Snapshot { layers, pos, bytes }
    }
}

fn tensor_bytes(t: &Tensor) -> u64 {
    t.numel() as u64 * 4
}

impl Session {
    /// A compact copy of the current state on the device (see [`Snapshot`]).
    pub fn snapshot_compact(&self, backend: &dyn Backend) -> Result<Snapshot> {
        if let Some(available) = backend.memory_available() {
            let needed = self.compact_bytes();
            if needed > available {
                return Err(Error::OutOfMemory {
                    what: format!("a snapshot of {} positions", self.pos),
                    needed,
                    available,
                });
            }
        }
        let copy = |t: &Tensor| -> Result<Tensor> {
            let n = backend.alloc(t.dtype, &t.shape)?;
            backend.copy(t, &n)?;
            Ok(n)
        };
        let rows = |t: &Tensor| -> Result<Tensor> {
            let n = backend.alloc(t.dtype, &[self.pos, t.cols()])?;
            backend.copy_rows(t, 0, &n, 0, self.pos)?;
            Ok(n)
        };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(match l {
                    LayerState::Gdn { conv, delta } => SnapshotLayer::Gdn {
                        conv: copy(conv)?,
                        delta: copy(delta)?,
                    },
                    LayerState::Attn { k, v } if self.pos > 0 => SnapshotLayer::Attn {
                        kv: Some((rows(k)?, rows(v)?)),
                    },
                    LayerState::Attn { .. } => SnapshotLayer::Attn { kv: None },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Snapshot::from_parts(layers, self.pos))
    }

    /// Device bytes a compact snapshot of the current state takes.
    pub fn compact_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Gdn { conv, delta } => tensor_bytes(conv) + tensor_bytes(delta),
                LayerState::Attn { k, v } => (k.cols() + v.cols()) as u64 * self.pos as u64 * 4,
            })
            .sum()
    }

    /// Continue from `snap`: copy its state into this session's own buffers (never replacing
    /// them) and move to its position. Fails without touching the session when the snapshot
    /// does not fit (other layer types or widths, or more tokens than this session's context).
    pub fn restore_from(&mut self, backend: &dyn Backend, snap: &Snapshot) -> Result<()> {
        let mismatch = |what: &str| Error::InvalidArgument(format!("snapshot does not match the session: {what}"));
        if snap.pos > self.n_ctx {
            return Err(Error::ContextOverflow {
                prompt: snap.pos,
                generate: 0,
                ctx: self.n_ctx,
            });
        }
        if snap.layers.len() != self.layers.len() {
            return Err(mismatch("layer count"));
        }
        for (l, s) in self.layers.iter().zip(&snap.layers) {
            let ok = match (l, s) {
                (LayerState::Gdn { conv, delta }, SnapshotLayer::Gdn { conv: c, delta: d }) => {
                    conv.shape == c.shape && delta.shape == d.shape
                }
                (LayerState::Attn { .. }, SnapshotLayer::Attn { kv: None }) => snap.pos == 0,
                (LayerState::Attn { k, v }, SnapshotLayer::Attn { kv: Some((sk, sv)) }) => {
                    sk.shape == [snap.pos, k.cols()] && sv.shape == [snap.pos, v.cols()]
                }
                _ => false,
            };
            if !ok {
                return Err(mismatch("layer types or shapes"));
            }
        }
        for (l, s) in self.layers.iter().zip(&snap.layers) {
            match (l, s) {
                (LayerState::Gdn { conv, delta }, SnapshotLayer::Gdn { conv: c, delta: d }) => {
                    backend.copy(c, conv)?;
                    backend.copy(d, delta)?;
                }
                (LayerState::Attn { k, v }, SnapshotLayer::Attn { kv: Some((sk, sv)) }) => {
                    backend.copy_rows(sk, 0, k, 0, snap.pos)?;
                    backend.copy_rows(sv, 0, v, 0, snap.pos)?;
                }
                _ => {} // nothing cached yet: rows past `pos` are never read
            }
        }
        self.pos = snap.pos;
        Ok(())
    }
}
