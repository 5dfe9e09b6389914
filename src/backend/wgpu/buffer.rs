//! Device buffers and the memory ops (alloc, upload, read back, zero, copy).

use std::any::Any;
use std::sync::Arc;

use super::{gpu_err, WgpuBackend};
use crate::backend::{DType, DeviceBuffer, Tensor, WeightData};
use crate::error::Result;

/// A storage buffer. `size` is the allocated byte size (a multiple of 4, at least 4).
pub(crate) struct WgpuBuffer {
    pub buffer: wgpu::Buffer,
    pub size: u64,
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

fn elements(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| gpu_err(format!("shape {shape:?} overflows")))
}

/// Round a byte count up to a whole number of u32 words (at least one).
fn padded(bytes: u64) -> u64 {
    bytes.div_ceil(4).max(1) * 4
}

fn create(be: &WgpuBackend, label: &str, bytes: u64, mapped: bool) -> Result<wgpu::Buffer> {
    let size = padded(bytes);
    if size > be.limits.max_buffer_size {
        return Err(gpu_err(format!(
            "out of device memory: {label} needs {size} bytes, the device's largest buffer is {} bytes",
            be.limits.max_buffer_size
        )));
    }
    Ok(be.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: mapped,
    }))
}

fn tensor(buffer: wgpu::Buffer, dtype: DType, shape: &[usize]) -> Tensor {
    let size = buffer.size();
    Tensor {
        buf: Arc::new(WgpuBuffer { buffer, size }),
        dtype,
        shape: shape.to_vec(),
    }
}

/// A zero-filled F32/U32 tensor (wgpu zero-initialises new buffers).
pub(crate) fn alloc(be: &WgpuBackend, dtype: DType, shape: &[usize]) -> Result<Tensor> {
    if !matches!(dtype, DType::F32 | DType::U32) {
        return Err(gpu_err("alloc: only F32 and U32 tensors can be allocated"));
    }
    let n = elements(shape)?;
    let bytes = (n as u64)
        .checked_mul(4)
        .ok_or_else(|| gpu_err("alloc: size overflows"))?;
    Ok(tensor(create(be, "tensor", bytes, false)?, dtype, shape))
}

/// A tensor of `shape` on a persistent scratch buffer named `slot` (an op's intermediates): the
/// buffer is created on first use, replaced by a larger one when a call needs more, and reused by
/// every later call, so ops allocate nothing in the token loop. Dispatches that share a slot are
/// ordered by wgpu's usage tracking like any other read-write buffer.
pub(crate) fn scratch(be: &WgpuBackend, slot: &'static str, dtype: DType, shape: &[usize]) -> Result<Tensor> {
    if !matches!(dtype, DType::F32 | DType::U32) {
        return Err(gpu_err("scratch: only F32 and U32 tensors"));
    }
    let bytes = (elements(shape)? as u64)
        .checked_mul(4)
        .ok_or_else(|| gpu_err("scratch: size overflows"))?;
    let mut pool = be.scratch.lock().map_err(|_| gpu_err("scratch pool lock poisoned"))?;
    let buf = match pool.get(slot) {
        Some(b) if b.size >= padded(bytes) => Arc::clone(b),
        _ => {
            let b = Arc::new(WgpuBuffer {
                buffer: create(be, slot, bytes, false)?,
                size: padded(bytes),
            });
            pool.insert(slot, Arc::clone(&b));
            b
        }
    };
    Ok(Tensor {
        buf,
        dtype,
        shape: shape.to_vec(),
    })
}

/// Create a buffer holding `bytes` (written through a mapping at creation, no staging copy).
fn create_init(be: &WgpuBackend, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
    let buf = create(be, label, bytes.len() as u64, true)?;
    {
        let mut view = buf
            .slice(..)
            .get_mapped_range_mut()
            .map_err(|e| gpu_err(format!("map {label}: {e}")))?;
        view.slice(..bytes.len()).copy_from_slice(bytes);
    }
    buf.unmap();
    Ok(buf)
}

pub(crate) fn upload(be: &WgpuBackend, dtype: DType, shape: &[usize], bytes: &[u8], n: usize) -> Result<Tensor> {
    if elements(shape)? != n {
        return Err(gpu_err(format!("upload: {n} values for shape {shape:?}")));
    }
    Ok(tensor(create_init(be, "upload", bytes)?, dtype, shape))
}

/// A weight in its GGUF block format; shaders read it as `array<u32>` and unpack the blocks.
pub(crate) fn upload_weight(be: &WgpuBackend, w: &WeightData) -> Result<Tensor> {
    let bytes = w.bytes.as_slice();
    let rows = elements(&w.shape)? / w.shape.last().copied().unwrap_or(1).max(1);
    let row = w.ggml_type.row_size(*w.shape.last().unwrap_or(&0) as u64);
    if row.and_then(|r| r.checked_mul(rows as u64)) != Some(bytes.len() as u64) {
        return Err(gpu_err(format!(
            "weight '{}': {} bytes do not match shape {:?}",
            w.name,
            bytes.len(),
            w.shape
        )));
    }
    let buf = create_init(be, &w.name, bytes)
        .map_err(|e| gpu_err(format!("weight '{}' ({} bytes): {e}", w.name, bytes.len())))?;
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
    let mut rec = be.recorder()?;
    be.flush_locked(&mut rec);
    be.queue.write_buffer(&b.buffer, 0, bytes);
    Ok(())
}

/// Submit pending work and copy the tensor's `numel * 4` bytes back to the host.
pub(crate) fn read(be: &WgpuBackend, t: &Tensor) -> Result<Vec<u8>> {
    let b = get(t)?;
    let bytes = (t.numel() as u64) * 4;
    if bytes == 0 {
        return Ok(Vec::new());
    }
    // One staging buffer, grown on demand and reused: decode reads back a token id every step,
    // and a fresh buffer per read would allocate in the token loop. The lock also serialises reads.
    let mut cache = be.readback.lock().map_err(|_| gpu_err("readback lock poisoned"))?;
    if cache.as_ref().is_none_or(|b| b.size() < padded(bytes)) {
        *cache = Some(be.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: padded(bytes).next_power_of_two().max(256),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }));
    }
    let staging = cache.as_ref().ok_or_else(|| gpu_err("readback buffer missing"))?;
    {
        let mut rec = be.recorder()?;
        be.encoder(&mut rec)
            .copy_buffer_to_buffer(&b.buffer, 0, staging, 0, padded(bytes));
        be.flush_locked(&mut rec);
    }
    let slice = staging.slice(..padded(bytes));
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    be.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| gpu_err(format!("device poll: {e}")))?;
    rx.recv()
        .map_err(|_| gpu_err("readback callback dropped"))?
        .map_err(|e| gpu_err(format!("readback map: {e}")))?;
    let out = {
        let view = slice
            .get_mapped_range()
            .map_err(|e| gpu_err(format!("readback view: {e}")))?;
        view[..bytes as usize].to_vec()
    };
    staging.unmap();
    Ok(out)
}

pub(crate) fn zero(be: &WgpuBackend, t: &Tensor) -> Result<()> {
    if !matches!(t.dtype, DType::F32 | DType::U32) {
        return Err(gpu_err("zero: only F32/U32 tensors"));
    }
    let b = get(t)?;
    let mut rec = be.recorder()?;
    be.encoder(&mut rec).clear_buffer(&b.buffer, 0, None);
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
    let mut rec = be.recorder()?;
    be.encoder(&mut rec)
        .copy_buffer_to_buffer(&s.buffer, 0, &d.buffer, 0, bytes);
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
    let mut rec = be.recorder()?;
    be.encoder(&mut rec).copy_buffer_to_buffer(
        &s.buffer,
        src_row as u64 * row,
        &d.buffer,
        dst_row as u64 * row,
        n as u64 * row,
    );
    Ok(())
}
