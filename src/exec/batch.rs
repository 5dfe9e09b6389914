//! Decode steps of many sequences at once: one token per row, each row's state in a slot of a
//! `StatePool`. The weights are read once for all rows, so the products become small GEMMs.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use crate::backend::{Rows, SeqRow, StepMode, NON_FINITE};
use crate::error::{Error, Result};

use super::forward::{Forward, Seqs};
use super::pool::StatePool;
use super::scratch::{Head, Scratch};
use super::session::Session;
use super::Model;

impl Model {
    /// A pool of `n_slots` sequences of up to `n_ctx` tokens each.
    pub fn new_pool(&self, n_slots: usize, n_ctx: usize) -> Result<StatePool> {
        StatePool::new(self.backend.as_ref(), &self.config, n_slots, n_ctx)
    }

    /// Put `s`'s state into slot `slot`, which continues where `s` stands (after its prompt,
    /// or restored from a snapshot or the prefix cache).
    pub fn pool_load(&self, pool: &mut StatePool, slot: usize, s: &Session) -> Result<()> {
        let _guard = self.lock()?;
        pool.load(self.backend.as_ref(), slot, s)
    }

    /// Copy slot `slot`'s state into `s` (to snapshot it or go on alone).
    pub fn pool_store(&self, pool: &StatePool, slot: usize, s: &mut Session) -> Result<()> {
        let _guard = self.lock()?;
        pool.store(self.backend.as_ref(), slot, s)
    }

    /// One decode step of many sequences: row `r` feeds token `feed[r].1` to the sequence in
    /// slot `feed[r].0`. Returns each row's argmax, `None` for a row whose logits are all NaN
    /// or -inf; every slot fed advances by one position.
    pub fn decode_rows_greedy(&self, pool: &mut StatePool, feed: &[(usize, u32)]) -> Result<Vec<Option<u32>>> {
        let ids = self.rows_step(pool, feed, Head::AllArgmax, |be, sc| {
            let hb = sc.head_all.as_ref().ok_or_else(missing_head)?;
            be.read_u32(&hb.argmax)
        })?;
        Ok(ids.into_iter().map(|id| (id != NON_FINITE).then_some(id)).collect())
    }

    /// `decode_rows_greedy` returning the logits `[B, n_vocab]` of every row instead.
    pub fn decode_rows(&self, pool: &mut StatePool, feed: &[(usize, u32)]) -> Result<Vec<f32>> {
        self.rows_step(pool, feed, Head::AllLogits, |be, sc| {
            let hb = sc.head_all.as_ref().ok_or_else(missing_head)?;
            be.read_f32(&hb.logits)
        })
    }

    /// Write the rows, run the step with `head`, advance the slots, and `read` the result.
    fn rows_step<R>(
        &self,
        pool: &mut StatePool,
        feed: &[(usize, u32)],
        head: Head,
        read: impl FnOnce(&dyn crate::backend::Backend, &Scratch) -> Result<R>,
    ) -> Result<R> {
        if feed.is_empty() {
            return Err(Error::InvalidArgument("empty batch".into()));
        }
        let mut rows = Vec::with_capacity(feed.len());
        let mut seen = HashSet::with_capacity(feed.len());
        for &(slot, _) in feed {
            // The row ops refuse this too, but a replayed step runs no op code.
            if !seen.insert(slot) {
                return Err(Error::InvalidArgument(format!("slot {slot} appears in two rows")));
            }
            let pos = pool.pos(slot)?;
            if pos >= pool.n_ctx {
                return Err(Error::ContextOverflow {
                    prompt: pos,
                    generate: 1,
                    ctx: pool.n_ctx,
                });
            }
            // StatePool::new keeps slots and positions within u32.
            let (slot, pos) = (u32::try_from(slot), u32::try_from(pos));
            let (Ok(slot), Ok(pos)) = (slot, pos) else {
                return Err(Error::InvalidArgument("slot or position beyond u32".into()));
            };
            rows.push(SeqRow { slot, pos });
        }
        let tokens: Vec<u32> = feed.iter().map(|&(_, t)| t).collect();
        let pairs: Vec<u32> = rows.iter().flat_map(|r| [r.slot, r.pos]).collect();
        let be = self.backend.as_ref();
        let mut guard = self.lock()?;
        let sc = guard.scratch(be, &self.config, feed.len())?;
        sc.ensure_head(be, &self.config, head)?;
        be.write_u32(&sc.ids, &tokens)?;
        be.write_u32(&sc.rows, &pairs)?;
        let sc: &Scratch = sc;
        let f = Forward {
            cfg: &self.config,
            w: &self.weights,
            sc,
            seqs: Seqs::Pool {
                pool,
                rows: Rows {
                    host: &rows,
                    dev: &sc.rows,
                },
            },
        };
        // Offered for recording where the backend's row ops read the rows on the device: then
        // the step is the same ops on the same buffers whatever its rows (only `ids` and `rows`
        // change), named by the pool, the scratch, the batch size and the head.
        let b = feed.len();
        let key = be.records_rows(b).then(|| step_key(pool.uid, sc.uid, b, head));
        let mode = match key {
            Some(k) => be.step_begin(k)?,
            None => StepMode::Run,
        };
        if mode != StepMode::Replayed {
            let r = f.step(head).and_then(|p| be.run_plan(&p));
            if let Some(k) = key {
                be.step_end(k, r.is_ok())?;
            }
            r?;
        }
        let out = read(be, sc)?;
        for &(slot, _) in feed {
            pool.advance(slot);
        }
        Ok(out)
    }
}

/// The key of a recorded step of rows: the pool, the scratch, the batch size and the head. A
/// hash, tagged, so that it cannot meet the one-sequence keys (`Model::run_step`) but by chance.
fn step_key(pool: u64, scratch: u64, b: usize, head: Head) -> u64 {
    let mut h = DefaultHasher::new();
    ("rows step", pool, scratch, b, head as u8).hash(&mut h);
    h.finish()
}

fn missing_head() -> Error {
    Error::Backend("head buffers missing".into())
}
