//! `rill serve`: an OpenAI-compatible HTTP server. One model on one device: a dedicated thread
//! owns the engine (model, session, prefix cache) and serves queued requests in arrival order; the
//! async runtime only parses, validates, queues and streams. See README "rill serve".

mod api;
mod error;
mod http;
mod stop;
mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use error::ApiError;
pub use stop::StopMatcher;

use crate::cache::Engine;
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// Everything `serve` needs besides the engine.
pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// The id clients pass as `model`.
    pub model_id: String,
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Requests waiting beyond the running one before new ones get 503.
    pub max_queue: usize,
    pub think_default: bool,
}

/// Serve until SIGINT/SIGTERM. Prints `listening on http://ADDR` to stderr once bound.
pub fn serve(engine: Engine, tok: Tokenizer, opts: ServeOptions) -> Result<()> {
    let tok = Arc::new(tok);
    let shared = Arc::new(worker::Shared::new(engine.stats()));
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(opts.max_queue);
    let n_ctx = engine.n_ctx();
    let n_vocab = engine.model().config.n_vocab;
    let model_thread = {
        let (tok, shared) = (Arc::clone(&tok), Arc::clone(&shared));
        std::thread::Builder::new()
            .name("rill-model".into())
            .spawn(move || worker::run(engine, tok, jobs_rx, shared))
            .map_err(Error::IoPlain)?
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let state = Arc::new(http::AppState {
        jobs: jobs_tx,
        shared: Arc::clone(&shared),
        tok,
        model_id: opts.model_id,
        n_ctx,
        n_vocab,
        api_key: opts.api_key,
        body_limit: opts.body_limit,
        max_queue: opts.max_queue,
        think_default: opts.think_default,
        created,
        next_id: AtomicU64::new(0),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(Error::IoPlain)?;
    let result = rt.block_on(async {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::InvalidArgument(format!("cannot listen on {addr}: {e}")))?;
        let local: SocketAddr = listener.local_addr().map_err(Error::IoPlain)?;
        eprintln!("listening on http://{local}");
        let app = http::router(Arc::clone(&state));
        let stop = Arc::clone(&shared);
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown_signal().await;
                eprintln!("shutting down");
                // Running generations end at their next token.
                stop.shutdown.store(true, Ordering::SeqCst);
            })
            .await
            .map_err(Error::IoPlain)
    });
    // Dropping the last job sender ends the model thread's loop.
    drop(state);
    drop(rt);
    let _ = model_thread.join();
    result
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
