//! Reading device buffers back to the host. Every read is the same two halves: `start` queues a
//! copy of the tensor into a staging buffer, submits it and asks for the map; `Pending` waits for
//! that submission alone and returns the bytes. The blocking read (native) and the awaited read
//! (the browser maps from its event loop) run both halves at once; `Backend::read_u32_ahead`
//! returns between them, so the host can record and submit the next decode step while the device
//! still runs this one (the copy is in the queue before the next step's work, so that work may
//! overwrite the tensor).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

use super::buffer::{self, words};
use super::{gpu_err, WgpuBackend};
use crate::backend::Tensor;
use crate::error::Result;

/// Staging buffers kept for reuse: a read started ahead is still mapped while the next one
/// starts, and decode reads a token id every step (no allocation in the token loop).
const POOL_MAX: usize = 4;

/// The reusable staging buffers.
#[derive(Default)]
pub(super) struct Pool(Mutex<Vec<wgpu::Buffer>>);

impl Pool {
    /// A staging buffer of at least `words(bytes)` bytes: one from the pool, else a new one.
    fn take(&self, be: &WgpuBackend, bytes: u64) -> Result<wgpu::Buffer> {
        let mut pool = self.0.lock().map_err(|_| gpu_err("readback lock poisoned"))?;
        if let Some(i) = pool.iter().position(|b| b.size() >= words(bytes)) {
            return Ok(pool.swap_remove(i));
        }
        drop(pool);
        Ok(be.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: words(bytes).next_power_of_two().max(256),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    /// Return an unmapped staging buffer (dropped when the pool is full).
    fn give(&self, b: wgpu::Buffer) {
        if let Ok(mut pool) = self.0.lock() {
            if pool.len() < POOL_MAX {
                pool.push(b);
            }
        }
    }
}

/// A read whose copy is queued and submitted and whose map is requested.
pub(super) struct Pending {
    staging: wgpu::Buffer,
    bytes: u64,
    /// The submission holding the copy (waited for alone, not the work queued after it; the
    /// browser resolves the map from its event loop instead).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    index: Option<wgpu::SubmissionIndex>,
    mapped: MapDone,
}

/// Queue the copy of `t`'s `numel * 4` bytes after everything enqueued so far and submit it.
/// `None` for an empty tensor.
pub(super) fn start(be: &WgpuBackend, t: &Tensor) -> Result<Option<Pending>> {
    let b = buffer::get(t)?;
    let bytes = (t.numel() as u64) * 4;
    if bytes == 0 {
        return Ok(None);
    }
    let staging = be.readback.take(be, bytes)?;
    let index = {
        let mut enc = be.encoder()?;
        enc.host_access();
        enc.commands()
            .copy_buffer_to_buffer(&b.buffer, 0, &staging, 0, words(bytes));
        enc.submit()
    };
    let mapped = MapDone::default();
    let done = mapped.clone();
    staging
        .slice(..words(bytes))
        .map_async(wgpu::MapMode::Read, move |r| done.complete(r));
    Ok(Some(Pending {
        staging,
        bytes,
        index,
        mapped,
    }))
}

impl Pending {
    /// Block until the copy's submission is done and its map callback has run. The callback
    /// runs inside a poll, ours or, when several threads share the device, another thread's
    /// that is still running it when ours returns: then wait for it.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn wait(self, be: &WgpuBackend) -> Result<Vec<u8>> {
        let poll = |ty| be.device.poll(ty).map_err(|e| gpu_err(format!("device poll: {e}")));
        poll(wgpu::PollType::Wait {
            submission_index: self.index.clone(),
            timeout: None,
        })?;
        let t0 = std::time::Instant::now();
        let r = loop {
            if let Some(r) = self.mapped.wait_for(std::time::Duration::from_millis(1)) {
                break r;
            }
            if t0.elapsed() > std::time::Duration::from_secs(60) {
                return Err(gpu_err("readback map did not complete in 60 s"));
            }
            poll(wgpu::PollType::Poll)?;
        };
        self.finish(be, r)
    }

    /// `wait`, awaitable: the browser resolves the map from its event loop.
    pub(super) async fn wait_async(self, be: &WgpuBackend) -> Result<Vec<u8>> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.wait(be)
        }
        #[cfg(target_arch = "wasm32")]
        {
            let r = self.mapped.clone().await;
            self.finish(be, r)
        }
    }

    fn finish(self, be: &WgpuBackend, r: std::result::Result<(), wgpu::BufferAsyncError>) -> Result<Vec<u8>> {
        r.map_err(|e| gpu_err(format!("readback map: {e}")))?;
        #[cfg(target_arch = "wasm32")]
        if let Some(e) = be.device_error.lock().ok().and_then(|e| e.clone()) {
            return Err(gpu_err(e));
        }
        let out = {
            let slice = self.staging.slice(..words(self.bytes));
            buffer::mapped_bytes(&slice, self.bytes)
        };
        self.staging.unmap();
        be.readback.give(self.staging);
        out
    }
}

/// Copy the tensor's `numel * 4` bytes back to the host, blocking.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn read(be: &WgpuBackend, t: &Tensor) -> Result<Vec<u8>> {
    match start(be, t)? {
        Some(p) => p.wait(be),
        None => Ok(Vec::new()),
    }
}

/// The browser cannot block on a map.
#[cfg(target_arch = "wasm32")]
pub(crate) fn read(_be: &WgpuBackend, _t: &Tensor) -> Result<Vec<u8>> {
    Err(gpu_err(
        "blocking reads are impossible in the browser: await read_f32_async / read_u32_async",
    ))
}

/// `read`, awaitable (the browser's reads).
#[cfg(target_arch = "wasm32")]
pub(super) async fn read_async(be: &WgpuBackend, t: &Tensor) -> Result<Vec<u8>> {
    match start(be, t)? {
        Some(p) => p.wait_async(be).await,
        None => Ok(Vec::new()),
    }
}

/// Little-endian 4-byte words of `bytes` as values.
pub(super) fn le_words<T>(bytes: &[u8], from_le: fn([u8; 4]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(4)
        .map(|c| from_le([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Resolves when `Buffer::map_async` calls back (a one-shot channel): awaited in the browser,
/// waited for with a timeout natively.
#[derive(Clone, Default)]
struct MapDone(Arc<(Mutex<MapState>, Condvar)>);

#[derive(Default)]
struct MapState {
    result: Option<std::result::Result<(), wgpu::BufferAsyncError>>,
    waker: Option<Waker>,
}

impl MapDone {
    fn complete(&self, r: std::result::Result<(), wgpu::BufferAsyncError>) {
        let waker = self.0 .0.lock().ok().and_then(|mut s| {
            s.result = Some(r);
            s.waker.take()
        });
        self.0 .1.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The map's result once the callback has run, waiting up to `timeout` for it.
    #[cfg(not(target_arch = "wasm32"))]
    fn wait_for(&self, timeout: std::time::Duration) -> Option<std::result::Result<(), wgpu::BufferAsyncError>> {
        // A poisoned lock means the callback panicked: report the map as failed.
        let failed = Some(Err(wgpu::BufferAsyncError));
        let Ok(mut s) = self.0 .0.lock() else {
            return failed;
        };
        if s.result.is_none() {
            s = match self.0 .1.wait_timeout(s, timeout) {
                Ok((s, _)) => s,
                Err(_) => return failed,
            };
        }
        s.result.take()
    }
}

impl Future for MapDone {
    type Output = std::result::Result<(), wgpu::BufferAsyncError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // A poisoned lock means the callback panicked: report the map as failed.
        let Ok(mut s) = self.0 .0.lock() else {
            return Poll::Ready(Err(wgpu::BufferAsyncError));
        };
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
