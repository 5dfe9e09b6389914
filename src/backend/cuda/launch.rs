//! How work reaches the GPU: the kernel parameter block, the op queue of one stream, recorded
//! decode steps replayed as CUDA graphs, and programmatic dependent launch.
//!
//! Every op becomes one or more `Op`s (a kernel launch, a memset, a device copy) submitted with the
//! tensors it touches. Normally an op is issued on the backend's stream at once. Between
//! `step_begin` (returning `Record`) and `step_end` the ops of the calling thread are kept in a
//! `Recording` instead; `step_end` captures them into a CUDA graph on a private capture stream,
//! instantiates it and launches it, and later steps with the same key launch that graph
//! (`Replayed`). If capture fails the recorded ops simply run, and that key is never recorded again.
//! Graphs remember the ids of the buffers they use; freeing one of those buffers drops the graph.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::ThreadId;

use cudarc::driver::sys;

use super::driver::{self, Graph};
use super::op::{Args, Op};
use super::Inner;
use crate::backend::{DeviceBuffer, StepMode, Tensor};
use crate::error::Result;

/// The ops of one decode step being recorded by one thread.
#[derive(Default)]
pub(crate) struct Recording {
    ops: Vec<Op>,
    /// Buffers the ops use: kept alive until the step ends; their ids name the graph's inputs.
    keep: Vec<Arc<dyn DeviceBuffer>>,
    ids: HashSet<u64>,
}

/// Recorded steps, by key.
#[derive(Default)]
pub(crate) struct GraphCache {
    map: HashMap<u64, Cached>,
    /// Keys whose capture failed: run as they come from now on.
    no_graph: HashSet<u64>,
    tick: u64,
    recorded: u64,
    replayed: u64,
}

struct Cached {
    graph: Graph,
    ids: HashSet<u64>,
    used: u64,
}

/// Graphs kept at once (one per live session and step variant; the least recently used goes).
const MAX_GRAPHS: usize = 32;

impl GraphCache {
    /// Drop every graph that uses buffer `id` (called when the buffer is freed).
    pub(crate) fn forget_buffer(&mut self, id: u64) {
        self.map.retain(|_, g| !g.ids.contains(&id));
    }
}

fn me() -> ThreadId {
    std::thread::current().id()
}

impl Inner {
    /// Issue `op` now, or append it to the calling thread's recording. `uses` are the tensors it
    /// reads or writes (kept alive while recorded).
    pub(crate) fn submit(&self, op: Op, uses: &[&Tensor]) -> Result<()> {
        self.submit_rw(op, &[], uses)
    }

    /// `submit` for an op that only reads `reads` and may write `writes`: only the written
    /// tensors lose their f16 copies (`shadow.rs`), so the products that share an input keep
    /// sharing its conversion. (`submit` treats every tensor as written.)
    pub(crate) fn submit_rw(&self, op: Op, reads: &[&Tensor], writes: &[&Tensor]) -> Result<()> {
        self.shadows_written(writes);
        if self.recording_threads.load(Ordering::Acquire) > 0 {
            let mut recs = self
                .recordings
                .lock()
                .map_err(|_| driver::cuda_err("recording lock poisoned"))?;
            if let Some(r) = recs.get_mut(&me()) {
                for t in reads.iter().chain(writes) {
                    if let Some(b) = t.buf.as_any().downcast_ref::<super::buffer::CudaBuffer>() {
                        if r.ids.insert(b.id) {
                            r.keep.push(Arc::clone(&t.buf));
                        }
                    }
                }
                r.ops.push(op);
                return Ok(());
            }
        }
        self.dev.bind()?;
        self.issue(&op, self.stream.0)
    }

    /// Whether the calling thread is recording a step (host reads and writes are then errors).
    pub(crate) fn recording_here(&self) -> bool {
        self.recording_threads.load(Ordering::Acquire) > 0
            && self.recordings.lock().map(|r| r.contains_key(&me())).unwrap_or(false)
    }

    /// Run one op on `stream` now (not captured): timed when the profile is on.
    fn issue(&self, op: &Op, stream: sys::CUstream) -> Result<()> {
        self.issue_with(op, stream, true, self.pdl.load(Ordering::Relaxed))
    }

    /// Put one op on `stream`. `eager`: the op runs now (it may be timed, and a launch refused
    /// with dependent launch turns that off and is retried); otherwise it is being captured, and
    /// any failure fails the capture.
    fn issue_with(&self, op: &Op, stream: sys::CUstream, eager: bool, pdl: bool) -> Result<()> {
        match op {
            Op::Kernel {
                f,
                name,
                grid,
                block,
                smem,
                args,
                phase,
                flops,
            } => {
                let prof = if eager { self.profile.as_ref() } else { None };
                let start = match prof {
                    Some(p) => Some(p.begin(stream)?),
                    None => None,
                };
                let params = args as *const Args as *const std::ffi::c_void;
                let r = driver::launch(f.0, *grid, *block, *smem, stream, params, pdl);
                match r {
                    Err(_) if pdl && eager => {
                        // A driver or graph mode without programmatic dependent launch: launch
                        // plainly from now on.
                        self.pdl.store(false, Ordering::Relaxed);
                        driver::launch(f.0, *grid, *block, *smem, stream, params, false)?;
                    }
                    other => other?,
                }
                if let (Some(p), Some(s)) = (prof, start) {
                    p.end(s, stream, *name, *phase, *flops)?;
                }
                Ok(())
            }
            Op::Memset { dst, bytes } => driver::memset0_async(*dst, *bytes, stream),
            Op::Copy { dst, src, bytes } => driver::dtod_async(*dst, *src, *bytes, stream),
        }
    }

    // ---- recorded steps ------------------------------------------------------------------

    pub(crate) fn step_begin(&self, key: u64) -> Result<StepMode> {
        // A replayed step writes its buffers without passing through `submit`.
        self.shadows_clear();
        if !self.graphs_enabled {
            return Ok(StepMode::Run);
        }
        self.dev.bind()?;
        {
            // A replayed graph uses the workspaces too: not between another thread's launches.
            let _ws = self.workspaces()?;
            let mut gc = self
                .graphs
                .lock()
                .map_err(|_| driver::cuda_err("graph cache poisoned"))?;
            gc.tick += 1;
            let tick = gc.tick;
            if let Some(g) = gc.map.get_mut(&key) {
                g.used = tick;
                g.graph.launch(self.stream.0)?;
                gc.replayed += 1;
                return Ok(StepMode::Replayed);
            }
            if gc.no_graph.contains(&key) {
                return Ok(StepMode::Run);
            }
        }
        let mut recs = self
            .recordings
            .lock()
            .map_err(|_| driver::cuda_err("recording lock poisoned"))?;
        if recs.insert(me(), Recording::default()).is_none() {
            self.recording_threads.fetch_add(1, Ordering::AcqRel);
        }
        Ok(StepMode::Record)
    }

    pub(crate) fn step_end(&self, key: u64, ok: bool) -> Result<()> {
        let rec = {
            let mut recs = self
                .recordings
                .lock()
                .map_err(|_| driver::cuda_err("recording lock poisoned"))?;
            let r = recs.remove(&me());
            if r.is_some() {
                self.recording_threads.fetch_sub(1, Ordering::AcqRel);
            }
            r
        };
        let Some(rec) = rec else { return Ok(()) };
        if !ok {
            return Ok(());
        }
        self.dev.bind()?;
        match self.capture(&rec.ops) {
            Ok(graph) => {
                self.workspaces().and_then(|_ws| graph.launch(self.stream.0))?;
                let mut gc = self
                    .graphs
                    .lock()
                    .map_err(|_| driver::cuda_err("graph cache poisoned"))?;
                if gc.map.len() >= MAX_GRAPHS {
                    if let Some(oldest) = gc.map.iter().min_by_key(|(_, g)| g.used).map(|(k, _)| *k) {
                        gc.map.remove(&oldest);
                    }
                }
                let used = gc.tick;
                gc.recorded += 1;
                gc.map.insert(
                    key,
                    Cached {
                        graph,
                        ids: rec.ids,
                        used,
                    },
                );
                // Release the cache before the recording's buffer handles go: a buffer freed
                // here takes the same lock.
                drop(gc);
                drop(rec.keep);
                Ok(())
            }
            Err(_) => {
                if let Ok(mut gc) = self.graphs.lock() {
                    gc.no_graph.insert(key);
                }
                // Ops one by one, consecutive on the stream like the graph (workspaces).
                let _ws = self.workspaces()?;
                rec.ops.iter().try_for_each(|op| self.issue(op, self.stream.0))
            }
        }
    }

    pub(crate) fn graph_stats(&self) -> super::GraphStats {
        match self.graphs.lock() {
            Ok(g) => super::GraphStats {
                recorded: g.recorded,
                replayed: g.replayed,
                cached: g.map.len(),
            },
            Err(_) => super::GraphStats::default(),
        }
    }

    /// Capture `ops` into an instantiated graph on the private capture stream. Kernels keep
    /// their dependent-launch attribute inside the graph (programmatic edges) unless a capture
    /// with it failed once; then graphs are captured without it.
    fn capture(&self, ops: &[Op]) -> Result<Graph> {
        let cap = self
            .capture
            .lock()
            .map_err(|_| driver::cuda_err("capture stream poisoned"))?;
        let try_capture = |pdl: bool| -> Result<Graph> {
            driver::begin_capture(cap.0)?;
            let issued = ops.iter().try_for_each(|op| self.issue_with(op, cap.0, false, pdl));
            let graph = driver::end_capture(cap.0);
            issued?;
            graph
        };
        let pdl = self.pdl.load(Ordering::Relaxed) && self.graph_pdl.load(Ordering::Relaxed);
        match try_capture(pdl) {
            Err(_) if pdl => {
                self.graph_pdl.store(false, Ordering::Relaxed);
                try_capture(false)
            }
            r => r,
        }
    }
}
