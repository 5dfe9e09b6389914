//! The model thread: one engine (model, session, prefix cache) serving queued jobs in arrival
//! order. Jobs report back over a channel; when its receiver is gone (the client disconnected),
//! the job stops at the next token.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::stop::StopMatcher;
use crate::cache::{Engine, EngineStats, Finish, Flow};
use crate::sample::{Sampler, SamplerConfig};
use crate::tokenizer::{ChatMessage, ParsedReply, ReplyEvent, ReplyStream, Tokenizer};

pub enum JobKind {
    /// A chat turn: the conversation (to cache it the way the next turn renders it), the tools
    /// (argument types for parsing calls) and whether the prompt opened a think block.
    Chat {
        messages: Vec<ChatMessage>,
        tools: Vec<Value>,
        thinking: bool,
    },
    /// Raw text completion.
    Completion,
}

/// Where a queued job stands. The model thread starts it, or the HTTP side withdraws it (the
/// server is shutting down and the job has not started: its client gets a 503 at once instead
/// of waiting for a prefill whose result nobody would see). Whichever comes first wins.
#[derive(Default)]
pub struct Ticket(AtomicU8);

const QUEUED: u8 = 0;
const RUNNING: u8 = 1;
const WITHDRAWN: u8 = 2;

impl Ticket {
    /// Claim the job for the model thread; false when it was withdrawn.
    pub fn start(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Take the job back before it starts; false when it already runs.
    pub fn withdraw(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, WITHDRAWN, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

pub struct Job {
    /// The API key's name (`""` without keys), for the log.
    pub client: Arc<str>,
    /// Whose prefix-cache entries the job may use and add to (see `Engine::set_tenant`).
    pub tenant: String,
    pub ticket: Arc<Ticket>,
    pub prompt: Vec<u32>,
    /// Prompt positions after which to snapshot.
    pub snap_at: Vec<usize>,
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub kind: JobKind,
    pub events: UnboundedSender<Event>,
}

/// What a job reports, in order: text as it comes, then `Done` or `Failed`.
pub enum Event {
    /// The model thread has taken the job (it can no longer be withdrawn).
    Started,
    /// Completion text.
    Text(String),
    /// Chat reply pieces.
    Reply(ReplyEvent),
    Done(Done),
    Failed(ApiError),
}

#[derive(Debug, Clone)]
pub struct Done {
    /// `stop`, `length`, `tool_calls`, or `cancelled` (the client went away or the server stops).
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    pub first_token_secs: f64,
    pub decode_secs: f64,
}

/// State the HTTP side reads: queue depth, counters, the engine's last reported stats.
pub struct Shared {
    pub queued: AtomicUsize,
    pub busy: AtomicBool,
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub shutdown: AtomicBool,
    pub stats: Mutex<EngineStats>,
}

impl Shared {
    pub fn new(stats: EngineStats) -> Shared {
        Shared {
            queued: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            completed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            stats: Mutex::new(stats),
        }
    }

    pub fn stats(&self) -> Option<EngineStats> {
        self.stats.lock().ok().map(|s| *s)
    }
}

/// Serve jobs until every sender is gone.
pub fn run(mut engine: Engine, tok: Arc<Tokenizer>, jobs: Receiver<Job>, shared: Arc<Shared>) {
    for job in jobs {
        shared.queued.fetch_sub(1, Ordering::SeqCst);
        if job.events.is_closed() || !job.ticket.start() {
            shared.cancelled.fetch_add(1, Ordering::Relaxed);
            continue; // the client left while queued, or the job was withdrawn at shutdown
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            // Shutting down: a queued job does not start (its client may not have been told yet).
            let _ = job.events.send(Event::Failed(shutting_down()));
            shared.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let _ = job.events.send(Event::Started);
        engine.set_tenant(&job.tenant);
        shared.busy.store(true, Ordering::SeqCst);
        let events = job.events.clone();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| run_job(&mut engine, &tok, job, &shared)));
        let outcome = match result {
            Ok(r) => r,
            Err(_) => {
                // A bug, not the client's fault: start from a clean state and keep serving.
                let _ = engine.reset();
                Err(ApiError::server("internal error while generating"))
            }
        };
        match outcome {
            Ok(true) => shared.completed.fetch_add(1, Ordering::Relaxed),
            Ok(false) => shared.cancelled.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                let _ = events.send(Event::Failed(e));
                shared.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
        if let Ok(mut s) = shared.stats.lock() {
            *s = engine.stats();
        }
        shared.busy.store(false, Ordering::SeqCst);
    }
}

/// The answer to a request that could not start because the server is stopping.
pub fn shutting_down() -> ApiError {
    ApiError::unavailable(
        "the server is shutting down; retry on another server or later",
        "shutting_down",
    )
}

/// Routes generated text through stop matching and (for chat) the reply parser to the client.
struct Output<'a> {
    events: &'a UnboundedSender<Event>,
    parser: Option<ReplyStream>,
    reply: ParsedReply,
}

impl Output<'_> {
    fn emit(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        match &mut self.parser {
            None => {
                let _ = self.events.send(Event::Text(text.to_string()));
            }
            Some(p) => {
                let evs = p.push(text);
                self.forward(evs);
            }
        }
    }

    fn finish(&mut self) {
        if let Some(p) = &mut self.parser {
            let evs = p.finish();
            self.forward(evs);
        }
    }

    fn forward(&mut self, evs: Vec<ReplyEvent>) {
        for e in evs {
            match &e {
                ReplyEvent::Reasoning(t) => self.reply.reasoning.push_str(t),
                ReplyEvent::Content(t) => self.reply.content.push_str(t),
                ReplyEvent::ToolCall(c) => self.reply.tool_calls.push(c.clone()),
            }
            let _ = self.events.send(Event::Reply(e));
        }
    }
}

/// Run one job. `Ok(false)`: the client went away.
fn run_job(engine: &mut Engine, tok: &Tokenizer, job: Job, shared: &Shared) -> Result<bool, ApiError> {
    let mut sampler = Sampler::new(job.sampler)?;
    let mut out = Output {
        events: &job.events,
        parser: match &job.kind {
            JobKind::Chat { thinking, tools, .. } => Some(ReplyStream::new(*thinking, tools)),
            JobKind::Completion => None,
        },
        reply: ParsedReply::default(),
    };
    let mut dec = tok.stream_decoder(false);
    let mut stop = StopMatcher::new(job.stop.clone());
    let (mut stop_hit, mut gone) = (false, false);
    let is_eog = |t: u32| tok.is_eog(t);
    let outcome = engine.generate(
        &job.prompt,
        &job.snap_at,
        job.max_tokens,
        &mut sampler,
        &is_eog,
        &mut |t| {
            if job.events.is_closed() || shared.shutdown.load(Ordering::Relaxed) {
                gone = true;
                return Ok(Flow::Stop);
            }
            let (text, hit) = stop.push(&dec.push(t));
            out.emit(&text);
            stop_hit = hit;
            Ok(if hit { Flow::Stop } else { Flow::Continue })
        },
    )?;
    if !stop_hit && !gone {
        let (text, hit) = stop.push(&dec.finish());
        out.emit(&text);
        if !hit {
            out.emit(&stop.finish());
        }
    }
    out.finish();
    let reply = std::mem::take(&mut out.reply);
    let finish_reason = match outcome.finish {
        _ if gone => "cancelled",
        Finish::Length => "length",
        Finish::Eog | Finish::Stopped if !reply.tool_calls.is_empty() => "tool_calls",
        Finish::Eog | Finish::Stopped => "stop",
    };
    // Counters first, so a client that asks /health right after its answer sees its request.
    if let Ok(mut s) = shared.stats.lock() {
        *s = engine.stats();
    }
    // The token that found the client gone (or the server stopping) was counted but never sent.
    let completion_tokens = outcome.generated.len().saturating_sub(usize::from(gone));
    let _ = job.events.send(Event::Done(Done {
        finish_reason,
        prompt_tokens: outcome.prompt_tokens,
        completion_tokens,
        cached_tokens: outcome.cached_tokens,
        first_token_secs: outcome.first_token_secs,
        decode_secs: outcome.decode_secs,
    }));
    let client = if job.client.is_empty() {
        String::new()
    } else {
        format!(" from {}", job.client)
    };
    eprintln!(
        "request{client}: prompt {} tokens ({} from cache, {} run), first token after {:.1} ms, {} generated in {:.1} ms, {finish_reason}",
        outcome.prompt_tokens,
        outcome.cached_tokens,
        outcome.prompt_tokens - outcome.cached_tokens,
        outcome.first_token_secs * 1e3,
        completion_tokens,
        outcome.decode_secs * 1e3,
    );
    if gone {
        return Ok(false);
    }
    // The client has everything; now prepare the next request of this conversation.
    match job.kind {
        JobKind::Completion => engine.store_snapshot()?,
        JobKind::Chat { messages, tools, .. } => {
            let next = tok.encode_follow_up(&messages, &tools, &reply)?;
            engine.cache_sequence(&next)?;
        }
    }
    Ok(true)
}
