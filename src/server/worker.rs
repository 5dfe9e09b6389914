//! The model thread: one engine (model, live session, prefix cache) and a pool of sequence
//! slots serving queued jobs, many at once (`batch.rs`). Jobs are taken from the queue in arrival
//! order while a slot is free, and report back over a channel; when its receiver is gone (the
//! client disconnected), the job leaves the batch at the next step.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use super::batch::Batch;
use super::job::Job;
use super::shared::Shared;
use crate::cache::Engine;
use crate::exec::StatePool;
use crate::tokenizer::Tokenizer;

/// Serve jobs until every sender is gone: take queued jobs while a slot is free, and step the
/// batch while it has work.
pub fn run(engine: Engine, pool: StatePool, tok: Arc<Tokenizer>, jobs: Receiver<Job>, shared: Arc<Shared>) {
    let mut batch = Batch::new(engine, pool, &tok, Arc::clone(&shared));
    let take = |batch: &mut Batch, job: Job| {
        shared.queued.fetch_sub(1, Ordering::SeqCst);
        batch.admit(job);
    };
    let mut open = true;
    loop {
        if batch.is_idle() {
            if !open {
                break;
            }
            match jobs.recv() {
                Ok(job) => take(&mut batch, job),
                Err(_) => break,
            }
        }
        // Stopping: drain the queue too (its jobs are answered at once, without a slot).
        while open && (batch.has_room() || shared.shutdown.load(Ordering::SeqCst)) {
            match jobs.try_recv() {
                Ok(job) => take(&mut batch, job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        batch.step();
    }
}
