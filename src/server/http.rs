//! The HTTP side: routes, authentication, body limits, and the translation between OpenAI JSON
//! (plain or server-sent events) and worker jobs. Handlers validate everything before a job is
//! queued, so a bad request never reaches the model thread. The CPU-heavy part of that (parsing,
//! rendering, tokenizing) runs in the blocking pool (`prep`), never on the runtime's threads.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::watch;

use super::api::{self, CacheScope, ChatRequest, CompletionRequest, Sampling};
use super::auth::ApiKeys;
use super::error::ApiError;
use super::job::{shutting_down, Done, Event, Job, JobKind, Ticket};
use super::listen::ConnCount;
use super::prep::{PrepPool, TextBound};
use super::shared::Shared;
use super::slots::{ClientSlots, Slot};
use crate::sample::SamplerConfig;
use crate::tokenizer::{render_chat_prompt, ChatOptions, ReplyEvent, Tokenizer, ToolCall};

pub struct AppState {
    pub jobs: SyncSender<Job>,
    pub shared: Arc<Shared>,
    pub tok: Arc<Tokenizer>,
    pub model_id: String,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub keys: ApiKeys,
    /// In-flight requests per API key.
    pub slots: Arc<ClientSlots>,
    /// Where parsing and tokenization run.
    pub prep: PrepPool,
    /// Prompts longer than this many bytes cannot fit the context (checked before tokenizing).
    pub text_bound: TextBound,
    pub conns: Arc<ConnCount>,
    pub body_limit: usize,
    /// The longest a request body may take to arrive.
    pub body_timeout: Duration,
    pub max_queue: usize,
    /// Thinking on unless the request says otherwise (`--no-think` turns the default off).
    pub think_default: bool,
    /// `max_tokens` of a chat request that names none (0: the rest of the context).
    pub default_max_tokens: usize,
    /// One prefix cache for every key (`--shared-cache`) instead of one per key.
    pub shared_cache: bool,
    /// Leave `cached_tokens` and `timings` out of responses.
    pub hide_cache_stats: bool,
    /// `/health` and `/metrics` without a key.
    pub public_health: bool,
    /// Becomes true when the server starts shutting down: queued requests are withdrawn (503).
    pub stopping: watch::Sender<bool>,
    pub created: u64,
    pub next_id: AtomicU64,
}

/// A validated request, ready to queue.
struct Prepared {
    prompt: Vec<u32>,
    snap_at: Vec<usize>,
    max_tokens: usize,
    sampler: SamplerConfig,
    stop: Vec<String>,
    ignore_eos: bool,
    kind: JobKind,
    stream: bool,
    include_usage: bool,
    salt: Option<String>,
}

/// A queued request as its handler sees it.
struct Queued {
    rx: UnboundedReceiver<Event>,
    ticket: Arc<Ticket>,
}

type St = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found("no such endpoint").with_code("unknown_url") })
        .method_not_allowed_fallback(|| async {
            ApiError::invalid("method not allowed on this endpoint", None)
                .with_status(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error")
        })
        .with_state(state)
}

impl AppState {
    /// The name of the caller's API key (`""` on a server without keys), or a 401.
    fn authorize(&self, headers: &HeaderMap) -> Result<Arc<str>, ApiError> {
        if self.keys.is_empty() {
            return Ok(Arc::from(""));
        }
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        self.keys.check(given).ok_or_else(|| {
            ApiError::invalid("missing or incorrect API key", None)
                .with_status(StatusCode::UNAUTHORIZED, "authentication_error")
                .with_code("invalid_api_key")
        })
    }

    /// Authorize and take one of the caller's request slots (429 when it has none left).
    fn admit(self: &Arc<Self>, headers: &HeaderMap) -> Result<(Arc<str>, Slot), ApiError> {
        let client = self.authorize(headers)?;
        let slot = self.slots.acquire(&client)?;
        Ok((client, slot))
    }

    /// The prefix-cache owner of a request: its key (unless the cache is shared) and its salt.
    fn tenant(&self, client: &str, salt: Option<&str>) -> String {
        let owner = if self.shared_cache { "" } else { client };
        match salt {
            // Key names cannot hold NUL: no (key, salt) pair reads as another.
            Some(s) => format!("{owner}\0{s}"),
            None => owner.to_string(),
        }
    }

    fn check_model(&self, s: &Sampling) -> Result<(), ApiError> {
        match &s.model {
            Some(m) if m != &self.model_id => Err(ApiError::not_found(format!(
                "the model '{m}' does not exist (this server has '{}')",
                self.model_id
            ))
            .with_code("model_not_found")),
            _ => Ok(()),
        }
    }

    fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }

    /// Queue a job; a full queue is a 503 so clients back off instead of piling up.
    fn submit(&self, client: Arc<str>, p: Prepared) -> Result<Queued, ApiError> {
        if *self.stopping.borrow() {
            return Err(shutting_down());
        }
        let (tx, rx) = unbounded_channel();
        let ticket = Arc::new(Ticket::default());
        let job = Job {
            tenant: self.tenant(&client, p.salt.as_deref()),
            client,
            ticket: Arc::clone(&ticket),
            prompt: p.prompt,
            snap_at: p.snap_at,
            max_tokens: p.max_tokens,
            sampler: p.sampler,
            stop: p.stop,
            ignore_eos: p.ignore_eos,
            kind: p.kind,
            events: tx,
        };
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        match self.jobs.try_send(job) {
            Ok(()) => Ok(Queued { rx, ticket }),
            Err(e) => {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    TrySendError::Full(_) => ApiError::unavailable(
                        format!("the server is busy ({} requests queued); retry later", self.max_queue),
                        "server_busy",
                    ),
                    TrySendError::Disconnected(_) => ApiError::server("the model thread has stopped"),
                })
            }
        }
    }

    /// Wait until the model thread takes the job. When the server starts shutting down first,
    /// the job is withdrawn and the client gets a 503 at once.
    async fn wait_started(&self, q: &mut Queued) -> Result<(), ApiError> {
        let mut stopping = self.stopping.subscribe();
        let stopped = async move {
            // (The guard `wait_for` returns must not live across an await: it is not `Send`.)
            let seen = stopping.wait_for(|&s| s).await.is_ok();
            if !seen {
                std::future::pending::<()>().await;
            }
        };
        let first = tokio::select! {
            ev = q.rx.recv() => ev,
            () = stopped => {
                if q.ticket.withdraw() {
                    return Err(shutting_down());
                }
                q.rx.recv().await
            }
        };
        match first {
            Some(Event::Started) => Ok(()),
            Some(Event::Failed(e)) => Err(e),
            _ => Err(unexpected_end()),
        }
    }

    /// Room left for generation after `prompt` tokens, and the request's `max_tokens` checked
    /// against it (`default` when the request has none; `None` = all the room).
    fn budget(&self, prompt: usize, asked: Option<usize>, default: Option<usize>) -> Result<usize, ApiError> {
        if prompt >= self.n_ctx {
            return Err(ApiError::invalid(
                format!(
                    "the prompt is {prompt} tokens, the context is {} tokens (at least one must be left to generate)",
                    self.n_ctx
                ),
                Some("messages"),
            )
            .with_code("context_length_exceeded"));
        }
        let room = self.n_ctx - prompt;
        match asked {
            Some(m) if m > room => Err(ApiError::invalid(
                format!(
                    "max_tokens is {m}, but the prompt of {prompt} tokens leaves room for {room} in the context of {}",
                    self.n_ctx
                ),
                Some("max_tokens"),
            )
            .with_code("context_length_exceeded")),
            Some(m) => Ok(m),
            None => Ok(default.map_or(room, |d| d.min(room))),
        }
    }
}

/// The request body, within the size limit and the body timeout.
async fn read_body(st: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::invalid(format!("request body is larger than {} bytes", st.body_limit), None)
            .with_status(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error")
            .with_code("body_too_large")
    };
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > st.body_limit as u64) {
        return Err(too_large());
    }
    let collect = Limited::new(body, st.body_limit).collect();
    let bytes = tokio::time::timeout(st.body_timeout, collect)
        .await
        .map_err(|_| {
            ApiError::invalid(
                format!(
                    "the request body did not arrive within {:.1} s",
                    st.body_timeout.as_secs_f64()
                ),
                None,
            )
            .with_status(StatusCode::REQUEST_TIMEOUT, "invalid_request_error")
            .with_code("request_timeout")
        })?
        .map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                too_large()
            } else {
                ApiError::invalid(format!("could not read the request body: {e}"), None)
            }
        })?;
    Ok(bytes.to_bytes())
}

fn default_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

async fn chat(State(st): St, headers: HeaderMap, body: Body) -> Response {
    match chat_inner(&st, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(st: &Arc<AppState>, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (client, slot) = st.admit(headers)?;
    let bytes = read_body(st, headers, body).await?;
    let prep_st = Arc::clone(st);
    let p = st.prep.run(move || prepare_chat(&prep_st, &bytes)).await?;
    let (stream, include_usage) = (p.stream, p.include_usage);
    let mut q = st.submit(client, p)?;
    st.wait_started(&mut q).await?;
    let id = st.new_id("chatcmpl");
    if stream {
        Ok(sse(chat_stream(Arc::clone(st), id, q.rx, include_usage, slot)))
    } else {
        chat_whole(st, id, q.rx).await
    }
}

/// Parse, check, render and tokenize a chat request (on the blocking pool).
fn prepare_chat(st: &AppState, bytes: &[u8]) -> Result<Prepared, ApiError> {
    let body = api::parse_body(bytes)?;
    let req: ChatRequest = api::fields(&body)?;
    let sampling: Sampling = api::fields(&body)?;
    let scope: CacheScope = api::fields(&body)?;
    st.check_model(&sampling)?;
    let settings = sampling.settings(default_seed())?;
    let salt = scope.salt()?.map(str::to_string);
    let (messages, tools) = api::chat_messages(&req)?;
    let thinking = req
        .chat_template_kwargs
        .as_ref()
        .and_then(|k| k.enable_thinking)
        .unwrap_or(st.think_default);
    let opts = ChatOptions {
        add_generation_prompt: true,
        enable_thinking: thinking,
    };
    let rendered =
        render_chat_prompt(&messages, &tools, opts).map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
    st.text_bound.check(rendered.text_len(), "messages")?;
    let enc = st.tok.encode_chat(&rendered);
    let default = (st.default_max_tokens > 0).then_some(st.default_max_tokens);
    let max_tokens = st.budget(enc.tokens.len(), settings.max_tokens, default)?;
    Ok(Prepared {
        prompt: enc.tokens,
        // Snapshot where the reply starts: a later turn renders this turn's opening the same way.
        snap_at: enc.reply_start.into_iter().collect(),
        max_tokens,
        sampler: settings.sampler,
        stop: settings.stop,
        ignore_eos: settings.ignore_eos,
        kind: JobKind::Chat {
            messages,
            tools,
            thinking,
        },
        stream: settings.stream,
        include_usage: settings.include_usage,
        salt,
    })
}

/// `usage`; without `cached_tokens` when the server hides cache statistics.
fn usage(st: &AppState, d: &Done) -> Value {
    let mut u = json!({
        "prompt_tokens": d.prompt_tokens,
        "completion_tokens": d.completion_tokens,
        "total_tokens": d.prompt_tokens + d.completion_tokens,
    });
    if !st.hide_cache_stats {
        u["prompt_tokens_details"] = json!({"cached_tokens": d.cached_tokens});
    }
    u
}

/// Add `timings` to a response object, unless the server hides cache statistics (the time to
/// the first token says how much of the prompt came from the cache).
fn add_timings(st: &AppState, out: &mut Value, d: &Done) {
    if !st.hide_cache_stats {
        out["timings"] = json!({
            "first_token_ms": d.first_token_secs * 1e3,
            "decode_ms": d.decode_secs * 1e3,
            "prompt_tokens_processed": d.prompt_tokens - d.cached_tokens,
        });
    }
}

fn tool_call_json(id: &str, index: usize, c: &ToolCall) -> Value {
    json!({
        "index": index,
        "id": format!("call_{id}_{index}"),
        "type": "function",
        "function": {"name": c.name, "arguments": Value::Object(c.arguments.clone()).to_string()},
    })
}

fn unexpected_end() -> ApiError {
    ApiError::server("the model thread ended the request without a result")
}

async fn chat_whole(st: &AppState, id: String, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    let done = loop {
        match rx.recv().await.ok_or_else(unexpected_end)? {
            Event::Reply(ReplyEvent::Content(t)) | Event::Text(t) => content.push_str(&t),
            Event::Reply(ReplyEvent::Reasoning(t)) => reasoning.push_str(&t),
            Event::Reply(ReplyEvent::ToolCall(c)) => calls.push(c),
            Event::Started => {}
            Event::Done(d) => break d,
            Event::Failed(e) => return Err(e),
        }
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        let short = id.rsplit('-').next().unwrap_or("");
        message["tool_calls"] = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = tool_call_json(short, i, c);
                v.as_object_mut().map(|o| o.remove("index"));
                v
            })
            .collect();
        if content.is_empty() {
            message["content"] = Value::Null;
        }
    }
    let mut out = json!({
        "id": id,
        "object": "chat.completion",
        "created": st.created,
        "model": st.model_id,
        "choices": [{"index": 0, "message": message, "finish_reason": done.finish_reason, "logprobs": null}],
        "usage": usage(st, &done),
    });
    add_timings(st, &mut out, &done);
    Ok(Json(out).into_response())
}

fn sse(s: impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static) -> Response {
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}

/// State of one streamed response: events still to come, then `[DONE]`.
struct Streaming {
    st: Arc<AppState>,
    id: String,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    tool_index: usize,
    pending: std::collections::VecDeque<String>,
    finished: bool,
    /// The client's request slot, held until the stream ends.
    _slot: Slot,
}

impl Streaming {
    fn chunk(&self, object: &str, choice: Value) -> String {
        json!({
            "id": self.id, "object": object, "created": self.st.created, "model": self.st.model_id,
            "choices": [choice],
        })
        .to_string()
    }

    fn end(&mut self, object: &str, done: Option<&Done>, last_choice: Option<Value>) {
        if let Some(c) = last_choice {
            let s = self.chunk(object, c);
            self.pending.push_back(s);
        }
        if let (true, Some(d)) = (self.include_usage, done) {
            let mut last = json!({
                "id": self.id, "object": object, "created": self.st.created, "model": self.st.model_id,
                "choices": [], "usage": usage(&self.st, d),
            });
            add_timings(&self.st, &mut last, d);
            self.pending.push_back(last.to_string());
        }
        self.pending.push_back("[DONE]".into());
        self.finished = true;
    }
}

/// Drive a `Streaming` with `next(state, event)` turning worker events into SSE data lines.
fn event_stream(
    mut s: Streaming,
    first: Option<String>,
    next: fn(&mut Streaming, Event),
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    s.pending.extend(first);
    stream::unfold(s, move |mut s| async move {
        loop {
            if let Some(data) = s.pending.pop_front() {
                return Some((Ok(SseEvent::default().data(data)), s));
            }
            if s.finished {
                return None;
            }
            match s.rx.recv().await {
                Some(ev) => next(&mut s, ev),
                None => {
                    let err = unexpected_end().body().to_string();
                    s.pending.push_back(err);
                    s.finished = true;
                }
            }
        }
    })
}

fn chat_stream(
    st: Arc<AppState>,
    id: String,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    slot: Slot,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let s = Streaming {
        st,
        id,
        rx,
        include_usage,
        tool_index: 0,
        pending: Default::default(),
        finished: false,
        _slot: slot,
    };
    let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null});
    let first = s.chunk("chat.completion.chunk", role);
    event_stream(s, Some(first), |s, ev| {
        const OBJ: &str = "chat.completion.chunk";
        let delta = |d: Value| json!({"index": 0, "delta": d, "finish_reason": null});
        match ev {
            Event::Reply(ReplyEvent::Content(t)) | Event::Text(t) => {
                let c = s.chunk(OBJ, delta(json!({"content": t})));
                s.pending.push_back(c);
            }
            Event::Reply(ReplyEvent::Reasoning(t)) => {
                let c = s.chunk(OBJ, delta(json!({"reasoning_content": t})));
                s.pending.push_back(c);
            }
            Event::Reply(ReplyEvent::ToolCall(call)) => {
                let short = s.id.rsplit('-').next().unwrap_or("").to_string();
                let c = s.chunk(
                    OBJ,
                    delta(json!({"tool_calls": [tool_call_json(&short, s.tool_index, &call)]})),
                );
                s.tool_index += 1;
                s.pending.push_back(c);
            }
            Event::Started => {}
            Event::Done(d) => {
                let last = json!({"index": 0, "delta": {}, "finish_reason": d.finish_reason});
                s.end(OBJ, Some(&d), Some(last));
            }
            Event::Failed(e) => {
                s.pending.push_back(e.body().to_string());
                s.finished = true;
            }
        }
    })
}

async fn completions(State(st): St, headers: HeaderMap, body: Body) -> Response {
    match completions_inner(&st, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// The prompt of a completion request: a string, a one-string array, or token ids.
fn completion_prompt(st: &AppState, prompt: &Value) -> Result<Vec<u32>, ApiError> {
    let bad = |m: &str| ApiError::invalid(m.to_string(), Some("prompt"));
    // The client writes the whole model input here, so its special tokens count (a client may
    // apply its own template); chat requests never parse them in content.
    let encode = |s: &str| {
        st.text_bound.check(s.len(), "prompt")?;
        Ok::<_, ApiError>(st.tok.encode(s, true))
    };
    let ids = match prompt {
        Value::String(s) => encode(s)?,
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            encode(items[0].as_str().unwrap_or_default())?
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_u64) => items
            .iter()
            .map(|v| match v.as_u64() {
                Some(t) if t < st.n_vocab as u64 => Ok(t as u32),
                _ => Err(bad("token id out of the vocabulary")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Value::Array(items) if items.len() > 1 && items.iter().all(Value::is_string) => {
            return Err(bad("only one prompt per request is supported"))
        }
        _ => return Err(bad("prompt must be a string or an array of token ids")),
    };
    if ids.is_empty() {
        return Err(bad("prompt must not be empty"));
    }
    Ok(ids)
}

async fn completions_inner(st: &Arc<AppState>, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (client, slot) = st.admit(headers)?;
    let bytes = read_body(st, headers, body).await?;
    let prep_st = Arc::clone(st);
    let p = st.prep.run(move || prepare_completion(&prep_st, &bytes)).await?;
    let (stream, include_usage) = (p.stream, p.include_usage);
    let mut q = st.submit(client, p)?;
    st.wait_started(&mut q).await?;
    let rx = q.rx;
    let id = st.new_id("cmpl");
    if stream {
        let s = Streaming {
            st: Arc::clone(st),
            id,
            rx,
            include_usage,
            tool_index: 0,
            pending: Default::default(),
            finished: false,
            _slot: slot,
        };
        return Ok(sse(event_stream(s, None, |s, ev| {
            const OBJ: &str = "text_completion";
            match ev {
                Event::Text(t) | Event::Reply(ReplyEvent::Content(t)) => {
                    let c = s.chunk(
                        OBJ,
                        json!({"index": 0, "text": t, "logprobs": null, "finish_reason": null}),
                    );
                    s.pending.push_back(c);
                }
                Event::Reply(_) | Event::Started => {}
                Event::Done(d) => {
                    let last = json!({"index": 0, "text": "", "logprobs": null, "finish_reason": d.finish_reason});
                    s.end(OBJ, Some(&d), Some(last));
                }
                Event::Failed(e) => {
                    s.pending.push_back(e.body().to_string());
                    s.finished = true;
                }
            }
        })));
    }
    let mut rx = rx;
    let mut text = String::new();
    let done = loop {
        match rx.recv().await.ok_or_else(unexpected_end)? {
            Event::Text(t) | Event::Reply(ReplyEvent::Content(t)) => text.push_str(&t),
            Event::Reply(_) | Event::Started => {}
            Event::Done(d) => break d,
            Event::Failed(e) => return Err(e),
        }
    };
    let mut out = json!({
        "id": id,
        "object": "text_completion",
        "created": st.created,
        "model": st.model_id,
        "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": done.finish_reason}],
        "usage": usage(st, &done),
    });
    add_timings(st, &mut out, &done);
    drop(slot);
    Ok(Json(out).into_response())
}

/// Parse, check and tokenize a completion request (on the blocking pool).
fn prepare_completion(st: &AppState, bytes: &[u8]) -> Result<Prepared, ApiError> {
    let body = api::parse_body(bytes)?;
    let req: CompletionRequest = api::fields(&body)?;
    let sampling: Sampling = api::fields(&body)?;
    let scope: CacheScope = api::fields(&body)?;
    st.check_model(&sampling)?;
    let settings = sampling.settings(default_seed())?;
    let salt = scope.salt()?.map(str::to_string);
    if req.echo == Some(true) || req.suffix.is_some() || req.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid("echo, suffix and best_of are not supported", None));
    }
    let prompt = completion_prompt(st, &req.prompt)?;
    // OpenAI's default for completions is 16 tokens.
    let max_tokens = st.budget(prompt.len(), settings.max_tokens, Some(16))?;
    let n = prompt.len();
    Ok(Prepared {
        prompt,
        // Before the last prompt token: the same prompt again (a retry, another sample) hits.
        snap_at: vec![n - 1],
        max_tokens,
        sampler: settings.sampler,
        stop: settings.stop,
        ignore_eos: settings.ignore_eos,
        kind: JobKind::Completion,
        stream: settings.stream,
        include_usage: settings.include_usage,
        salt,
    })
}

async fn models(State(st): St, headers: HeaderMap) -> Response {
    if let Err(e) = st.authorize(&headers) {
        return e.into_response();
    }
    Json(json!({
        "object": "list",
        "data": [{"id": st.model_id, "object": "model", "created": st.created, "owned_by": "rill",
                  "context_length": st.n_ctx}],
    }))
    .into_response()
}

fn health_json(st: &AppState) -> Value {
    let sh = &st.shared;
    let stats = sh.stats();
    let cache = stats.map(|s| s.cache).unwrap_or_default();
    json!({
        "status": "ok",
        "model": st.model_id,
        "queue_depth": sh.queued.load(Ordering::SeqCst),
        "busy": sh.busy.load(Ordering::SeqCst),
        "requests": {
            "completed": sh.completed.load(Ordering::Relaxed),
            "cancelled": sh.cancelled.load(Ordering::Relaxed),
            "failed": sh.failed.load(Ordering::Relaxed),
        },
        "batch": {
            "slots": sh.slots,
            "running": sh.prefilling.load(Ordering::Relaxed) + sh.decoding.load(Ordering::Relaxed),
            "prefilling": sh.prefilling.load(Ordering::Relaxed),
            "decoding": sh.decoding.load(Ordering::Relaxed),
            "waiting": sh.queued.load(Ordering::SeqCst),
            "size": sh.batch_size.load(Ordering::Relaxed),
            "decode_steps": sh.decode_steps.load(Ordering::Relaxed),
            "generated_tokens": sh.generated_tokens.load(Ordering::Relaxed),
            "prompt_tokens": sh.prompt_tokens.load(Ordering::Relaxed),
            "tokens_per_second": sh.tokens_per_second(),
        },
        "context": {"n_ctx": st.n_ctx, "live_tokens": stats.map(|s| s.pos).unwrap_or(0)},
        "connections": st.conns.open(),
        "cache": {
            "hits": cache.hits,
            "misses": cache.misses,
            "tokens_reused": cache.tokens_reused,
            "entries": cache.entries,
            "bytes": cache.bytes,
            "budget_bytes": cache.budget,
            "inserted": cache.inserted,
            "evicted": cache.evicted,
        },
    })
}

/// `/health` and `/metrics` need a key unless the operator opened them (`--public-health`):
/// they show live context length and cache counters, which say what other clients are doing.
fn authorize_monitoring(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if st.public_health {
        return Ok(());
    }
    st.authorize(headers).map(drop)
}

async fn health(State(st): St, headers: HeaderMap) -> Response {
    if let Err(e) = authorize_monitoring(&st, &headers) {
        return e.into_response();
    }
    Json(health_json(&st)).into_response()
}

/// The same numbers in the Prometheus text format.
async fn metrics(State(st): St, headers: HeaderMap) -> Response {
    if let Err(e) = authorize_monitoring(&st, &headers) {
        return e.into_response();
    }
    let h = health_json(&st);
    let n = |p: &str| h.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let mut out = String::new();
    for (name, help, ptr) in [
        ("rill_queue_depth", "requests waiting for the model", "/queue_depth"),
        ("rill_connections", "open client connections", "/connections"),
        (
            "rill_requests_completed_total",
            "requests served to the end",
            "/requests/completed",
        ),
        (
            "rill_requests_cancelled_total",
            "requests whose client went away",
            "/requests/cancelled",
        ),
        ("rill_requests_failed_total", "requests that failed", "/requests/failed"),
        (
            "rill_cache_hits_total",
            "prompts that resumed from cached state",
            "/cache/hits",
        ),
        ("rill_cache_misses_total", "prompts run from the start", "/cache/misses"),
        (
            "rill_cache_tokens_reused_total",
            "prompt tokens not run again",
            "/cache/tokens_reused",
        ),
        ("rill_cache_entries", "snapshots held", "/cache/entries"),
        ("rill_cache_bytes", "device bytes held by snapshots", "/cache/bytes"),
        ("rill_cache_budget_bytes", "--cache-mem", "/cache/budget_bytes"),
        ("rill_batch_slots", "sequence slots (--parallel)", "/batch/slots"),
        (
            "rill_requests_running",
            "requests in a slot (running their prompt or decoding)",
            "/batch/running",
        ),
        (
            "rill_requests_prefilling",
            "requests running their prompt",
            "/batch/prefilling",
        ),
        (
            "rill_requests_decoding",
            "requests in the decode batch",
            "/batch/decoding",
        ),
        ("rill_requests_waiting", "requests waiting for a slot", "/batch/waiting"),
        ("rill_batch_size", "rows of the last decode step", "/batch/size"),
        ("rill_decode_steps_total", "decode steps run", "/batch/decode_steps"),
        (
            "rill_generated_tokens_total",
            "tokens generated by decode steps",
            "/batch/generated_tokens",
        ),
        (
            "rill_prompt_tokens_total",
            "prompt tokens run (not restored from the cache)",
            "/batch/prompt_tokens",
        ),
    ] {
        out.push_str(&format!("# HELP {name} {help}\n{name} {}\n", n(ptr)));
    }
    let rate = h
        .pointer("/batch/tokens_per_second")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    out.push_str(&format!(
        "# HELP rill_generated_tokens_per_second tokens generated in the last second\nrill_generated_tokens_per_second {rate:.3}\n"
    ));
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}
