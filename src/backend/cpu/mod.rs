//! CPU reference backend: plain f32 kernels, multi-threaded with rayon where it is cheap.
//!
//! This is the oracle every GPU backend is tested against, so each kernel is written to be
//! obviously correct first (llm.c style: one loop nest per op, comments that say why), and fast
//! second (rayon over independent rows/heads, slice-based inner loops with several accumulator
//! lanes so the compiler vectorises them).
//!
//! Buffers live in host memory behind a `RwLock` so that tensors can be shared (`Tensor` is
//! `Clone`) while ops still get `&mut` access to their outputs. Taking a read and a write lock on
//! the same buffer from one thread would deadlock; the op contract (`backend::check`, called
//! first by every op) forbids outputs that share a buffer with another operand.

mod attention;
mod conv;
mod delta;
mod elementwise;
mod linear;
mod moe;
mod norm;

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::backend::{check, shape_err, AttnDims, Backend, DType, DeviceBuffer, GdnDims, Pos, Tensor, WeightData};
use crate::error::{Error, Result};
use crate::gguf::{GgmlType, TensorBytes};
use crate::quant;

/// Host memory behind a tensor handle.
pub enum CpuBuffer {
    F32(RwLock<Vec<f32>>),
    U32(RwLock<Vec<u32>>),
    /// A weight in its GGUF block format, zero-copy (usually a view of the memory-mapped file).
    Weight {
        ty: GgmlType,
        bytes: TensorBytes,
    },
}

impl DeviceBuffer for CpuBuffer {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The CPU backend. Stateless: all state lives in tensors.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}

// ---------------------------------------------------------------------------------------------
// Buffer access helpers shared by the kernels.

fn cpu_buf<'a>(t: &'a Tensor, op: &str) -> Result<&'a CpuBuffer> {
    t.buf
        .as_any()
        .downcast_ref::<CpuBuffer>()
        .ok_or_else(|| shape_err(op, "tensor does not belong to the cpu backend"))
}

fn poisoned(op: &str) -> Error {
    Error::Backend(format!("{op}: buffer lock poisoned by an earlier panic"))
}

/// Read access to an F32 operand: either a lock guard on an F32 buffer, or (for small weights
/// uploaded with `upload_weight`, e.g. norm or conv weights in GGUF F32/F16) a dequantized copy.
pub(crate) enum F32Read<'a> {
    Lock(RwLockReadGuard<'a, Vec<f32>>, usize),
    Owned(Vec<f32>),
}

impl Deref for F32Read<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            F32Read::Lock(g, n) => &g[..*n],
            F32Read::Owned(v) => v,
        }
    }
}

/// Write access to the first `numel` elements of an F32 buffer.
pub(crate) struct F32Write<'a>(RwLockWriteGuard<'a, Vec<f32>>, usize);

impl Deref for F32Write<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0[..self.1]
    }
}
impl DerefMut for F32Write<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.0[..self.1]
    }
}

pub(crate) struct U32Read<'a>(RwLockReadGuard<'a, Vec<u32>>, usize);
impl Deref for U32Read<'_> {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        &self.0[..self.1]
    }
}
pub(crate) struct U32Write<'a>(RwLockWriteGuard<'a, Vec<u32>>, usize);
impl Deref for U32Write<'_> {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        &self.0[..self.1]
    }
}
impl DerefMut for U32Write<'_> {
    fn deref_mut(&mut self) -> &mut [u32] {
        &mut self.0[..self.1]
    }
}

fn check_view(op: &str, numel: usize, len: usize) -> Result<()> {
    if numel > len {
        return Err(shape_err(
            op,
            format!("tensor has {numel} elements but its buffer only {len}"),
        ));
    }
    Ok(())
}

/// Read an F32 operand (also accepts a weight in a format `quant::dequantize` handles).
pub(crate) fn read_f32s<'a>(t: &'a Tensor, op: &str) -> Result<F32Read<'a>> {
    let n = t.numel();
    match cpu_buf(t, op)? {
        CpuBuffer::F32(lock) => {
            let g = lock.read().map_err(|_| poisoned(op))?;
            check_view(op, n, g.len())?;
            Ok(F32Read::Lock(g, n))
        }
        CpuBuffer::Weight { ty, bytes } => {
            let mut v = vec![0f32; n];
            let need = ty
                .row_size(t.cols() as u64)
                .map(|rs| rs as usize * t.rows())
                .ok_or_else(|| shape_err(op, format!("{ty} row of {} elements", t.cols())))?;
            let src = bytes
                .as_slice()
                .get(..need)
                .ok_or_else(|| shape_err(op, "weight shape larger than its bytes"))?;
            quant::dequantize(*ty, src, &mut v)?;
            Ok(F32Read::Owned(v))
        }
        CpuBuffer::U32(_) => Err(shape_err(op, format!("expected an F32 tensor, got {:?}", t.dtype))),
    }
}

pub(crate) fn write_f32s<'a>(t: &'a Tensor, op: &str) -> Result<F32Write<'a>> {
    let n = t.numel();
    match cpu_buf(t, op)? {
        CpuBuffer::F32(lock) => {
            let g = lock.write().map_err(|_| poisoned(op))?;
            check_view(op, n, g.len())?;
            Ok(F32Write(g, n))
        }
        _ => Err(shape_err(
            op,
            format!("expected a writable F32 tensor, got {:?}", t.dtype),
        )),
    }
}

pub(crate) fn read_u32s<'a>(t: &'a Tensor, op: &str) -> Result<U32Read<'a>> {
    let n = t.numel();
    match cpu_buf(t, op)? {
        CpuBuffer::U32(lock) => {
            let g = lock.read().map_err(|_| poisoned(op))?;
            check_view(op, n, g.len())?;
            Ok(U32Read(g, n))
        }
        _ => Err(shape_err(op, format!("expected a U32 tensor, got {:?}", t.dtype))),
    }
}

pub(crate) fn write_u32s<'a>(t: &'a Tensor, op: &str) -> Result<U32Write<'a>> {
    let n = t.numel();
    match cpu_buf(t, op)? {
        CpuBuffer::U32(lock) => {
            let g = lock.write().map_err(|_| poisoned(op))?;
            check_view(op, n, g.len())?;
            Ok(U32Write(g, n))
        }
        _ => Err(shape_err(
            op,
            format!("expected a writable U32 tensor, got {:?}", t.dtype),
        )),
    }
}

/// A read-only matrix operand of `matmul`/`embed`/`moe_experts`: `rows` rows of `cols` values.
#[derive(Clone, Copy)]
pub(crate) enum WeightRef<'a> {
    /// Plain f32 rows (an F32 activation-style buffer).
    F32(&'a [f32]),
    /// GGUF blocks; a row is `row_bytes` bytes.
    Quant {
        ty: GgmlType,
        bytes: &'a [u8],
        row_bytes: usize,
    },
}

/// Holds whatever lock a `WeightRef` borrows from.
pub(crate) enum WeightGuard<'a> {
    F32(F32Read<'a>),
    Quant { ty: GgmlType, bytes: &'a [u8] },
}

impl WeightGuard<'_> {
    /// View of the whole weight with rows of `cols` values.
    pub(crate) fn as_ref(&self, cols: usize, op: &str) -> Result<WeightRef<'_>> {
        match self {
            WeightGuard::F32(v) => Ok(WeightRef::F32(v)),
            WeightGuard::Quant { ty, bytes } => {
                let row_bytes = ty
                    .row_size(cols as u64)
                    .ok_or_else(|| shape_err(op, format!("row of {cols} is not a whole number of {ty} blocks")))?
                    as usize;
                Ok(WeightRef::Quant {
                    ty: *ty,
                    bytes,
                    row_bytes,
                })
            }
        }
    }
}

/// Borrow a weight operand; checks that its bytes cover `t.shape`.
pub(crate) fn read_weight<'a>(t: &'a Tensor, op: &str) -> Result<WeightGuard<'a>> {
    match cpu_buf(t, op)? {
        CpuBuffer::Weight { ty, bytes } => {
            let rs = ty
                .row_size(t.cols() as u64)
                .ok_or_else(|| shape_err(op, format!("row of {} is not a whole number of {ty} blocks", t.cols())))?;
            let need = (rs as usize)
                .checked_mul(t.rows())
                .ok_or_else(|| shape_err(op, "weight size overflows"))?;
            let b = bytes.as_slice().get(..need).ok_or_else(|| {
                shape_err(
                    op,
                    format!("weight shape {:?} needs {need} bytes, has {}", t.shape, bytes.len()),
                )
            })?;
            Ok(WeightGuard::Quant { ty: *ty, bytes: b })
        }
        CpuBuffer::F32(_) => Ok(WeightGuard::F32(read_f32s(t, op)?)),
        CpuBuffer::U32(_) => Err(shape_err(op, "expected a weight, got a U32 tensor")),
    }
}

// ---------------------------------------------------------------------------------------------
// Small vector helpers used by every kernel. Written over fixed-width chunks so the compiler
// emits vector code without bounds checks; several independent accumulators hide add latency.

/// A copy of `data`, which must hold exactly the elements of `shape`.
fn checked_copy<T: Copy>(op: &str, data: &[T], shape: &[usize]) -> Result<Vec<T>> {
    let n: Option<usize> = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if n != Some(data.len()) {
        return Err(shape_err(op, format!("{} values for shape {shape:?}", data.len())));
    }
    Ok(data.to_vec())
}

/// A zero-filled vector of `n` elements, or a typed out-of-memory error instead of an abort
/// (sizes can come from a hostile file's metadata or the command line).
///
/// The memory comes from `alloc_zeroed`, which the system allocator serves with fresh zero pages
/// for large sizes: nothing is touched until it is written, so a KV cache sized for a long
/// context costs only the rows in use.
fn zeroed_vec<T: bytemuck::Zeroable + Copy>(n: usize, shape: &[usize]) -> Result<Vec<T>> {
    let oom = || Error::OutOfMemory {
        what: format!("a tensor of shape {shape:?}"),
        needed: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        available: memory_available().unwrap_or(0),
    };
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| oom())?;
    // SAFETY: the layout has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if ptr.is_null() {
        return Err(oom());
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `[T; n]`, and all-zero
    // bytes are a valid `T` (`Zeroable`), so all `n` elements are initialised.
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// `MemAvailable` of /proc/meminfo in bytes (Linux), the memory new buffers can take.
fn memory_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `dot` of two weight rows against two input rows at once (a 2x2 register tile: each loaded
/// value feeds two products). Every (row, input) pair is accumulated in exactly the order `dot`
/// uses, so the four results are bit-identical to four `dot` calls.
#[inline(always)]
pub(crate) fn dot_2x2(w0: &[f32], w1: &[f32], x0: &[f32], x1: &[f32]) -> [[f32; 2]; 2] {
    let n = w0.len();
    debug_assert!(w1.len() == n && x0.len() == n && x1.len() == n);
    let mut acc = [[[0f32; 16]; 2]; 2];
    let full = n / 16 * 16;
    let mut i = 0;
    while i < full {
        let (a0, a1) = (&w0[i..i + 16], &w1[i..i + 16]);
        let (b0, b1) = (&x0[i..i + 16], &x1[i..i + 16]);
        for l in 0..16 {
            acc[0][0][l] += a0[l] * b0[l];
            acc[0][1][l] += a0[l] * b1[l];
            acc[1][0][l] += a1[l] * b0[l];
            acc[1][1][l] += a1[l] * b1[l];
        }
        i += 16;
    }
    let rows = [w0, w1];
    let xs = [x0, x1];
    let mut out = [[0f32; 2]; 2];
    for r in 0..2 {
        for t in 0..2 {
            let mut tail = 0f32;
            for j in full..n {
                tail += rows[r][j] * xs[t][j];
            }
            let a = &mut acc[r][t];
            let mut w = 8;
            while w > 0 {
                for l in 0..w {
                    a[l] += a[l + w];
                }
                w /= 2;
            }
            out[r][t] = a[0] + tail;
        }
    }
    out
}

/// `Σ a[i]·b[i]` over the shorter length, accumulated in 16 lanes.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    // Pairwise reduction of the lanes.
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0] + tail
}

/// `y[i] += a · x[i]`.
#[inline]
pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

#[inline]
pub(crate) fn sigmoid(x: f32) -> f32 {
    // exp(-x) overflows to inf for x < -88: 1/(1+inf) = 0, the right limit.
    1.0 / (1.0 + (-x).exp())
}

#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// Minimum number of elements per rayon task for cheap elementwise kernels.
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 14;

/// Rows per rayon task so that each task touches at least `PAR_MIN_ELEMS` elements.
#[inline]
pub(crate) fn min_rows(row_len: usize) -> usize {
    PAR_MIN_ELEMS.div_ceil(row_len.max(1))
}

fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

// ---------------------------------------------------------------------------------------------

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_name(&self) -> String {
        format!("{} ({} threads)", cpu_model_name(), rayon::current_num_threads())
    }

    fn driver_info(&self) -> String {
        format!("rayon {} threads", rayon::current_num_threads())
    }

    fn memory_available(&self) -> Option<u64> {
        memory_available()
    }

    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| shape_err("alloc", format!("shape {shape:?} overflows")))?;
        let buf: Arc<dyn DeviceBuffer> = match dtype {
            DType::F32 => Arc::new(CpuBuffer::F32(RwLock::new(zeroed_vec(n, shape)?))),
            DType::U32 => Arc::new(CpuBuffer::U32(RwLock::new(zeroed_vec(n, shape)?))),
            DType::Ggml(_) => return Err(shape_err("alloc", "only F32 and U32 tensors can be allocated")),
        };
        Ok(Tensor {
            buf,
            dtype,
            shape: shape.to_vec(),
        })
    }

    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        let buf = CpuBuffer::F32(RwLock::new(checked_copy("upload_f32", data, shape)?));
        Ok(Tensor {
            buf: Arc::new(buf),
            dtype: DType::F32,
            shape: shape.to_vec(),
        })
    }

    fn upload_u32(&self, data: &[u32], shape: &[usize]) -> Result<Tensor> {
        let buf = CpuBuffer::U32(RwLock::new(checked_copy("upload_u32", data, shape)?));
        Ok(Tensor {
            buf: Arc::new(buf),
            dtype: DType::U32,
            shape: shape.to_vec(),
        })
    }

    fn upload_weight(&self, w: &WeightData) -> Result<Tensor> {
        let op = "upload_weight";
        let cols = *w
            .shape
            .last()
            .ok_or_else(|| shape_err(op, format!("'{}' has an empty shape", w.name)))?;
        let rows: usize = w.shape[..w.shape.len() - 1].iter().product();
        let need = w
            .ggml_type
            .row_size(cols as u64)
            .and_then(|rs| (rs as usize).checked_mul(rows))
            .ok_or_else(|| {
                shape_err(
                    op,
                    format!(
                        "'{}': row of {cols} is not a whole number of {} blocks",
                        w.name, w.ggml_type
                    ),
                )
            })?;
        if need != w.bytes.len() {
            return Err(shape_err(
                op,
                format!(
                    "'{}' {:?} {}: {} bytes, expected {need}",
                    w.name,
                    w.shape,
                    w.ggml_type,
                    w.bytes.len()
                ),
            ));
        }
        Ok(Tensor {
            buf: Arc::new(CpuBuffer::Weight {
                ty: w.ggml_type,
                bytes: w.bytes.clone(),
            }),
            dtype: DType::Ggml(w.ggml_type),
            shape: w.shape.clone(),
        })
    }

    fn write_u32(&self, t: &Tensor, data: &[u32]) -> Result<()> {
        let mut d = write_u32s(t, "write_u32")?;
        if d.len() != data.len() {
            return Err(shape_err(
                "write_u32",
                format!("{} values for {} elements", data.len(), d.len()),
            ));
        }
        d.copy_from_slice(data);
        Ok(())
    }

    fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        Ok(read_f32s(t, "read_f32")?.to_vec())
    }

    fn read_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        Ok(read_u32s(t, "read_u32")?.to_vec())
    }

    fn zero(&self, t: &Tensor) -> Result<()> {
        match t.dtype {
            DType::F32 => write_f32s(t, "zero")?.fill(0.0),
            DType::U32 => write_u32s(t, "zero")?.fill(0),
            d => return Err(shape_err("zero", format!("cannot zero a {d:?} tensor"))),
        }
        Ok(())
    }

    fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        let op = "copy";
        check::copy(src, dst)?;
        if src.same_buffer(dst) {
            // Both views start at element 0 of the same buffer: copying onto itself is a no-op.
            return Ok(());
        }
        match src.dtype {
            DType::F32 => write_f32s(dst, op)?.copy_from_slice(&read_f32s(src, op)?),
            DType::U32 => write_u32s(dst, op)?.copy_from_slice(&read_u32s(src, op)?),
            d => return Err(shape_err(op, format!("cannot copy a {d:?} tensor"))),
        }
        Ok(())
    }

    fn copy_rows(&self, src: &Tensor, src_row: usize, dst: &Tensor, dst_row: usize, n: usize) -> Result<()> {
        let op = "copy_rows";
        let d = check::copy_rows(src, src_row, dst, dst_row, n)?;
        let (s0, t0) = (src_row * d, dst_row * d);
        if src.same_buffer(dst) {
            // Shifting rows inside one buffer (e.g. a cache): one write lock, memmove semantics.
            let mut b = write_f32s(dst, op)?;
            b.copy_within(s0..s0 + n * d, t0);
            return Ok(());
        }
        let s = read_f32s(src, op)?;
        let mut t = write_f32s(dst, op)?;
        t[t0..t0 + n * d].copy_from_slice(&s[s0..s0 + n * d]);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        // Every op runs to completion before it returns.
        Ok(())
    }

    fn embed(&self, table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()> {
        linear::embed(table, ids, out)
    }

    fn matmul(&self, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
        linear::matmul(w, x, out)
    }

    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
        norm::rms_norm(x, w, eps, out)
    }

    fn add_assign(&self, acc: &Tensor, x: &Tensor) -> Result<()> {
        elementwise::add_assign(acc, x)
    }

    fn swiglu(&self, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
        elementwise::swiglu(gate, up, out)
    }

    fn sigmoid_mul_assign(&self, x: &Tensor, gate: &Tensor) -> Result<()> {
        elementwise::sigmoid_mul_assign(x, gate)
    }

    fn sigmoid_scale_add(&self, acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()> {
        elementwise::sigmoid_scale_add(acc, x, gate_logit)
    }

    fn conv1d_causal_silu(&self, x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<()> {
        conv::conv1d_causal_silu(x, w, state, out)
    }

    fn gdn_gates(
        &self,
        a: &Tensor,
        b: &Tensor,
        ssm_a: &Tensor,
        dt_bias: &Tensor,
        g_out: &Tensor,
        beta_out: &Tensor,
    ) -> Result<()> {
        elementwise::gdn_gates(a, b, ssm_a, dt_bias, g_out, beta_out)
    }

    fn l2_norm_qk(&self, u: &Tensor, dims: GdnDims, eps: f32) -> Result<()> {
        norm::l2_norm_qk(u, dims, eps)
    }

    fn delta_rule_recurrent(
        &self,
        u: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        state: &Tensor,
        out: &Tensor,
        dims: GdnDims,
    ) -> Result<()> {
        delta::delta_rule(u, g, beta, state, out, dims, delta::Algo::Recurrent)
    }

    fn delta_rule_chunked(
        &self,
        u: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        state: &Tensor,
        out: &Tensor,
        dims: GdnDims,
    ) -> Result<()> {
        delta::delta_rule(u, g, beta, state, out, dims, delta::Algo::Chunked)
    }

    fn gated_rms_norm(&self, x: &Tensor, z: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
        norm::gated_rms_norm(x, z, w, eps, out)
    }

    fn split_qgate(&self, qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<()> {
        elementwise::split_qgate(qg, head_dim, q, gate)
    }

    fn rope_neox(&self, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, pos: Pos) -> Result<()> {
        attention::rope_neox(x, head_dim, n_rot, theta, pos)
    }

    fn attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        pos: Pos,
        dims: AttnDims,
        scale: f32,
        out: &Tensor,
    ) -> Result<()> {
        attention::attention(q, k_cache, v_cache, pos, dims, scale, out)
    }

    fn moe_route(&self, logits: &Tensor, k: usize, scale: f32, ids: &Tensor, weights: &Tensor) -> Result<()> {
        moe::moe_route(logits, k, scale, ids, weights)
    }

    fn moe_experts(
        &self,
        x: &Tensor,
        gate_exps: &Tensor,
        up_exps: &Tensor,
        down_exps: &Tensor,
        ids: &Tensor,
        weights: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        moe::moe_experts(x, gate_exps, up_exps, down_exps, ids, weights, out)
    }

    fn argmax(&self, logits: &Tensor, out: &Tensor) -> Result<()> {
        elementwise::argmax(logits, out)
    }
}
