//! CPU-heavy request work (JSON parsing, chat template rendering, tokenization) off the async
//! runtime: a few blocking threads behind a semaphore, so that a flood of large prompts queues
//! here instead of stalling the runtime's worker threads (which also answer `/health` and stream
//! every response) or growing memory without bound. Plus the cheap bound that rejects a prompt
//! too long for the context from its byte length alone, before any tokenization.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::error::ApiError;
use crate::tokenizer::Tokenizer;

pub struct PrepPool {
    permits: Arc<Semaphore>,
}

impl PrepPool {
    /// A pool running at most `threads` jobs at once (at least one).
    pub fn new(threads: usize) -> PrepPool {
        PrepPool {
            permits: Arc::new(Semaphore::new(threads.max(1))),
        }
    }

    /// Run `f` on a blocking thread once a permit is free. A client that leaves while its job
    /// runs does not stop the job, but the permit bounds how many such jobs there can be.
    pub async fn run<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| ApiError::server("the request preparation pool is closed"))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            lower_thread_priority();
            f()
        })
        .await
        .map_err(|_| ApiError::server("internal error while preparing the request"))?
    }
}

/// Let the runtime's threads (which answer `/health` and stream every response) go first on a
/// busy machine: the calling blocking-pool thread runs at nice 10 from now on. Linux only (where
/// `setpriority` on the calling thread's id changes that thread alone); elsewhere a no-op.
fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        thread_local!(static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
        if !LOWERED.get() {
            // SAFETY: plain syscalls on the calling thread; a failure only leaves the priority as is.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS as _, tid, 10);
            }
            LOWERED.set(true);
        }
    }
}

/// How much text can possibly fit in the context: every token stands for at most
/// `max_token_bytes` bytes of text after NFC normalization, and NFC shrinks text at most threefold
/// (three Hangul jamo of three bytes each compose into one three-byte syllable; other compositions
/// shrink less), so a text longer than `n_ctx * max_token_bytes * 3` bytes is more than `n_ctx`
/// tokens whatever it says.
pub struct TextBound {
    max_bytes: usize,
    n_ctx: usize,
}

impl TextBound {
    pub fn new(tok: &Tokenizer, n_ctx: usize) -> TextBound {
        let longest = (0..tok.vocab_size() as u32)
            .map(|id| {
                let stored = tok.id_to_token(id).map_or(0, str::len);
                stored.max(tok.decode_bytes(&[id], true).len())
            })
            .max()
            .unwrap_or(1)
            .max(1);
        TextBound {
            max_bytes: n_ctx.saturating_mul(longest).saturating_mul(3),
            n_ctx,
        }
    }

    /// A 400 when `bytes` of text cannot fit the context.
    pub fn check(&self, bytes: usize, param: &str) -> Result<(), ApiError> {
        if bytes > self.max_bytes {
            return Err(ApiError::invalid(
                format!(
                    "the prompt is {bytes} bytes, more than any text of {} tokens (the context) can be",
                    self.n_ctx
                ),
                Some(param),
            )
            .with_code("context_length_exceeded"));
        }
        Ok(())
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}
