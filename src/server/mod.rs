//! `rill serve`: an OpenAI-compatible HTTP server. One model on one device: a dedicated thread
//! owns the engine (model, live session, prefix cache) and a pool of sequence slots, and serves
//! queued requests many at a time (continuous batching: `worker`, `batch`, `sched`); the async
//! runtime only parses, validates, queues and streams. See README "rill serve".

mod api;
mod auth;
mod batch;
mod error;
mod generation;
mod http;
mod job;
mod listen;
mod meter;
mod prep;
mod sched;
mod shared;
mod slots;
mod stop;
mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use auth::{is_exposed, ApiKeys, DEFAULT_KEY_NAME};
pub use error::ApiError;
pub use sched::default_slots;
pub use stop::StopMatcher;

use crate::cache::Engine;
use crate::error::{Error, Result};
use crate::exec::StatePool;
use crate::tokenizer::Tokenizer;

/// Everything `serve` needs besides the engine.
pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// The id clients pass as `model`.
    pub model_id: String,
    /// Who may connect; empty = anyone.
    pub keys: ApiKeys,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Requests waiting for a slot before new ones get 503.
    pub max_queue: usize,
    /// Sequences decoded together (slots of the state pool).
    pub parallel: usize,
    pub think_default: bool,
    pub limits: Limits,
    pub privacy: Privacy,
}

/// Bounds on what one client (or connection) can hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request head must arrive within this; also closes connections that send nothing.
    pub header_timeout: Duration,
    /// A request body must arrive within this.
    pub body_timeout: Duration,
    /// Open connections; more are answered 503 and closed.
    pub max_connections: usize,
    /// How long shutdown waits for running requests and open connections.
    pub shutdown_timeout: Duration,
    /// Threads that parse and tokenize requests at once.
    pub prep_threads: usize,
    /// Requests one key may have in flight (0 = no cap; not applied without keys).
    pub max_per_key: usize,
    /// `max_tokens` of chat requests that name none (0 = the rest of the context).
    pub default_max_tokens: usize,
}

/// What one client may learn about the others.
#[derive(Debug, Clone, Copy, Default)]
pub struct Privacy {
    /// One prefix cache for every key instead of one per key.
    pub shared_cache: bool,
    /// Leave `cached_tokens` and `timings` out of responses.
    pub hide_cache_stats: bool,
    /// Serve `/health` and `/metrics` without a key.
    pub public_health: bool,
}

/// Serve until SIGINT/SIGTERM. Prints `listening on http://ADDR` to stderr once bound.
pub fn serve(engine: Engine, tok: Tokenizer, opts: ServeOptions) -> Result<()> {
    let mut limits = opts.limits;
    if let Some(fds) = listen::raise_fd_limit() {
        let room = fds.saturating_sub(listen::FD_RESERVE);
        if room == 0 {
            return Err(Error::InvalidArgument(format!(
                "the open-file limit ({fds}) leaves no room for connections; raise it (ulimit -n)"
            )));
        }
        if limits.max_connections > room {
            eprintln!(
                "warning: the open-file limit ({fds}) allows {room} connections; --max-connections lowered from {} to {room}",
                limits.max_connections
            );
            limits.max_connections = room;
        }
    }
    let tok = Arc::new(tok);
    let n_ctx = engine.n_ctx();
    let n_vocab = engine.model().config.n_vocab;
    // Allocated up front: a server that cannot hold its slots fails at start, not under load.
    let pool = engine.model().new_pool(opts.parallel, n_ctx)?;
    let pool_bytes = StatePool::bytes_needed(&engine.model().config, opts.parallel, n_ctx);
    let per_slot = StatePool::bytes_needed(&engine.model().config, 1, n_ctx);
    // What the device has left says how large `--parallel` could go at this context (the prefix
    // cache's budget, allocated as it fills, still to come out of it).
    let room = match engine.model().backend().memory_available() {
        Some(free) if per_slot > 0 => format!(
            "; the device has room for about {} more",
            free.saturating_sub(engine.stats().cache.budget) / per_slot
        ),
        _ => String::new(),
    };
    eprintln!(
        "batch: {} sequences of {n_ctx} tokens, {} each, {} in total{room}",
        opts.parallel,
        mib(per_slot),
        mib(pool_bytes)
    );
    let shared = Arc::new(shared::Shared::new(engine.stats(), opts.parallel));
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(opts.max_queue);
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let model_thread = {
        let (tok, shared) = (Arc::clone(&tok), Arc::clone(&shared));
        std::thread::Builder::new()
            .name("rill-model".into())
            .spawn(move || {
                worker::run(engine, pool, tok, jobs_rx, shared);
                let _ = done_tx.send(());
            })
            .map_err(Error::IoPlain)?
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let conns = Arc::new(listen::ConnCount::new(limits.max_connections));
    let text_bound = prep::TextBound::new(&tok, n_ctx);
    eprintln!(
        "limits: {} connections, headers within {:.1} s, prompts over {} bytes refused before tokenizing",
        limits.max_connections,
        limits.header_timeout.as_secs_f64(),
        text_bound.max_bytes()
    );
    let (stopping, _) = tokio::sync::watch::channel(false);
    // Without keys there is one client: a per-key cap would cap the whole server.
    let per_key = if opts.keys.is_empty() { 0 } else { limits.max_per_key };
    let state = Arc::new(http::AppState {
        jobs: jobs_tx,
        shared: Arc::clone(&shared),
        tok,
        model_id: opts.model_id,
        n_ctx,
        n_vocab,
        keys: opts.keys,
        slots: Arc::new(slots::ClientSlots::new(per_key)),
        prep: prep::PrepPool::new(limits.prep_threads),
        text_bound,
        conns: Arc::clone(&conns),
        body_limit: opts.body_limit,
        body_timeout: limits.body_timeout,
        max_queue: opts.max_queue,
        think_default: opts.think_default,
        default_max_tokens: limits.default_max_tokens,
        shared_cache: opts.privacy.shared_cache,
        hide_cache_stats: opts.privacy.hide_cache_stats,
        public_health: opts.privacy.public_health,
        stopping,
        created,
        next_id: AtomicU64::new(0),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(Error::IoPlain)?;
    let conn_limits = listen::ConnLimits {
        header_timeout: limits.header_timeout,
        shutdown_timeout: limits.shutdown_timeout,
    };
    let mut stop_started = None;
    let result = rt.block_on(async {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::InvalidArgument(format!("cannot listen on {addr}: {e}")))?;
        let local: SocketAddr = listener.local_addr().map_err(Error::IoPlain)?;
        eprintln!("listening on http://{local}");
        let app = http::router(Arc::clone(&state));
        let stop_state = Arc::clone(&state);
        let stop = async {
            shutdown_signal().await;
            eprintln!("shutting down");
            stop_started = Some(Instant::now());
            // Running generations end at their next token; queued requests are answered 503.
            stop_state.shared.shutdown.store(true, Ordering::SeqCst);
            stop_state.stopping.send_replace(true);
        };
        listen::serve(listener, app, conn_limits, &conns, stop).await;
        Ok(())
    });
    // Tasks still running (a tokenization on the blocking pool, a connection past the deadline)
    // are not waited for beyond a moment.
    drop(state);
    rt.shutdown_timeout(Duration::from_millis(200));
    // Dropping the last job sender ends the model thread's loop; a long prefill may still hold it,
    // so wait only for what is left of the shutdown bound (the process exits either way).
    let left = stop_started
        .map(|t| limits.shutdown_timeout.saturating_sub(t.elapsed()))
        .unwrap_or(limits.shutdown_timeout)
        .max(Duration::from_millis(500));
    match done_rx.recv_timeout(left) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            let _ = model_thread.join();
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            eprintln!("the model thread is still busy; exiting without it");
        }
    }
    result
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
