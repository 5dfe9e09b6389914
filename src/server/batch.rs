//! Continuous batching on the model thread: the requests that hold a sequence slot, and the step
//! that advances them (`sched.rs` decides, this carries it out).
//!
//! A request holds its slot from admission to the end of its turn and goes through three phases:
//! - `Prompt`: its prompt runs through the engine's live session a chunk per turn (resuming from
//!   the prefix cache, snapshotting where the engine snapshots), all but the last token;
//! - `Decode`: its state is in its slot and every step feeds it one token (the prompt's last
//!   token first) in one `decode_rows` call with every other decoding request;
//! - `Cache`: its answer is out; its state leaves the slot for the live session to be extended
//!   to what the next turn renders (or kept as is for a completion) and snapshotted, as
//!   `Engine::cache_sequence` / `store_snapshot` do after a turn alone, a chunk per turn.
//!
//! The live session is shared: the request whose state is in it (`At::Live`) is parked into its
//! slot before another's state comes in, so prompts can take turns chunk by chunk.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use super::error::ApiError;
use super::generation::Generation;
use super::job::{shutting_down, Event, Job, JobKind};
use super::sched::{self, Pick, SlotTable};
use super::shared::Shared;
use crate::cache::{Engine, Finish, PromptStart};
use crate::error::{Error, Result};
use crate::exec::StatePool;
use crate::sample::Sampler;
use crate::tokenizer::{ParsedReply, Tokenizer};

/// Where a request's state is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Nowhere yet (its prompt has not started).
    Nowhere,
    /// In the engine's live session.
    Live,
    /// In its slot of the pool.
    Slot,
}

enum Phase {
    /// Running the prompt (`plan` once started), up to its last token.
    Prompt {
        prompt: Vec<u32>,
        snap_at: Vec<usize>,
        plan: Option<PromptStart>,
    },
    /// In the decode batch; the next step feeds `feed`.
    Decode { feed: u32 },
    /// Bringing the state to `target` and snapshotting it there for the next turn.
    Cache { target: Vec<u32>, begun: bool },
    /// Over; its slot is free and it leaves the list at the end of the step.
    Over,
}

struct Active<'t> {
    id: u64,
    slot: usize,
    client: Arc<str>,
    tenant: String,
    kind: JobKind,
    prompt_tokens: usize,
    cached_tokens: usize,
    phase: Phase,
    /// The tokens its state has consumed (the live session's or the slot's).
    tokens: Vec<u32>,
    at: At,
    gen: Generation<'t>,
}

pub struct Batch<'t> {
    engine: Engine,
    pool: StatePool,
    tok: &'t Tokenizer,
    shared: Arc<Shared>,
    slots: SlotTable,
    active: Vec<Active<'t>>,
    next_id: u64,
    /// The request whose prompt ran the last chunk (round robin).
    last_turn: Option<u64>,
}

impl<'t> Batch<'t> {
    pub fn new(engine: Engine, pool: StatePool, tok: &'t Tokenizer, shared: Arc<Shared>) -> Batch<'t> {
        let n = pool.n_slots();
        Batch {
            engine,
            pool,
            tok,
            shared,
            slots: SlotTable::new(n),
            active: Vec::new(),
            next_id: 0,
            last_turn: None,
        }
    }

    pub fn is_idle(&self) -> bool {
        self.active.is_empty()
    }

    pub fn has_room(&self) -> bool {
        self.slots.free() > 0
    }

    /// Take up a job from the queue: it starts now (its prompt gets turns from the next step on),
    /// unless its client left or the server stops.
    pub fn admit(&mut self, job: Job) {
        let sh = &self.shared;
        if job.events.is_closed() || !job.ticket.start() {
            sh.cancelled.fetch_add(1, Ordering::Relaxed);
            return; // the client left while queued, or the job was withdrawn at shutdown
        }
        if sh.shutdown.load(Ordering::SeqCst) {
            // Shutting down: a queued job does not start (its client may not have been told yet).
            let _ = job.events.send(Event::Failed(shutting_down()));
            sh.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let _ = job.events.send(Event::Started);
        let fail = |e: ApiError| {
            let _ = job.events.send(Event::Failed(e));
            sh.failed.fetch_add(1, Ordering::Relaxed);
        };
        let n_ctx = self.engine.n_ctx();
        if job.prompt.is_empty() || job.prompt.len().saturating_add(job.max_tokens) > n_ctx {
            return fail(
                Error::ContextOverflow {
                    prompt: job.prompt.len(),
                    generate: job.max_tokens,
                    ctx: n_ctx,
                }
                .into(),
            );
        }
        let mut sampler = match Sampler::new(job.sampler) {
            Ok(s) => s,
            Err(e) => return fail(e.into()),
        };
        let Some(slot) = self.slots.take() else {
            // The model thread takes jobs only while a slot is free.
            return fail(ApiError::server("no free sequence slot"));
        };
        for &t in &job.prompt {
            sampler.accept(t);
        }
        let chat = match &job.kind {
            JobKind::Chat { thinking, tools, .. } => Some((*thinking, tools.as_slice())),
            JobKind::Completion => None,
        };
        let gen = Generation::new(
            self.tok,
            sampler,
            job.events.clone(),
            chat,
            job.stop,
            job.max_tokens,
            job.ignore_eos,
        );
        self.next_id += 1;
        self.active.push(Active {
            id: self.next_id,
            slot,
            client: job.client,
            tenant: job.tenant,
            kind: job.kind,
            prompt_tokens: job.prompt.len(),
            cached_tokens: 0,
            phase: Phase::Prompt {
                prompt: job.prompt,
                snap_at: job.snap_at,
                plan: None,
            },
            tokens: Vec::new(),
            at: At::Nowhere,
            gen,
        });
        sh.busy.store(true, Ordering::SeqCst);
        self.publish();
    }

    /// One step: requests whose client left end, one prompt chunk runs, then one decode step of
    /// every decoding request. A panic (a bug) fails the requests in flight and starts over.
    pub fn step(&mut self) {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.sweep();
            self.prompt_turn();
            self.decode();
        }));
        if r.is_err() {
            self.recover();
        }
        self.active.retain(|a| !matches!(a.phase, Phase::Over));
        self.publish();
    }

    /// End the requests whose client went away, and everything when the server stops.
    fn sweep(&mut self) {
        let stopping = self.shared.shutdown.load(Ordering::SeqCst);
        for i in 0..self.active.len() {
            let a = &mut self.active[i];
            match a.phase {
                Phase::Prompt { .. } | Phase::Decode { .. } if stopping || a.gen.client_gone() => {
                    a.gen.cancel();
                    self.end(i, Finish::Stopped);
                }
                // The answer is out; the next turn's caching is not worth delaying the exit for.
                Phase::Cache { .. } if stopping => self.release(i),
                _ => {}
            }
        }
    }

    /// Run the next chunk of whichever prompt (or end-of-turn caching) has its turn.
    fn prompt_turn(&mut self) {
        let waiting: Vec<u64> = self
            .active
            .iter()
            .filter(|a| matches!(a.phase, Phase::Prompt { .. } | Phase::Cache { .. }))
            .map(|a| a.id)
            .collect();
        let Some(id) = sched::next_turn(&waiting, self.last_turn) else {
            return;
        };
        self.last_turn = Some(id);
        let Some(i) = self.active.iter().position(|a| a.id == id) else {
            return;
        };
        match self.chunk(i) {
            Ok(false) => {}
            Ok(true) => self.release(i),
            Err(e) => self.chunk_failed(i, e),
        }
    }

    /// A chunk of request `i` failed: the live session may be anywhere now, so nothing may
    /// resume from it, and whichever request's state was in it has lost it too.
    fn chunk_failed(&mut self, i: usize, e: Error) {
        self.engine.invalidate_live();
        let msg = e.to_string();
        let e = ApiError::from(e);
        for j in 0..self.active.len() {
            let lost = j == i || self.active[j].at == At::Live;
            if !lost {
                continue;
            }
            match self.active[j].phase {
                Phase::Cache { .. } => {
                    eprintln!("warning: caching the end of a turn failed: {msg}");
                    self.release(j);
                }
                _ => self.fail(j, e.clone()),
            }
        }
    }

    /// One chunk of request `i`'s prompt or end-of-turn caching. True: the request is over
    /// (its turn is cached, or there was nothing to cache).
    fn chunk(&mut self, i: usize) -> Result<bool> {
        self.bind(i)?;
        let ubatch = self.engine.model().options.ubatch;
        let a = &mut self.active[i];
        match &mut a.phase {
            Phase::Prompt { prompt, snap_at, plan } => {
                if plan.is_none() {
                    let p = self.engine.begin_prompt(prompt, snap_at)?;
                    a.cached_tokens = p.start;
                    a.tokens = self.engine.live_tokens().to_vec();
                    *plan = Some(p);
                }
                let points = plan.as_ref().map(|p| p.points.as_slice()).unwrap_or_default();
                // The last prompt token is the first decode row: its logits come from the
                // same batched step as every later token's.
                let target = prompt.len() - 1;
                let done = a.tokens.len();
                let end = sched::chunk_end(done, target, points, ubatch);
                if end > done {
                    self.engine.advance(&prompt[done..end])?;
                    a.tokens.extend_from_slice(&prompt[done..end]);
                    self.shared
                        .prompt_tokens
                        .fetch_add((end - done) as u64, Ordering::Relaxed);
                    if points.contains(&end) {
                        self.engine.store_snapshot()?;
                    }
                }
                if end == target {
                    let feed = prompt[target];
                    self.engine.park(&mut self.pool, a.slot)?;
                    a.at = At::Slot;
                    a.phase = Phase::Decode { feed };
                }
            }
            Phase::Cache { target, begun } => {
                if !*begun {
                    if !self.engine.begin_caching(target)? {
                        return Ok(true);
                    }
                    a.tokens = self.engine.live_tokens().to_vec();
                    *begun = true;
                }
                let done = a.tokens.len();
                let end = sched::chunk_end(done, target.len(), &[], ubatch);
                if end > done {
                    self.engine.advance(&target[done..end])?;
                    a.tokens.extend_from_slice(&target[done..end]);
                }
                if end == target.len() {
                    self.engine.store_snapshot()?;
                    return Ok(true);
                }
            }
            Phase::Decode { .. } | Phase::Over => {}
        }
        Ok(false)
    }

    /// Make request `i`'s state the live session's: park whoever is there into its slot, switch
    /// the prefix cache to `i`'s tenant, and bring `i`'s state in from its slot.
    fn bind(&mut self, i: usize) -> Result<()> {
        if self.active[i].at == At::Live {
            return Ok(());
        }
        if let Some(o) = self.active.iter_mut().find(|a| a.at == At::Live) {
            self.engine.park(&mut self.pool, o.slot)?;
            o.at = At::Slot;
        }
        let a = &mut self.active[i];
        self.engine.set_tenant(&a.tenant);
        if a.at == At::Slot {
            self.engine.unpark(&self.pool, a.slot, &a.tokens)?;
        }
        a.at = At::Live;
        Ok(())
    }

    /// One decode step of every decoding request.
    fn decode(&mut self) {
        let rows: Vec<usize> = (0..self.active.len())
            .filter(|&i| matches!(self.active[i].phase, Phase::Decode { .. }))
            .collect();
        if rows.is_empty() {
            self.shared.batch_size.store(0, Ordering::Relaxed);
            return;
        }
        let feed: Vec<(usize, u32)> = rows
            .iter()
            .map(|&i| match self.active[i].phase {
                Phase::Decode { feed } => (self.active[i].slot, feed),
                _ => (self.active[i].slot, 0),
            })
            .collect();
        let pick = sched::pick(rows.iter().map(|&i| self.active[i].gen.sampler.is_greedy()));
        let model = self.engine.model();
        let picked: Result<Vec<Result<u32>>> = match pick {
            Pick::DeviceArgmax => model
                .decode_rows_greedy(&mut self.pool, &feed)
                .map(|ids| ids.into_iter().map(|t| t.ok_or(Error::NonFiniteLogits)).collect()),
            Pick::HostSamplers => model.decode_rows(&mut self.pool, &feed).map(|logits| {
                let n_vocab = (logits.len() / rows.len()).max(1);
                // Each row's sampler makes passes over the whole vocabulary; at a large batch
                // that is the step's host work, so the rows sample in parallel.
                let mut samplers: Vec<&mut Sampler> = self
                    .active
                    .iter_mut()
                    .filter(|a| matches!(a.phase, Phase::Decode { .. }))
                    .map(|a| &mut a.gen.sampler)
                    .collect();
                samplers
                    .par_iter_mut()
                    .zip(logits.par_chunks_exact(n_vocab))
                    .map(|(s, l)| s.sample(l))
                    .collect()
            }),
        };
        let picked = match picked {
            Ok(p) => p,
            Err(e) => {
                // The step failed as a whole: the slots' states are unknown.
                let e = ApiError::from(e);
                for &i in &rows {
                    self.fail(i, e.clone());
                }
                return;
            }
        };
        let sh = &self.shared;
        sh.batch_size.store(rows.len(), Ordering::Relaxed);
        sh.decode_steps.fetch_add(1, Ordering::Relaxed);
        sh.generated_tokens.fetch_add(rows.len() as u64, Ordering::Relaxed);
        if let Ok(mut m) = sh.meter.lock() {
            m.add(Instant::now(), rows.len() as u64);
        }
        let stopping = sh.shutdown.load(Ordering::SeqCst);
        for ((&i, &(_, fed)), t) in rows.iter().zip(&feed).zip(picked) {
            let a = &mut self.active[i];
            a.tokens.push(fed);
            let t = match t {
                Ok(t) => t,
                Err(e) => {
                    self.fail(i, e.into());
                    continue;
                }
            };
            if pick == Pick::DeviceArgmax {
                a.gen.sampler.accept(t);
            }
            match a.gen.on_token(t, stopping) {
                None => a.phase = Phase::Decode { feed: t },
                Some(f) => self.end(i, f),
            }
        }
    }

    /// Request `i`'s generation is over: answer its client, then cache for its next turn.
    fn end(&mut self, i: usize, finish: Finish) {
        let tok = self.tok;
        let a = &mut self.active[i];
        let ended = a.gen.end(finish, a.prompt_tokens, a.cached_tokens, &a.client);
        // Counters first, so a client that asks /health right after its answer sees its request.
        let counter = if ended.gone {
            &self.shared.cancelled
        } else {
            &self.shared.completed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.shared.stats.lock() {
            *s = self.engine.stats();
        }
        a.gen.send(Event::Done(ended.done));
        // Nothing to cache for a client that left, a prompt that never ran, or with caching off
        // (then not even worth copying the state out of the slot).
        let caching = self.engine.stats().cache.budget > 0;
        if ended.gone || !caching || matches!(a.phase, Phase::Prompt { .. }) {
            return self.release(i);
        }
        // The client has everything; now prepare the next request of this conversation.
        match next_turn_tokens(tok, &a.kind, &a.tokens, &ended.reply) {
            Ok(target) => {
                a.phase = Phase::Cache { target, begun: false };
            }
            Err(e) => {
                eprintln!("warning: cannot render the next turn for caching: {e}");
                self.release(i);
            }
        }
    }

    /// Fail request `i` (its client gets `e`) and free its slot.
    fn fail(&mut self, i: usize, e: ApiError) {
        self.active[i].gen.send(Event::Failed(e));
        self.shared.failed.fetch_add(1, Ordering::Relaxed);
        self.release(i);
    }

    /// Free request `i`'s slot; it leaves the list at the end of the step.
    fn release(&mut self, i: usize) {
        let a = &mut self.active[i];
        if !matches!(a.phase, Phase::Over) {
            self.slots.give(a.slot);
            a.phase = Phase::Over;
            a.at = At::Nowhere;
        }
    }

    /// After a panic: fail every request in flight and start from a clean state.
    fn recover(&mut self) {
        for i in 0..self.active.len() {
            if matches!(self.active[i].phase, Phase::Prompt { .. } | Phase::Decode { .. }) {
                self.fail(i, ApiError::server("internal error while generating"));
            } else {
                self.release(i);
            }
        }
        let _ = self.engine.reset();
        self.last_turn = None;
    }

    /// Publish what `/health` and `/metrics` show.
    fn publish(&self) {
        let sh = &self.shared;
        let count = |f: fn(&Phase) -> bool| self.active.iter().filter(|a| f(&a.phase)).count();
        sh.prefilling
            .store(count(|p| matches!(p, Phase::Prompt { .. })), Ordering::Relaxed);
        sh.decoding
            .store(count(|p| matches!(p, Phase::Decode { .. })), Ordering::Relaxed);
        if let Ok(mut s) = sh.stats.lock() {
            *s = self.engine.stats();
        }
        sh.busy.store(!self.active.is_empty(), Ordering::SeqCst);
    }
}

/// What to cache after a turn: for chat, the conversation the way the next turn renders it
/// (which drops this turn's reasoning); for a completion, the sequence as it ran.
fn next_turn_tokens(tok: &Tokenizer, kind: &JobKind, ran: &[u32], reply: &ParsedReply) -> Result<Vec<u32>> {
    match kind {
        JobKind::Completion => Ok(ran.to_vec()),
        JobKind::Chat { messages, tools, .. } => tok.encode_follow_up(messages, tools, reply),
    }
}
