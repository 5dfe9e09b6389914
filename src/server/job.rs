//! A request as the model thread sees it (`Job`), what it reports back (`Event`), and the
//! ticket that settles whether it starts or is withdrawn.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use crate::sample::SamplerConfig;
use crate::tokenizer::{ChatMessage, ReplyEvent};

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
    /// Go on past end-of-generation tokens until `max_tokens`.
    pub ignore_eos: bool,
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

/// The answer to a request that could not start because the server is stopping.
pub fn shutting_down() -> ApiError {
    ApiError::unavailable(
        "the server is shutting down; retry on another server or later",
        "shutting_down",
    )
}
