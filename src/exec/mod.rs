//! The shared model executor: the token loop (prefill in micro-batches, decode, greedy generation
//! one step ahead) and the per-sequence state. Each step is a plan of the model's ops
//! (`forward.rs`) run by the backend (`Backend::run_plan`); written once against `&dyn Backend`,
//! it never names a backend type or knows what a backend fuses.

mod batch;
mod forward;
mod pool;
mod scratch;
mod session;

use std::collections::hash_map::Entry;
use std::collections::HashMap;
#[cfg(not(target_arch = "wasm32"))]
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use pool::StatePool;
pub use scratch::Head;
pub use session::{LayerState, Session, Snapshot, SnapshotLayer};

use crate::backend::{Backend, DType, Plan, ReadFuture, StepMode, Tensor, NON_FINITE};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::{Config, TensorSource, Weights};
use forward::{Forward, Seqs};
use scratch::Scratch;

/// A process-wide unique id for sessions and scratches (the keys of recorded steps).
pub(crate) fn next_uid() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Tunables of the executor.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Largest number of prompt tokens run through the layers at once (bounds activation memory).
    pub ubatch: usize,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions { ubatch: 512 }
    }
}

/// Which logits a forward pass returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (prefill of a prompt whose continuation starts later).
    None,
    /// Only the last position's `[n_vocab]`.
    Last,
    /// Every position, `[T, n_vocab]` row-major.
    All,
}

/// Residual-stream snapshots of one batch (`Model::trace_hidden`), each `[T, d]` row-major.
#[derive(Debug, Clone, Default)]
pub struct HiddenTrace {
    /// Token embeddings.
    pub embed: Vec<f32>,
    /// Output of each decoder layer (residual stream before the final norm).
    pub layers: Vec<Vec<f32>>,
    /// After the final RMSNorm (the LM head's input).
    pub final_norm: Vec<f32>,
}

/// The token of a greedy step's argmax read-back.
fn greedy_token(v: &[u32]) -> Result<u32> {
    match v.first() {
        Some(&NON_FINITE) => Err(Error::NonFiniteLogits),
        Some(&id) => Ok(id),
        None => Err(Error::Backend("argmax returned nothing".into())),
    }
}

/// A one-sequence step asked for every position's argmax, which only steps of many sequences
/// return (`Model::decode_rows_greedy`).
fn all_argmax_of_one() -> Error {
    Error::InvalidArgument("every row's argmax is for steps of many sequences".into())
}

/// What a forward step returns.
enum StepOut {
    None,
    Logits(Vec<f32>),
    Token(u32),
}

/// The executor's reusable buffers. One lock guards them all, and a forward step holds it from
/// its first op to its last read: two threads stepping two sessions of one `Model` take turns and
/// never see each other's activations.
struct ExecState {
    /// Activation buffers per batch size.
    scratch: HashMap<usize, Scratch>,
}

/// Batch sizes whose scratch is kept besides T = 1 (decode's, which is never evicted).
const MAX_SCRATCHES: usize = 3;

impl ExecState {
    /// The scratch for batches of `t` tokens, allocated on first use.
    fn scratch(&mut self, be: &dyn Backend, cfg: &Config, t: usize) -> Result<&mut Scratch> {
        if !self.scratch.contains_key(&t) && self.scratch.len() >= MAX_SCRATCHES {
            // Drop the other batch sizes; decode's buffers stay so its recorded step stays valid.
            self.scratch.retain(|&k, _| k == 1);
        }
        Ok(match self.scratch.entry(t) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => v.insert(Scratch::new(be, cfg, t, next_uid())?),
        })
    }
}

/// A loaded model bound to a backend.
pub struct Model {
    pub config: Config,
    backend: Arc<dyn Backend>,
    weights: Weights,
    pub options: ExecOptions,
    state: Mutex<ExecState>,
}

impl Model {
    /// Read the config from `file`, check every tensor, and upload the weights.
    /// `on_bytes(n)` is called as tensor bytes are uploaded, with the count just done (progress).
    pub fn load(file: &GgufFile, backend: Arc<dyn Backend>, on_bytes: &mut dyn FnMut(u64)) -> Result<Model> {
        // A mapped file's reads are ready at once: this never waits on anything but the device.
        pollster::block_on(Self::load_async(file, file, backend, on_bytes))
    }

    /// `load` with the tensor bytes read from `src` (the browser streams them from a `Blob`;
    /// `file` is the header, parsed with `GgufFile::from_prefix`), awaiting each read.
    pub async fn load_async(
        file: &GgufFile,
        src: &dyn TensorSource,
        backend: Arc<dyn Backend>,
        on_bytes: &mut dyn FnMut(u64),
    ) -> Result<Model> {
        let config = Config::from_gguf(file)?;
        let weights = Weights::load_from(file, src, &config, &backend, on_bytes).await?;
        backend.sync()?;
        Ok(Model {
            config,
            backend,
            weights,
            options: ExecOptions::default(),
            state: Mutex::new(ExecState {
                scratch: HashMap::new(),
            }),
        })
    }

    /// Convenience: open a GGUF file and load it without progress reporting.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<Path>, backend: Arc<dyn Backend>) -> Result<Model> {
        let file = GgufFile::open(path)?;
        Model::load(&file, backend, &mut |_| {})
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// A fresh sequence with room for `n_ctx` tokens.
    pub fn new_session(&self, n_ctx: usize) -> Result<Session> {
        Session::new(self.backend.as_ref(), &self.config, n_ctx)
    }

    // ---- the token loop, blocking (native) ----

    /// Run a prompt through the model in batches of at most `options.ubatch` tokens, continuing from
    /// the session's state. `progress(done, total)` is called after each batch.
    pub fn prefill(
        &self,
        s: &mut Session,
        tokens: &[u32],
        want: Logits,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<f32>> {
        pollster::block_on(self.prefill_async(s, tokens, want, progress))
    }

    /// One decode step: feed `token`, return the logits `[n_vocab]` of its position.
    pub fn decode(&self, s: &mut Session, token: u32) -> Result<Vec<f32>> {
        pollster::block_on(self.decode_async(s, token))
    }

    /// One decode step that returns the argmax token, computed on the device (one 4-byte read).
    /// Fails with `Error::NonFiniteLogits` when every logit is NaN or -inf.
    pub fn decode_greedy(&self, s: &mut Session, token: u32) -> Result<u32> {
        pollster::block_on(self.decode_greedy_async(s, token))
    }

    /// Greedy generation of up to `n` tokens, feeding `first` at the session's position, with the
    /// host one step ahead of the device: step k + 1 is enqueued, its token id copied on the
    /// device from step k's argmax, before step k's token is read back, so the device does not
    /// idle while the host waits for a token and records the next step. `on_token` sees each
    /// token as it arrives and returns whether to go on. Returns the tokens; the session has
    /// consumed `first` and every token but the last, and, when `on_token` stopped early, the
    /// refused token too (its step was already enqueued): `Session::pos` counts them.
    pub fn generate_greedy(
        &self,
        s: &mut Session,
        first: u32,
        n: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<Vec<u32>> {
        pollster::block_on(self.generate_greedy_async(s, first, n, on_token))
    }

    /// `generate_greedy`, awaitable (the browser's generation).
    pub async fn generate_greedy_async(
        &self,
        s: &mut Session,
        first: u32,
        n: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        if n == 0 {
            return Ok(out);
        }
        // The token each step is fed, on the device: this generation's own, so another thread's
        // steps on the shared scratch between two of ours cannot change it.
        let carry = self.backend.upload_u32(&[first], &[1])?;
        let mut pending = self.enqueue_greedy(s, &carry)?;
        loop {
            let next = (out.len() + 1 < n).then(|| self.enqueue_greedy(s, &carry));
            // This step's result first: a non-finite argmax is the error to report, not what the
            // next step (fed that sentinel) made of it.
            let tok = greedy_token(&pending.await?)?;
            out.push(tok);
            let go = on_token(tok)?;
            match next {
                None => return Ok(out),
                Some(r) => pending = r?,
            }
            if !go {
                // The step fed the refused token has run; its token is not wanted.
                pending.await?;
                return Ok(out);
            }
        }
    }

    /// The argmax of the last position of a prefill, computed on the device.
    pub fn prefill_greedy(
        &self,
        s: &mut Session,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<u32> {
        pollster::block_on(self.prefill_greedy_async(s, tokens, progress))
    }

    // ---- the token loop, awaitable (the browser cannot block on the GPU) ----

    /// `prefill`, awaiting the device instead of blocking.
    pub async fn prefill_async(
        &self,
        s: &mut Session,
        tokens: &[u32],
        want: Logits,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        self.check_room(s, tokens.len())?;
        let ub = self.options.ubatch.max(1);
        let mut out = Vec::new();
        let mut done = 0;
        for chunk in tokens.chunks(ub) {
            let last_chunk = done + chunk.len() == tokens.len();
            let head = match want {
                Logits::All => Head::AllLogits,
                Logits::Last if last_chunk => Head::LastLogits,
                _ => Head::None,
            };
            if let StepOut::Logits(l) = self.step(s, chunk, head).await? {
                out.extend_from_slice(&l);
            }
            done += chunk.len();
            progress(done, tokens.len());
        }
        Ok(out)
    }

    /// `decode`, awaitable.
    pub async fn decode_async(&self, s: &mut Session, token: u32) -> Result<Vec<f32>> {
        match self.step(s, &[token], Head::LastLogits).await? {
            StepOut::Logits(l) => Ok(l),
            _ => Err(Error::Backend("decode step returned no logits".into())),
        }
    }

    /// `decode_greedy`, awaitable.
    pub async fn decode_greedy_async(&self, s: &mut Session, token: u32) -> Result<u32> {
        match self.step(s, &[token], Head::LastArgmax).await? {
            StepOut::Token(t) => Ok(t),
            _ => Err(Error::Backend("greedy step returned no token".into())),
        }
    }

    /// `prefill_greedy`, awaitable. The prompt's last token runs as a decode step, so its
    /// argmax comes from the same (recorded) step as every later token's.
    pub async fn prefill_greedy_async(
        &self,
        s: &mut Session,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<u32> {
        let Some((&last, head)) = tokens.split_last() else {
            return Err(Error::InvalidArgument("empty prompt".into()));
        };
        self.check_room(s, tokens.len())?;
        if !head.is_empty() {
            self.prefill_async(s, head, Logits::None, progress).await?;
        }
        self.decode_greedy_async(s, last).await
    }

    /// Run `tokens` as one batch (like one prefill micro-batch) and return the residual stream
    /// `[T, d]` after the embedding, after every layer, and after the final norm. For debugging
    /// and layer-by-layer comparisons with a reference implementation.
    pub fn trace_hidden(&self, s: &mut Session, tokens: &[u32]) -> Result<HiddenTrace> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        self.check_room(s, tokens.len())?;
        let be = self.backend.as_ref();
        let mut guard = self.lock()?;
        let sc: &Scratch = self.prepare(&mut guard, s, tokens)?;
        let f = self.forward(s, sc);
        let mut trace = HiddenTrace::default();
        let mut p = Plan::new();
        f.embed(&mut p);
        be.run_plan(&p)?;
        trace.embed = be.read_f32(&sc.h)?;
        for i in 0..self.weights.layers.len() {
            let mut p = Plan::new();
            f.layer(&mut p, i)?;
            be.run_plan(&p)?;
            trace.layers.push(be.read_f32(&sc.h)?);
        }
        let normed = be.alloc(DType::F32, &[tokens.len(), self.config.n_embd])?;
        be.rms_norm(&sc.h, &self.weights.output_norm, self.config.eps, &normed)?;
        trace.final_norm = be.read_f32(&normed)?;
        s.pos += tokens.len();
        Ok(trace)
    }

    // ---- step plans, for inspection ----

    /// The plan of one step of `t` tokens from the session's position with `head` (what the
    /// backend's `run_plan` gets), handed to `inspect`; nothing runs.
    pub fn inspect_step<R>(
        &self,
        s: &Session,
        t: usize,
        head: Head,
        inspect: impl FnOnce(&Plan<'_>) -> R,
    ) -> Result<R> {
        if t == 0 {
            return Err(Error::InvalidArgument("empty batch".into()));
        }
        let be = self.backend.as_ref();
        let mut guard = self.lock()?;
        let sc = guard.scratch(be, &self.config, t)?;
        sc.ensure_head(be, &self.config, head)?;
        let sc: &Scratch = sc;
        let plan = self.forward(s, sc).step(head)?;
        Ok(inspect(&plan))
    }

    /// Run `tokens` as one step with `head` (unrecorded) and return what the backend launched:
    /// each fused run of ops by its name, each op run on its own by its own
    /// (`Backend::run_plan_listed`). The session advances.
    pub fn run_step_listed(&self, s: &mut Session, tokens: &[u32], head: Head) -> Result<Vec<&'static str>> {
        self.check_room(s, tokens.len())?;
        let be = self.backend.as_ref();
        let mut guard = self.lock()?;
        let sc = self.prepare(&mut guard, s, tokens)?;
        sc.ensure_head(be, &self.config, head)?;
        let sc: &Scratch = sc;
        let plan = self.forward(s, sc).step(head)?;
        let mut launched = Vec::new();
        be.run_plan_listed(&plan, &mut launched)?;
        be.sync()?;
        s.pos += tokens.len();
        Ok(launched)
    }

    // ---- one forward step ----

    fn lock(&self) -> Result<MutexGuard<'_, ExecState>> {
        self.state
            .lock()
            .map_err(|_| Error::Backend("executor state lock poisoned by an earlier panic".into()))
    }

    fn check_room(&self, s: &Session, n: usize) -> Result<()> {
        if s.pos.checked_add(n).is_none_or(|end| end > s.n_ctx) {
            return Err(Error::ContextOverflow {
                prompt: s.pos,
                generate: n,
                ctx: s.n_ctx,
            });
        }
        Ok(())
    }

    /// The scratch for this batch, with the token ids and the position written to the device.
    fn prepare<'a>(&self, st: &'a mut ExecState, s: &Session, tokens: &[u32]) -> Result<&'a mut Scratch> {
        let be = self.backend.as_ref();
        let sc = st.scratch(be, &self.config, tokens.len())?;
        be.write_u32(&sc.ids, tokens)?;
        self.write_pos(sc, s)?;
        Ok(sc)
    }

    /// The session's position into the step's device-side position.
    fn write_pos(&self, sc: &Scratch, s: &Session) -> Result<()> {
        // Session::new keeps n_ctx (and so every position) within u32.
        let pos = u32::try_from(s.pos).map_err(|_| Error::InvalidArgument(format!("position {}", s.pos)))?;
        self.backend.write_u32(&sc.pos, &[pos])
    }

    /// The model's forward pass over the batch in `sc`, continuing from `s`.
    fn forward<'a>(&'a self, s: &'a Session, sc: &'a Scratch) -> Forward<'a> {
        Forward {
            cfg: &self.config,
            w: &self.weights,
            sc,
            seqs: Seqs::One {
                state: &s.layers,
                pos: s.pos,
            },
        }
    }

    /// The layers and the head of one batch, a one-token batch offered to the backend for
    /// recording and replay (`Backend::step_begin`): it is the same ops on the same buffers every
    /// token.
    fn run_step(&self, s: &Session, sc: &Scratch, head: Head) -> Result<()> {
        let be = self.backend.as_ref();
        let mode = if sc.t == 1 {
            // Session and scratch uids are below 2^29 in any realistic run; the low bits name
            // what the head computes.
            let key = (s.uid << 32) ^ (sc.uid << 3) ^ head as u64;
            be.step_begin(key).map(|m| (m, key))?
        } else {
            (StepMode::Run, 0)
        };
        if mode.0 != StepMode::Replayed {
            let r = self.forward(s, sc).step(head).and_then(|p| be.run_plan(&p));
            if sc.t == 1 {
                be.step_end(mode.1, r.is_ok())?;
            }
            r?;
        }
        Ok(())
    }

    /// Enqueue one greedy decode step fed the token in `carry` (U32 `[1]`, on the device), leave
    /// its argmax there for the next step, and start reading that token back
    /// (`Backend::read_u32_ahead`); the session advances by one position. Everything is enqueued
    /// under the state lock, so the steps of other threads cannot come in between.
    fn enqueue_greedy(&self, s: &mut Session, carry: &Tensor) -> Result<ReadFuture<'_, Vec<u32>>> {
        self.check_room(s, 1)?;
        let be = self.backend.as_ref();
        let mut guard = self.lock()?;
        let sc: &Scratch = guard.scratch(be, &self.config, 1)?;
        be.copy(carry, &sc.ids)?;
        self.write_pos(sc, s)?;
        self.run_step(s, sc, Head::LastArgmax)?;
        s.pos += 1;
        be.copy(&sc.head_last.argmax, carry)?;
        be.read_u32_ahead(carry)
    }

    /// Run `tokens` through the layers and the head, continuing from `s`, and read back what
    /// `head` asks for. A one-token step is offered to the backend for recording and replay
    /// (`Backend::step_begin`): it is the same ops on the same buffers every token.
    ///
    /// The state lock is held across the final read's await on purpose: the read is of this
    /// step's buffers, which the next step would overwrite. Native callers block on the future
    /// (`pollster`); in the browser one generation runs at a time.
    #[allow(clippy::await_holding_lock)]
    async fn step(&self, s: &mut Session, tokens: &[u32], head: Head) -> Result<StepOut> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("empty batch".into()));
        }
        if head == Head::AllArgmax {
            return Err(all_argmax_of_one());
        }
        self.check_room(s, tokens.len())?;
        let be = self.backend.as_ref();
        let t = tokens.len();
        let mut guard = self.lock()?;
        let sc = self.prepare(&mut guard, s, tokens)?;
        sc.ensure_head(be, &self.config, head)?;
        let sc: &Scratch = sc;
        self.run_step(s, sc, head)?;
        s.pos += t;
        match head {
            Head::None => Ok(StepOut::None),
            Head::LastLogits => Ok(StepOut::Logits(be.read_f32_async(&sc.head_last.logits).await?)),
            Head::AllLogits => {
                let hb = sc
                    .head_all
                    .as_ref()
                    .ok_or_else(|| Error::Backend("head buffers missing".into()))?;
                Ok(StepOut::Logits(be.read_f32_async(&hb.logits).await?))
            }
            Head::LastArgmax => Ok(StepOut::Token(greedy_token(
                &be.read_u32_async(&sc.head_last.argmax).await?,
            )?)),
            Head::AllArgmax => Err(all_argmax_of_one()),
        }
    }
}
