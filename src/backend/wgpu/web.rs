//! What the browser needs of the wgpu backend: reads that are awaited (a buffer is mapped from the
//! browser's event loop, so blocking on it would wait forever) and device errors, which arrive
//! through callbacks instead of error scopes that could be waited on.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::buffer::{self, words};
use super::{gpu_err, WgpuBackend};
use crate::backend::Tensor;
use crate::error::Result;

/// Keep the first uncaptured error and the loss of the device; `read` reports it.
pub(super) fn error_sink(device: &wgpu::Device) -> Arc<Mutex<Option<String>>> {
    let slot: Arc<Mutex<Option<String>>> = Arc::default();
    let keep = |slot: &Arc<Mutex<Option<String>>>| {
        let slot = Arc::clone(slot);
        move |msg: String| {
            if let Ok(mut s) = slot.lock() {
                s.get_or_insert(msg);
            }
        }
    };
    let on_error = keep(&slot);
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| on_error(e.to_string())));
    let on_lost = keep(&slot);
    device.set_device_lost_callback(move |reason, msg| on_lost(format!("device lost ({reason:?}): {msg}")));
    slot
}

/// Little-endian 4-byte words of `bytes` as values.
pub(super) fn le_words<T>(bytes: &[u8], from_le: fn([u8; 4]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(4)
        .map(|c| from_le([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Submit pending work and copy the tensor's `numel * 4` bytes back to the host, awaiting the map.
pub(super) async fn read(be: &WgpuBackend, t: &Tensor) -> Result<Vec<u8>> {
    let b = buffer::get(t)?;
    let bytes = (t.numel() as u64) * 4;
    if bytes == 0 {
        return Ok(Vec::new());
    }
    // One staging buffer, reused (a token id is read every step). It is taken out of its slot
    // while mapped, so no lock is held across the await; a concurrent read makes its own.
    let cached = be
        .readback
        .lock()
        .map_err(|_| gpu_err("readback lock poisoned"))?
        .take();
    let staging = match cached {
        Some(s) if s.size() >= words(bytes) => s,
        _ => be.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: words(bytes).next_power_of_two().max(256),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }),
    };
    {
        let mut enc = be.encoder()?;
        enc.host_access();
        enc.commands()
            .copy_buffer_to_buffer(&b.buffer, 0, &staging, 0, words(bytes));
        enc.flush();
    }
    let slice = staging.slice(..words(bytes));
    let mapped = MapDone::default();
    let done = mapped.clone();
    slice.map_async(wgpu::MapMode::Read, move |r| done.complete(r));
    mapped.await.map_err(|e| gpu_err(format!("readback map: {e}")))?;
    if let Some(e) = be.device_error.lock().ok().and_then(|e| e.clone()) {
        return Err(gpu_err(e));
    }
    let out = buffer::mapped_bytes(&slice, bytes)?;
    staging.unmap();
    if let Ok(mut slot) = be.readback.lock() {
        if slot.as_ref().is_none_or(|s| s.size() < staging.size()) {
            *slot = Some(staging);
        }
    }
    Ok(out)
}

/// Resolves when `Buffer::map_async` calls back (a one-shot channel).
#[derive(Clone, Default)]
struct MapDone(Arc<Mutex<MapState>>);

#[derive(Default)]
struct MapState {
    result: Option<std::result::Result<(), wgpu::BufferAsyncError>>,
    waker: Option<Waker>,
}

impl MapDone {
    fn complete(&self, r: std::result::Result<(), wgpu::BufferAsyncError>) {
        let waker = self.0.lock().ok().and_then(|mut s| {
            s.result = Some(r);
            s.waker.take()
        });
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Future for MapDone {
    type Output = std::result::Result<(), wgpu::BufferAsyncError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // A poisoned lock means the callback panicked: report the map as failed.
        let Ok(mut s) = self.0.lock() else {
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
