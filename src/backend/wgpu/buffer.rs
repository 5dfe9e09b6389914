//! Device buffers and the memory ops (alloc, upload, read back, zero, copy).
//!
//! Every buffer has a process-unique id: the encoder caches bind groups by the ids of the buffers
//! they bind. A dropped buffer reports its id to the graveyard, and the encoder then forgets every
//! bind group (and recorded step) that named it, so cached bind groups never keep memory alive.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{gpu_err, WgpuBackend};
use crate::backend::{DType, DeviceBuffer, Tensor, WeightData};
use crate::error::Result;

/// Ids of buffers dropped since the encoder last looked.
#[derive(Default)]
pub(crate) struct Graveyard {
    any: AtomicBool,
    ids: Mutex<Vec<u64>>,
}

impl Graveyard {
    /// The ids buried since the last call (empty without taking the lock when there are none).
    pub fn take(&self) -> Vec<u64> {
        if !self.any.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        self.ids.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default()
    }
}

/// A storage buffer. `size` is the allocated byte size (a multiple of 16, at least 16, so every
/// buffer can be bound as an array of vec4).
pub(crate) struct WgpuBuffer {
    pub buffer: wgpu::Buffer,
    pub size: u64,
    pub id: u64,
    graveyard: Arc<Graveyard>,
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        if let Ok(mut v) = self.graveyard.ids.lock() {
            v.push(self.id);
            self.graveyard.any.store(true, Ordering::Release);
        }
    }
}

impl DeviceBuffer for WgpuBuffer {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The wgpu buffer behind a tensor (an error if the tensor belongs to another backend).
pub(crate) fn get(t: &Tensor) -> Result<&WgpuBuffer> {
    t.buf
        .as_any()
        .downcast_ref::<WgpuBuffer>()
        .ok_or_else(|| gpu_err("tensor does not belong to the wgpu backend"))
}

pub(crate) fn elements(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| gpu_err(format!("shape {shape:?} overflows")))
}

/// Round a byte count up to whole u32 words (copies move whole words).
pub(crate) fn words(bytes: u64) -> u64 {
    bytes.div_ceil(4).max(1) * 4
}

/// Round a byte count up to whole vec4s (buffer sizes: shaders bind them as `array<vec4<..>>`).
fn vec4s(bytes: u64) -> u64 {
    bytes.div_ceil(16).max(1) * 16
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A new storage buffer of at least `bytes`, wrapped with its id.
pub(crate) fn create(be: &WgpuBackend, label: &str, bytes: u64, mapped: bool) -> Result<WgpuBuffer> {
    let size = vec4s(bytes);
    if size > be.caps.max_buffer {
        return Err(gpu_err(format!(
            "{label} needs a buffer of {size} bytes, this device's largest is {} bytes (try --backend cpu)",
            be.caps.max_buffer
        )));
    }
    let buffer = be.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: mapped,
    });
    Ok(WgpuBuffer {
        buffer,
        size,
        id: next_id(),
        graveyard: Arc::clone(&be.graveyard),
    })
}

pub(crate) fn tensor(buf: WgpuBuffer, dtype: DType, shape: &[usize]) -> Tensor {
    Tensor {
        buf: Arc::new(buf),
        dtype,
        shape: shape.to_vec(),
    }
}

/// Bytes of an F32/U32 tensor of `shape`.
pub(crate) fn f32_bytes(what: &str, dtype: DType, shape: &[usize]) -> Result<u64> {
    if !matches!(dtype, DType::F32 | DType::U32) {
        return Err(gpu_err(format!("{what}: only F32 and U32 tensors")));
    }
    (elements(shape)? as u64)
        .checked_mul(4)
        .ok_or_else(|| gpu_err(format!("{what}: size overflows")))
}

/// A zero-filled F32/U32 tensor (wgpu zero-initialises new buffers).
pub(crate) fn alloc(be: &WgpuBackend, dtype: DType, shape: &[usize]) -> Result<Tensor> {
    let bytes = f32_bytes("alloc", dtype, shape)?;
    Ok(tensor(create(be, "tensor", bytes, false)?, dtype, shape))
}

/// Create a buffer holding `bytes` (written through a mapping at creation, no staging copy).
fn create_init(be: &WgpuBackend, label: &str, bytes: &[u8]) -> Result<WgpuBuffer> {
    let buf = create(be, label, bytes.len() as u64, true)?;
    {
        let mut view = buf
            .buffer
            .slice(..)
            .get_mapped_range_mut()
            .map_err(|e| gpu_err(format!("map {label}: {e}")))?;
        view.slice(..bytes.len()).copy_from_slice(bytes);
    }
    buf.buffer.unmap();
    Ok(buf)
}

pub(crate) fn upload(be: &WgpuBackend, dtype: DType, shape: &[usize], bytes: &[u8], n: usize) -> Result<Tensor> {
    if elements(shape)? != n {
        return Err(gpu_err(format!("upload: {n} values for shape {shape:?}")));
    }
    Ok(tensor(create_init(be, "upload", bytes)?, dtype, shape))
}

/// A weight in its GGUF block format; shaders read it as `array<vec4<u32>>` and unpack the
/// blocks. A weight larger than one storage binding is bound in pieces of whole rows by the ops
/// (`pieces`); `check_weight` has already told the user about anything that cannot run.
pub(crate) fn upload_weight(be: &WgpuBackend, w: &WeightData) -> Result<Tensor> {
    let bytes = w.bytes.as_slice();
    be.check_weight(&w.name, w.ggml_type, &w.shape, bytes.len() as u64)?;
    let buf = create_init(be, &w.name, bytes)?;
    Ok(tensor(buf, DType::Ggml(w.ggml_type), &w.shape))
}

/// Overwrite an existing tensor from the host. Pending recorded work is submitted first, so ops
/// recorded earlier still see the old contents.
pub(crate) fn write(be: &WgpuBackend, t: &Tensor, dtype: DType, bytes: &[u8], n: usize) -> Result<()> {
    crate::backend::check::dtype("write", "t", t, dtype)?;
    if t.numel() != n {
        return Err(gpu_err(format!(
            "write: {n} values into a tensor of shape {:?}",
            t.shape
        )));
    }
    let b = get(t)?;
    let mut enc = be.encoder()?;
    enc.host_access();
    enc.flush();
    be.queue.write_buffer(&b.buffer, 0, bytes);
    Ok(())
}

/// The first `bytes` bytes of a mapped readback slice.
pub(crate) fn mapped_bytes(slice: &wgpu::BufferSlice<'_>, bytes: u64) -> Result<Vec<u8>> {
    let view = slice
        .get_mapped_range()
        .map_err(|e| gpu_err(format!("readback view: {e}")))?;
    Ok(view[..bytes as usize].to_vec())
}

pub(crate) fn zero(be: &WgpuBackend, t: &Tensor) -> Result<()> {
    if !matches!(t.dtype, DType::F32 | DType::U32) {
        return Err(gpu_err("zero: only F32/U32 tensors"));
    }
    let b = get(t)?;
    let mut enc = be.encoder()?;
    enc.commands().clear_buffer(&b.buffer, 0, None);
    Ok(())
}

pub(crate) fn copy(be: &WgpuBackend, src: &Tensor, dst: &Tensor) -> Result<()> {
    crate::backend::check::copy(src, dst)?;
    if src.same_buffer(dst) {
        return Ok(());
    }
    let (s, d) = (get(src)?, get(dst)?);
    let bytes = src.numel() as u64 * 4;
    if bytes == 0 {
        return Ok(());
    }
    let mut enc = be.encoder()?;
    enc.commands().copy_buffer_to_buffer(&s.buffer, 0, &d.buffer, 0, bytes);
    Ok(())
}

pub(crate) fn copy_rows(
    be: &WgpuBackend,
    src: &Tensor,
    src_row: usize,
    dst: &Tensor,
    dst_row: usize,
    n: usize,
) -> Result<()> {
    let w = crate::backend::check::copy_rows(src, src_row, dst, dst_row, n)?;
    if n == 0 || w == 0 {
        return Ok(());
    }
    if src.same_buffer(dst) {
        return Err(gpu_err("copy_rows: source and destination are the same buffer"));
    }
    let (s, d) = (get(src)?, get(dst)?);
    let row = w as u64 * 4;
    let mut enc = be.encoder()?;
    enc.commands().copy_buffer_to_buffer(
        &s.buffer,
        src_row as u64 * row,
        &d.buffer,
        dst_row as u64 * row,
        n as u64 * row,
    );
    Ok(())
}
