//! Device scratch owned by the backend for kernels' intermediates (attention partials, argmax
//! partials, MoE hidden rows), by purpose, and the lock that makes using it safe across threads.
//!
//! Every op runs on the backend's one stream, and a workspace is written by one launch of an op
//! and read by a later launch of the same op. Two threads running ops at once (two models on one
//! backend, the tests' parallel threads, a server) would interleave their launches on the stream:
//! thread B's MoE gate/up could overwrite the hidden rows between thread A's gate/up and down.
//! So an op takes the workspace lock (`Inner::workspaces`) before it asks for a workspace and
//! holds it until it has submitted its last launch: the op's launches are then consecutive on
//! the stream, and the stream runs them in order. The lock is reentrant on one thread (an op may
//! call another op's helpers that take it too). Recorded steps need nothing more: a graph is one
//! launch on the stream.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;

use super::driver::{self, cuda_err, DevPtr};
use super::Inner;
use crate::error::Result;

/// The workspaces and their lock.
#[derive(Default)]
pub(crate) struct Workspaces {
    /// Which thread holds the lock, and how many times over.
    owner: Mutex<Option<(ThreadId, usize)>>,
    released: Condvar,
    slots: Mutex<Slots>,
}

/// Allocations by purpose. They only grow; an outgrown allocation is kept until the backend
/// goes, because a recorded step may still use it.
#[derive(Default)]
struct Slots {
    by_purpose: HashMap<&'static str, (DevPtr, usize)>,
    retired: Vec<DevPtr>,
}

impl Workspaces {
    /// Free every allocation (the backend is going; the stream is idle).
    pub(crate) fn free_all(&self) {
        if let Ok(mut s) = self.slots.lock() {
            for (p, _) in s.by_purpose.values() {
                driver::mem_free(*p);
            }
            s.by_purpose.clear();
            for p in s.retired.drain(..) {
                driver::mem_free(p);
            }
        }
    }

    fn owner(&self) -> Result<MutexGuard<'_, Option<(ThreadId, usize)>>> {
        self.owner.lock().map_err(|_| cuda_err("workspace lock poisoned"))
    }
}

/// The workspace lock, held by the calling thread until dropped (not `Send`: the thread that
/// took it releases it).
pub(crate) struct WorkspaceGuard<'a> {
    inner: &'a Inner,
    _not_send: PhantomData<*const ()>,
}

impl Inner {
    /// Take the workspace lock (waits while another thread holds it). Hold the guard until the
    /// op's last launch that touches a workspace is submitted.
    pub(crate) fn workspaces(&self) -> Result<WorkspaceGuard<'_>> {
        let ws = &self.workspaces;
        let me = std::thread::current().id();
        let mut o = ws.owner()?;
        loop {
            match *o {
                None => {
                    *o = Some((me, 1));
                    break;
                }
                Some((t, n)) if t == me => {
                    *o = Some((t, n + 1));
                    break;
                }
                Some(_) => {
                    o = ws.released.wait(o).map_err(|_| cuda_err("workspace lock poisoned"))?;
                }
            }
        }
        Ok(WorkspaceGuard {
            inner: self,
            _not_send: PhantomData,
        })
    }
}

impl Inner {
    /// Device scratch for `purpose`. The caller must already hold `workspaces()` for its whole op:
    /// the lock taken here (reentrantly) is released on return.
    pub(crate) fn workspace(&self, purpose: &'static str, bytes: usize) -> Result<DevPtr> {
        self.workspaces()?.get(purpose, bytes)
    }
}

impl WorkspaceGuard<'_> {
    /// Device scratch of at least `bytes` for `purpose`.
    pub(crate) fn get(&self, purpose: &'static str, bytes: usize) -> Result<DevPtr> {
        let inner = self.inner;
        let mut s = inner
            .workspaces
            .slots
            .lock()
            .map_err(|_| cuda_err("workspace lock poisoned"))?;
        if let Some(&(p, n)) = s.by_purpose.get(purpose) {
            if n >= bytes {
                return Ok(p);
            }
        }
        inner.dev.bind()?;
        let size = bytes.max(1 << 16).next_power_of_two();
        let p = match driver::mem_alloc(size) {
            Ok(p) => p,
            Err(Some(e)) => return Err(e),
            Err(None) => {
                return Err(crate::Error::OutOfMemory {
                    what: format!("cuda scratch for {purpose}"),
                    needed: size as u64,
                    available: inner.dev.mem_info().map(|m| m.0).unwrap_or(0),
                })
            }
        };
        if let Some((old, _)) = s.by_purpose.insert(purpose, (p, size)) {
            s.retired.push(old);
        }
        Ok(p)
    }
}

impl Drop for WorkspaceGuard<'_> {
    fn drop(&mut self) {
        let ws = &self.inner.workspaces;
        // A poisoned lock cannot be handed on; the backend's ops then fail with that error.
        if let Ok(mut o) = ws.owner.lock() {
            *o = match *o {
                Some((t, n)) if n > 1 => Some((t, n - 1)),
                _ => None,
            };
            ws.released.notify_all();
        }
    }
}
