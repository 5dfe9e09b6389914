//! Generation that resumes from the prefix cache: the one token loop behind `rill chat`, and the
//! prompt side of `rill serve`. It owns the model and a single live session; every request
//! restores the longest cached prefix of its prompt (or continues the live session when that is
//! longer), prefills only the remaining tokens, and snapshots at the points the caller names so
//! later requests hit.
//!
//! `rill serve` runs many sequences: it uses the live session to run prompts a chunk at a time
//! (`begin_prompt`, `advance`, `store_snapshot`) and moves sequences between it and the slots of a
//! `StatePool` (`park`, `unpark`), so resuming and caching work the same way for every sequence.

use std::time::Instant;

use super::prefix::{CacheStats, PrefixCache};
use crate::error::{Error, Result};
use crate::exec::{Logits, Model, Session, Snapshot, StatePool};
use crate::sample::Sampler;

/// What the token callback wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model produced an end-of-generation token.
    Eog,
    /// `max_new` tokens were generated.
    Length,
    /// The callback asked to stop (a stop string, a client that went away).
    Stopped,
}

/// The result of one `generate` call.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub prompt_tokens: usize,
    /// Leading prompt tokens that were not run again (cache hit or live session).
    pub cached_tokens: usize,
    /// Sampled tokens passed to the callback (an end-of-generation token is not included).
    pub generated: Vec<u32>,
    pub finish: Finish,
    /// Seconds from the call to the first sampled token (restore + prefill + first sample).
    pub first_token_secs: f64,
    /// Seconds spent after the first token.
    pub decode_secs: f64,
}

/// Where a prompt starts (`Engine::begin_prompt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptStart {
    /// Leading prompt tokens the live session already holds (restored or continued).
    pub start: usize,
    /// Prompt positions past `start`, ascending, after which to store a snapshot.
    pub points: Vec<usize>,
}

/// Engine state for `/stats` and `/health`.
#[derive(Debug, Clone, Copy)]
pub struct EngineStats {
    pub cache: CacheStats,
    /// Tokens in the live session and its capacity.
    pub pos: usize,
    pub n_ctx: usize,
}

pub struct Engine {
    model: Model,
    session: Session,
    /// The tokens the live session has consumed (its `pos` equals their count).
    tokens: Vec<u32>,
    cache: PrefixCache,
    /// Also snapshot every `every` prompt tokens (0 = only at the caller's points).
    every: usize,
}

impl Engine {
    /// An engine with one session of `n_ctx` tokens and a cache of `cache_bytes`.
    pub fn new(model: Model, n_ctx: usize, cache_bytes: u64, every: usize) -> Result<Engine> {
        let session = model.new_session(n_ctx)?;
        Ok(Engine {
            model,
            session,
            tokens: Vec::new(),
            cache: PrefixCache::new(cache_bytes),
            every,
        })
    }

    /// Serve the following requests for `tenant`: they resume only from its own cache entries
    /// (see `PrefixCache::set_tenant`), and not from the live session when another tenant's
    /// request left it there.
    pub fn set_tenant(&mut self, tenant: &str) {
        if self.cache.tenant() != tenant {
            self.tokens.clear();
            self.cache.set_tenant(tenant);
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn n_ctx(&self) -> usize {
        self.session.n_ctx
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            cache: self.cache.stats(),
            pos: self.session.pos,
            n_ctx: self.session.n_ctx,
        }
    }

    /// The tokens the live session has consumed.
    pub fn live_tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forget the live session and every cached snapshot.
    pub fn reset(&mut self) -> Result<()> {
        self.cache.clear();
        self.forget_live()
    }

    /// Forget what the live session holds without touching it (after a failed step its state is
    /// unknown): no later request resumes from it.
    pub fn invalidate_live(&mut self) {
        self.tokens.clear();
    }

    fn forget_live(&mut self) -> Result<()> {
        self.tokens.clear();
        self.session.reset(self.model.backend().as_ref())
    }

    /// Run `prompt` and sample up to `max_new` tokens, calling `on_token` with each one that is not
    /// end-of-generation (`is_eog`). `snap_at`: prompt positions after which to store a snapshot.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        snap_at: &[usize],
        max_new: usize,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> Result<Flow>,
    ) -> Result<Outcome> {
        let n = prompt.len();
        if n == 0 {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        let total = n.saturating_add(max_new);
        if total > self.session.n_ctx {
            return Err(Error::ContextOverflow {
                prompt: n,
                generate: max_new,
                ctx: self.session.n_ctx,
            });
        }
        let t0 = Instant::now();
        let result = self.generate_steps(prompt, snap_at, max_new, sampler, is_eog, on_token, t0);
        if result.is_err() {
            // A failed step leaves the session somewhere unknown: start over next time.
            self.tokens.clear();
        }
        result
    }

    /// `generate` after its checks.
    #[allow(clippy::too_many_arguments)]
    fn generate_steps(
        &mut self,
        prompt: &[u32],
        snap_at: &[usize],
        max_new: usize,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> Result<Flow>,
        t0: Instant,
    ) -> Result<Outcome> {
        let PromptStart { start, points } = self.begin_prompt(prompt, snap_at)?;
        for p in points {
            self.advance(&prompt[self.tokens.len()..p])?;
            self.store_snapshot()?;
        }
        for &t in prompt {
            sampler.accept(t);
        }
        let rest = &prompt[self.tokens.len()..];
        let mut next = if sampler.is_greedy() {
            let t = self.model.prefill_greedy(&mut self.session, rest, &mut |_, _| {})?;
            sampler.accept(t);
            t
        } else {
            let logits = self
                .model
                .prefill(&mut self.session, rest, Logits::Last, &mut |_, _| {})?;
            sampler.sample(&logits)?
        };
        self.tokens.extend_from_slice(rest);
        let first_token_secs = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();

        let mut generated = Vec::new();
        // What ends generation after `t` was sampled, if anything (the token is kept unless EOG).
        let mut check = |t: u32, generated: &mut Vec<u32>| -> Result<Option<Finish>> {
            if is_eog(t) {
                return Ok(Some(Finish::Eog));
            }
            generated.push(t);
            if on_token(t)? == Flow::Stop {
                return Ok(Some(Finish::Stopped));
            }
            Ok((generated.len() >= max_new).then_some(Finish::Length))
        };
        let finish = if let Some(f) = check(next, &mut generated)? {
            f
        } else if sampler.is_greedy() {
            // The host one step ahead of the device (`Model::generate_greedy`). The session then
            // also consumes the token generation stopped at (its step was already enqueued):
            // `self.tokens` follows what it consumed.
            let pos0 = self.session.pos;
            let mut finish = Finish::Length;
            let toks = self
                .model
                .generate_greedy(&mut self.session, next, max_new - generated.len(), &mut |t| {
                    sampler.accept(t);
                    Ok(match check(t, &mut generated)? {
                        Some(f) => {
                            finish = f;
                            false
                        }
                        None => true,
                    })
                })?;
            let fed = self.session.pos - pos0;
            self.tokens.push(next);
            self.tokens
                .extend_from_slice(&toks[..fed.saturating_sub(1).min(toks.len())]);
            finish
        } else {
            loop {
                let fed = next;
                let logits = self.model.decode(&mut self.session, fed)?;
                next = sampler.sample(&logits)?;
                self.tokens.push(fed);
                if let Some(f) = check(next, &mut generated)? {
                    break f;
                }
            }
        };
        Ok(Outcome {
            prompt_tokens: prompt.len(),
            cached_tokens: start,
            generated,
            finish,
            first_token_secs,
            decode_secs: t1.elapsed().as_secs_f64(),
        })
    }

    /// Start a (non-empty) prompt: bring the live session to its longest available prefix
    /// (`resume`), count the cache hit or miss, and list the snapshot points still ahead: the
    /// caller's `snap_at` and every `--cache-every` tokens, up to the prompt's last token.
    pub fn begin_prompt(&mut self, prompt: &[u32], snap_at: &[usize]) -> Result<PromptStart> {
        if prompt.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        let start = self.resume(prompt)?;
        self.cache.record(start);
        let last = prompt.len() - 1;
        let mut points: Vec<usize> = snap_at.iter().copied().filter(|&p| p > start && p <= last).collect();
        if self.every > 0 && self.cache.enabled() {
            points.extend((1..=last / self.every).map(|k| k * self.every).filter(|&p| p > start));
        }
        points.sort_unstable();
        points.dedup();
        Ok(PromptStart { start, points })
    }

    /// Bring the session to the longest available prefix of `tokens` (keeping at least one token
    /// to run): the live session when it is a prefix, else the best cache hit, else empty.
    /// Returns the number of tokens already consumed.
    fn resume(&mut self, tokens: &[u32]) -> Result<usize> {
        if !self.cache.enabled() {
            // Reuse is off (`--cache-mem 0`): every prompt runs from the start.
            self.forget_live()?;
            return Ok(0);
        }
        let live = if self.tokens.len() < tokens.len() && tokens.starts_with(&self.tokens) {
            self.tokens.len()
        } else {
            0
        };
        let hit = self.cache.lookup(tokens, live);
        match hit {
            Some(h) => {
                let be = self.model.backend().as_ref();
                self.session.restore_from(be, h.snap)?;
                self.tokens.clear();
                self.tokens.extend_from_slice(&tokens[..h.len]);
                Ok(h.len)
            }
            None if live > 0 => Ok(live),
            None => {
                self.forget_live()?;
                Ok(0)
            }
        }
    }

    /// Prefill `tokens` into the live session without reading logits. After an error the live
    /// session is forgotten (its state is somewhere unknown).
    pub fn advance(&mut self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Ok(());
        }
        if let Err(e) = self
            .model
            .prefill(&mut self.session, tokens, Logits::None, &mut |_, _| {})
        {
            self.tokens.clear();
            return Err(e);
        }
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Copy the live session into slot `slot` of `pool`: a prompt that ran here goes on decoding
    /// there, or waits there for its next chunk while another sequence uses the live session.
    /// The live session keeps its state (a later prompt may still continue from it).
    pub fn park(&self, pool: &mut StatePool, slot: usize) -> Result<()> {
        self.model.pool_load(pool, slot, &self.session)
    }

    /// Make the sequence in slot `slot`, which has consumed `tokens`, the live session (to run
    /// more of it, or snapshot it into the cache).
    pub fn unpark(&mut self, pool: &StatePool, slot: usize, tokens: &[u32]) -> Result<()> {
        // Until the copy is complete the session holds nothing the cache can name.
        self.tokens.clear();
        self.model.pool_store(pool, slot, &mut self.session)?;
        if self.session.pos != tokens.len() {
            return Err(Error::Backend(format!(
                "slot {slot} holds {} positions, its sequence {} tokens",
                self.session.pos,
                tokens.len()
            )));
        }
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Snapshot the live session into the cache (unless that exact sequence is cached already).
    pub fn store_snapshot(&mut self) -> Result<()> {
        if !self.cache.enabled() || self.tokens.is_empty() || self.cache.contains(&self.tokens) {
            return Ok(());
        }
        match self.session.snapshot_compact(self.model.backend().as_ref()) {
            Ok(snap) => {
                self.cache.insert(self.tokens.clone(), snap);
                Ok(())
            }
            // The device is full: serve without caching this point rather than fail the request.
            Err(Error::OutOfMemory { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Make the state after exactly `tokens` available to later requests: resume from the longest
    /// known prefix, prefill the rest and snapshot. Used after a chat turn to cache the
    /// conversation the way the template will render it next time (which differs from the tokens
    /// that were generated: the template drops the reasoning of earlier turns). Does nothing when
    /// no known prefix exists (that would be a whole prefill) or the snapshot could not be kept.
    pub fn cache_sequence(&mut self, tokens: &[u32]) -> Result<()> {
        let result = (|| {
            if self.begin_caching(tokens)? {
                let done = self.tokens.len();
                self.advance(&tokens[done..])?;
                self.store_snapshot()?;
            }
            Ok(())
        })();
        if result.is_err() {
            self.tokens.clear();
        }
        result
    }

    /// The first half of `cache_sequence`: false when `tokens` need no caching (cached already,
    /// caching off, too large to keep) or have no known prefix to extend; otherwise the live
    /// session holds a prefix of them (`live_tokens`), and the caller runs the rest (`advance`)
    /// and snapshots (`store_snapshot`).
    pub fn begin_caching(&mut self, tokens: &[u32]) -> Result<bool> {
        if !self.cache.enabled() || tokens.is_empty() || self.cache.contains(tokens) {
            return Ok(false);
        }
        // Not worth a prefill when the result could not be kept or continued.
        let size = Session::bytes_needed(&self.model.config, tokens.len());
        if tokens.len() > self.session.n_ctx || size > self.cache.stats().budget {
            return Ok(false);
        }
        if self.tokens != tokens {
            let start = self.resume(tokens)?;
            if start == 0 {
                return Ok(false); // nothing to extend: this would be a whole prefill
            }
        }
        Ok(true)
    }

    /// A snapshot of the live session (for saving it to disk) and the tokens it covers.
    pub fn snapshot_live(&self) -> Result<(Vec<u32>, Snapshot)> {
        let snap = self.session.snapshot_compact(self.model.backend().as_ref())?;
        Ok((self.tokens.clone(), snap))
    }

    /// Make `snap` (the state after `tokens`, e.g. loaded from disk) the live session, and cache it.
    pub fn load_live(&mut self, tokens: Vec<u32>, snap: Snapshot) -> Result<()> {
        if snap.pos != tokens.len() {
            return Err(Error::InvalidArgument(format!(
                "state holds {} positions but {} tokens",
                snap.pos,
                tokens.len()
            )));
        }
        self.session.restore_from(self.model.backend().as_ref(), &snap)?;
        self.tokens = tokens.clone();
        if self.cache.enabled() {
            self.cache.insert(tokens, snap);
        }
        Ok(())
    }
}
