//! Device buffers (plain `cuMemAlloc` allocations) and the memory ops: alloc, upload, read back,
//! write, zero, copy. Weights keep their GGUF bytes, padded by `WEIGHT_PAD` zero bytes because the
//! kernels read whole 16-byte chunks around the blocks they decode.

use std::any::Any;
use std::sync::Arc;

use super::driver::{self, cuda_err, DevPtr};
use super::op::Op;
use super::Inner;
use crate::backend::{check, DType, DeviceBuffer, Tensor, WeightData};
use crate::error::{Error, Result};

/// Zero bytes after a weight's data (kernels-cuda/common.cuh, `ldwin`, reads up to 32 past).
pub(crate) const WEIGHT_PAD: usize = 64;

/// Landing buffers kept for reads started ahead (one is in flight while the next starts).
const AHEAD_POOL: usize = 4;

/// A pinned landing buffer and the event recorded after the copy into it.
pub(crate) struct AheadSlot {
    host: driver::Pinned,
    done: driver::Event,
}

/// A read started with `Inner::read_ahead`.
pub(crate) enum Ahead {
    /// Read at once (profiling, or nothing to read).
    Done(Vec<u8>),
    /// `n` bytes being copied into `slot`.
    Queued { slot: AheadSlot, n: usize },
}

pub(crate) struct CudaBuffer {
    pub ptr: DevPtr,
    pub bytes: usize,
    /// Unique per allocation: recorded steps remember the ids of their buffers.
    pub id: u64,
    /// The GGUF name of a weight (for the profile's phases).
    pub name: Option<Box<str>>,
    inner: Arc<Inner>,
}

impl DeviceBuffer for CudaBuffer {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let Ok(mut g) = self.inner.graphs.lock() {
            g.forget_buffer(self.id);
        }
        // Kernels still queued may use this memory: wait for them before freeing it. (Recorded
        // steps hold their buffers until the step ends, so this never runs inside one.)
        if self.inner.dev.bind().is_ok() {
            let _ = self.inner.stream.sync();
            driver::mem_free(self.ptr);
        }
    }
}

/// The CUDA buffer of a tensor, checked to hold at least `need` bytes.
pub(crate) fn get<'a>(t: &'a Tensor, op: &str, need: usize) -> Result<&'a CudaBuffer> {
    let b = t
        .buf
        .as_any()
        .downcast_ref::<CudaBuffer>()
        .ok_or_else(|| cuda_err(format!("{op}: tensor does not belong to the cuda backend")))?;
    if b.bytes < need {
        return Err(cuda_err(format!(
            "{op}: tensor {:?} needs {need} bytes, its buffer has {}",
            t.shape, b.bytes
        )));
    }
    Ok(b)
}

/// Device address of an F32/U32 tensor (checked to hold `numel` 4-byte values).
pub(crate) fn ptr(t: &Tensor, op: &str) -> Result<DevPtr> {
    let n = t
        .numel()
        .checked_mul(4)
        .ok_or_else(|| cuda_err(format!("{op}: size overflows")))?;
    Ok(get(t, op, n)?.ptr)
}

fn elements(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| cuda_err(format!("shape {shape:?} overflows")))
}

impl Inner {
    /// A new allocation of `bytes` (contents undefined). Out of memory is `Error::OutOfMemory`
    /// with the free bytes the driver reports.
    pub(crate) fn alloc_raw(self: &Arc<Self>, bytes: usize, what: &dyn Fn() -> String) -> Result<CudaBuffer> {
        self.dev.bind()?;
        let oom = || Error::OutOfMemory {
            what: what(),
            needed: bytes as u64,
            available: self.dev.mem_info().map(|m| m.0).unwrap_or(0),
        };
        // More than the whole device: say so without asking the driver (which may call a size
        // past its limits an invalid value rather than out of memory).
        if bytes as u64 > self.dev.total_mem {
            return Err(oom());
        }
        let ptr = match driver::mem_alloc(bytes) {
            Ok(p) => p,
            Err(Some(e)) => return Err(e),
            Err(None) => return Err(oom()),
        };
        Ok(CudaBuffer {
            ptr,
            bytes,
            id: self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            name: None,
            inner: Arc::clone(self),
        })
    }

    pub(crate) fn alloc(self: &Arc<Self>, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        if !matches!(dtype, DType::F32 | DType::U32) {
            return Err(cuda_err("alloc: only F32 and U32 tensors can be allocated"));
        }
        let bytes = elements(shape)?
            .checked_mul(4)
            .ok_or_else(|| cuda_err("alloc: size overflows"))?;
        let b = self.alloc_raw(bytes, &|| format!("a tensor of shape {shape:?}"))?;
        // Zero-filled, ordered before any later op on the stream.
        driver::memset0_async(b.ptr, bytes, self.stream.0)?;
        Ok(Tensor {
            buf: Arc::new(b),
            dtype,
            shape: shape.to_vec(),
        })
    }

    pub(crate) fn upload(self: &Arc<Self>, dtype: DType, shape: &[usize], bytes: &[u8], n: usize) -> Result<Tensor> {
        if elements(shape)? != n {
            return Err(cuda_err(format!("upload: {n} values for shape {shape:?}")));
        }
        let b = self.alloc_raw(bytes.len(), &|| format!("a tensor of shape {shape:?}"))?;
        // Work queued earlier may still read older buffers, never this new one: a synchronous
        // copy is safe here.
        driver::htod_sync(b.ptr, bytes)?;
        Ok(Tensor {
            buf: Arc::new(b),
            dtype,
            shape: shape.to_vec(),
        })
    }

    pub(crate) fn upload_weight(self: &Arc<Self>, w: &WeightData) -> Result<Tensor> {
        let bytes = w.bytes.as_slice();
        let cols = *w
            .shape
            .last()
            .ok_or_else(|| cuda_err(format!("weight '{}' has an empty shape", w.name)))?;
        let rows = elements(&w.shape)? / cols.max(1);
        let need = w
            .ggml_type
            .row_size(cols as u64)
            .and_then(|r| r.checked_mul(rows as u64));
        if need != Some(bytes.len() as u64) {
            return Err(cuda_err(format!(
                "weight '{}' {}: {} bytes do not match shape {:?}",
                w.name,
                w.ggml_type,
                bytes.len(),
                w.shape
            )));
        }
        let total = bytes.len() + WEIGHT_PAD;
        let mut b = self.alloc_raw(total, &|| format!("weight '{}' ({} bytes)", w.name, bytes.len()))?;
        driver::htod_sync(b.ptr, bytes)?;
        driver::htod_sync(b.ptr + bytes.len() as u64, &[0u8; WEIGHT_PAD])?;
        b.name = Some(w.name.clone().into_boxed_str());
        Ok(Tensor {
            buf: Arc::new(b),
            dtype: DType::Ggml(w.ggml_type),
            shape: w.shape.clone(),
        })
    }

    fn no_host_io_in_step(&self, op: &str) -> Result<()> {
        if self.recording_here() {
            return Err(cuda_err(format!(
                "{op} inside a recorded step (the executor reads and writes the host only between steps)"
            )));
        }
        Ok(())
    }

    pub(crate) fn write(&self, t: &Tensor, dtype: DType, bytes: &[u8], n: usize) -> Result<()> {
        check::dtype("write", "t", t, dtype)?;
        if t.numel() != n {
            return Err(cuda_err(format!(
                "write: {n} values into a tensor of shape {:?}",
                t.shape
            )));
        }
        self.no_host_io_in_step("write_u32")?;
        let p = ptr(t, "write")?;
        self.dev.bind()?;
        driver::htod_async(p, bytes, &self.stream)
    }

    /// Wait for all queued work, then copy the tensor's `numel * 4` bytes back.
    pub(crate) fn read(&self, t: &Tensor, dtype: DType) -> Result<Vec<u8>> {
        check::dtype("read", "t", t, dtype)?;
        self.no_host_io_in_step("read")?;
        let p = ptr(t, "read")?;
        self.dev.bind()?;
        let mut out = vec![0u8; t.numel() * 4];
        driver::dtoh(&mut out, p, &self.stream)?;
        self.collect_profile()?;
        Ok(out)
    }

    /// Start reading the tensor back (`Backend::read_u32_ahead`): the copy into pinned memory and
    /// an event after it are queued on the stream now, behind the work enqueued so far;
    /// `finish_ahead` waits for that event alone. While profiling (kernels timed one by one) the
    /// read is done at once.
    pub(crate) fn read_ahead(&self, t: &Tensor, dtype: DType) -> Result<Ahead> {
        check::dtype("read", "t", t, dtype)?;
        self.no_host_io_in_step("read")?;
        let n = t.numel() * 4;
        if self.profile.is_some() || n == 0 {
            return Ok(Ahead::Done(self.read(t, dtype)?));
        }
        let p = ptr(t, "read")?;
        self.dev.bind()?;
        let reused = {
            let mut pool = self.ahead.lock().map_err(|_| cuda_err("read-ahead lock poisoned"))?;
            pool.iter().position(|s| s.host.len() >= n).map(|i| pool.swap_remove(i))
        };
        let mut slot = match reused {
            Some(s) => s,
            None => AheadSlot {
                host: driver::Pinned::new(n.max(256))?,
                done: driver::Event::new_blocking()?,
            },
        };
        slot.host.dtoh_async(p, n, &self.stream)?;
        slot.done.record(self.stream.0)?;
        Ok(Ahead::Queued { slot, n })
    }

    /// The bytes of a read started with `read_ahead`.
    pub(crate) fn finish_ahead(&self, a: Ahead) -> Result<Vec<u8>> {
        let (slot, n) = match a {
            Ahead::Done(v) => return Ok(v),
            Ahead::Queued { slot, n } => (slot, n),
        };
        self.dev.bind()?;
        slot.done.sync()?;
        let out = slot.host.bytes(n).to_vec();
        if let Ok(mut pool) = self.ahead.lock() {
            if pool.len() < AHEAD_POOL {
                pool.push(slot);
            }
        }
        Ok(out)
    }

    pub(crate) fn sync(&self) -> Result<()> {
        self.no_host_io_in_step("sync")?;
        self.dev.bind()?;
        self.stream.sync()?;
        self.collect_profile()
    }

    pub(crate) fn zero(&self, t: &Tensor) -> Result<()> {
        if !matches!(t.dtype, DType::F32 | DType::U32) {
            return Err(cuda_err("zero: only F32/U32 tensors"));
        }
        let dst = ptr(t, "zero")?;
        self.submit(
            Op::Memset {
                dst,
                bytes: t.numel() * 4,
            },
            &[t],
        )
    }

    pub(crate) fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        check::copy(src, dst)?;
        if src.same_buffer(dst) {
            return Ok(());
        }
        let (s, d) = (ptr(src, "copy")?, ptr(dst, "copy")?);
        self.submit(
            Op::Copy {
                dst: d,
                src: s,
                bytes: src.numel() * 4,
            },
            &[src, dst],
        )
    }

    pub(crate) fn copy_rows(&self, src: &Tensor, src_row: usize, dst: &Tensor, dst_row: usize, n: usize) -> Result<()> {
        let w = check::copy_rows(src, src_row, dst, dst_row, n)?;
        if n == 0 || w == 0 {
            return Ok(());
        }
        let (s, d) = (ptr(src, "copy_rows")?, ptr(dst, "copy_rows")?);
        let row = (w * 4) as u64;
        if src.same_buffer(dst) {
            // Overlapping device copies are undefined; the executor never shifts rows in place.
            let (a, b) = (src_row, dst_row);
            if a < b + n && b < a + n {
                return Err(cuda_err("copy_rows: overlapping rows of one buffer"));
            }
        }
        self.submit(
            Op::Copy {
                dst: d + dst_row as u64 * row,
                src: s + src_row as u64 * row,
                bytes: n * w * 4,
            },
            &[src, dst],
        )
    }

    fn collect_profile(&self) -> Result<()> {
        match &self.profile {
            Some(p) => p.collect(),
            None => Ok(()),
        }
    }
}
