//! What the HTTP side reads of the model thread (`/health`, `/metrics`, shutdown): queue depth,
//! the batch, request counters and the engine's last reported stats.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::meter::Meter;
use crate::cache::EngineStats;

/// State the HTTP side reads: queue depth, the batch, counters, the engine's last reported stats.
pub struct Shared {
    /// Jobs in the queue, not yet taken up (no slot free).
    pub queued: AtomicUsize,
    /// The model thread has work (a request in a slot, including caching after a turn).
    pub busy: AtomicBool,
    /// Sequence slots (`--parallel`).
    pub slots: usize,
    /// Requests running their prompt, and requests in the decode batch.
    pub prefilling: AtomicUsize,
    pub decoding: AtomicUsize,
    /// Rows of the last decode step (0 when none ran).
    pub batch_size: AtomicUsize,
    pub decode_steps: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Prompt tokens run (not restored from the cache).
    pub prompt_tokens: AtomicU64,
    pub meter: Mutex<Meter>,
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub shutdown: AtomicBool,
    pub stats: Mutex<EngineStats>,
}

impl Shared {
    pub fn new(stats: EngineStats, slots: usize) -> Shared {
        Shared {
            queued: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            slots,
            prefilling: AtomicUsize::new(0),
            decoding: AtomicUsize::new(0),
            batch_size: AtomicUsize::new(0),
            decode_steps: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            meter: Mutex::new(Meter::new(Duration::from_secs(1))),
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

    /// Generated tokens per second over the last second of decode steps.
    pub fn tokens_per_second(&self) -> f64 {
        self.meter.lock().map(|m| m.rate(Instant::now())).unwrap_or(0.0)
    }
}
