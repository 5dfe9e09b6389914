//! The model thread: one engine (model, session, prefix cache) serving queued jobs in arrival
//! order. Jobs report back over a channel; when its receiver is gone (the client disconnected),
//! the job stops at the next token.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

pub struct Job {
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
        if job.events.is_closed() {
            shared.cancelled.fetch_add(1, Ordering::Relaxed);
            continue; // the client left while queued
        }
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
    let _ = job.events.send(Event::Done(Done {
        finish_reason,
        prompt_tokens: outcome.prompt_tokens,
        completion_tokens: outcome.generated.len(),
        cached_tokens: outcome.cached_tokens,
        first_token_secs: outcome.first_token_secs,
        decode_secs: outcome.decode_secs,
    }));
    eprintln!(
        "request: prompt {} tokens ({} from cache, {} run), first token after {:.1} ms, {} generated in {:.1} ms, {finish_reason}",
        outcome.prompt_tokens,
        outcome.cached_tokens,
        outcome.prompt_tokens - outcome.cached_tokens,
        outcome.first_token_secs * 1e3,
        outcome.generated.len(),
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
