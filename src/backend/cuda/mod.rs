//! CUDA backend: kernels from `kernels-cuda/` (compiled by nvcc in build.rs, embedded as fatbins)
//! on one stream of the first NVIDIA GPU, through the driver API (cudarc's raw bindings).
//!
//! - Buffers are plain device allocations; weights keep their GGUF block bytes (every format the
//!   CPU backend reads) and the kernels decode them in registers.
//! - Every op is one or a few kernel launches on the stream (`launch.rs`); a decode step can be
//!   recorded and replayed as a CUDA graph (`step_begin`/`step_end`), and kernels start early
//!   under programmatic dependent launch on Hopper (they wait for their inputs in-kernel).
//! - Precision (`CudaOptions::precision`): `Exact` (the default) is f32 arithmetic on exactly
//!   dequantized weights everywhere, the strict tier; its prefill runs the chunked delta rule on
//!   the tensor cores in 3xTF32 (f32-level accuracy). `Fast` runs batches of more than a few
//!   tokens on the tensor cores in the fixtures' "f16-rounded activations" tier (rel L2 <= ~6e-3):
//!   matrix products with in-kernel dequantization on f16 activations (`ops/gemm.rs`, copies
//!   shared through `shadow.rs`), except that F16 and BF16 weights, which have no quantization
//!   error for the f16 rounding to hide behind, take the activations as two f16 terms hi + lo
//!   (f32-class: ~2^-22 relative; BF16 weights are exact in f16 for 2^-17 <= |w| <= 65504); the
//!   chunked delta rule in 3xTF32 (f32-level), flash attention on
//!   f16 q/k/v, MoE experts as grouped products. One-token steps (decode) are exact in both (Q4_K,
//!   Q6_K and Q8_0 products on the tensor cores with exact operand splits, `ops/matvec_tc.rs`; the
//!   f32 kernels for the formats and shapes those do not take).
//! - Every fused-variant and kernel-variant decision is a pure function in `policy.rs`.
//!   `RILL_CUDA_FUSION=0` (`CudaOptions::fusion`, for debugging) makes each fused decision answer
//!   "not fused": every op then runs as its own launches.
//! - `RILL_PROFILE=1` times every kernel with CUDA events and prints a per-kernel and per-phase
//!   summary at exit (steps then run unrecorded).

mod buffer;
mod driver;
pub mod fuse;
mod kernels;
mod launch;
mod op;
mod ops;
pub mod policy;
mod profile;
mod shadow;
mod workspace;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use crate::backend::fusion::{self, Fuse};
use crate::backend::{
    AttnDims, Backend, BackendOptions, DType, GdnDims, Plan, Pos, Precision, ReadFuture, Rows, StepMode, Tensor,
    WeightData,
};
use crate::error::Result;
use driver::{cuda_err, Device, Stream};
use kernels::Kernels;
use launch::{GraphCache, Recording};
use profile::Profiler;

/// State shared by the backend handle and its buffers (which free themselves through it).
pub(crate) struct Inner {
    stream: Stream,
    /// Private stream for capturing recorded steps into graphs.
    capture: Mutex<Stream>,
    kernels: Kernels,
    recordings: Mutex<HashMap<ThreadId, Recording>>,
    recording_threads: AtomicUsize,
    graphs: Mutex<GraphCache>,
    workspaces: workspace::Workspaces,
    profile: Option<Profiler>,
    pdl: AtomicBool,
    /// Dependent launch inside captured graphs (dropped if a capture with it fails).
    graph_pdl: AtomicBool,
    graphs_enabled: bool,
    /// The device facts and options every kernel-variant decision reads (`policy.rs`).
    policy: policy::Policy,
    /// f16 copies of activations (`shadow.rs`) and whether any is held.
    shadows: Mutex<shadow::Shadows>,
    shadows_live: AtomicBool,
    /// The layouts the tensor-core decode products have read from each kind of producer kernel's
    /// outputs (`ops/matvec_tc.rs`): what those kernels prepare themselves from then on.
    tc_learned: ops::matvec_tc::Learned,
    next_id: AtomicU64,
    /// Pinned landing buffers of reads started ahead (`buffer.rs`).
    ahead: Mutex<Vec<buffer::AheadSlot>>,
    /// Device scratch of the kernels whose blocks meet at a grid barrier (kernels-cuda/norm.cu
    /// `grid_barrier`: its words, then partial sums), zeroed at creation. Launches on the one
    /// stream run one after another, so one scratch serves them all.
    sync_scratch: driver::DevPtr,
    /// Declared last: dropped (the context released) after everything above.
    dev: Device,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.dev.bind().is_err() {
            return;
        }
        let _ = self.stream.sync();
        if let Ok(mut g) = self.graphs.lock() {
            *g = GraphCache::default();
        }
        self.workspaces.free_all();
        driver::mem_free(self.sync_scratch);
    }
}

/// The CUDA backend (device 0).
pub struct CudaBackend {
    inner: Arc<Inner>,
}

/// Bytes of `Inner::sync_scratch`. Its layout: the decode RMSNorm's grid barrier (one 64-bit word at 0,
/// kernels-cuda/norm.cu `grid_barrier`), the counter of norm.cu's `moe_norm_route` (one u32 at 64)
/// and the partial sums (at 128 bytes, as the kernel reads them: `SYNC_PARTIALS` floats), then the slice counters of the kernels whose last block
/// per slice prepares it (at `SYNC_COUNTERS_AT`: `SYNC_COUNTERS` words, kernels-cuda/out_prep.cuh).
pub(crate) const SYNC_SCRATCH_BYTES: usize = 4096;
const SYNC_COUNTERS_AT: usize = 1024;
/// Partial sums the RMSNorm's blocks can leave before the counters.
pub(crate) const SYNC_PARTIALS: usize = (SYNC_COUNTERS_AT - 128) / 4;
/// Slice counters.
pub(crate) const SYNC_COUNTERS: usize = (SYNC_SCRATCH_BYTES - SYNC_COUNTERS_AT) / 4;

impl Inner {
    /// The grid barrier's words and partial sums (`SYNC_SCRATCH_BYTES` above).
    pub(crate) fn sync_barrier(&self) -> driver::DevPtr {
        self.sync_scratch
    }
    /// The counter of `moe_norm_route`'s blocks (`SYNC_SCRATCH_BYTES` above).
    pub(crate) fn route_counter(&self) -> driver::DevPtr {
        self.sync_scratch + 64
    }
    /// The slice counters (`SYNC_SCRATCH_BYTES` above).
    pub(crate) fn sync_counters(&self) -> driver::DevPtr {
        self.sync_scratch + SYNC_COUNTERS_AT as u64
    }
}

/// How a CUDA backend runs its work. The defaults are what ships; `fusion` alone also reads
/// `RILL_CUDA_FUSION` (module doc).
#[derive(Debug, Clone, Copy)]
pub struct CudaOptions {
    /// Record one-token steps and replay them as CUDA graphs.
    pub graphs: bool,
    /// Programmatic dependent launch (compute capability 9.0 and newer).
    pub dependent_launch: bool,
    /// The precision tier (module doc).
    pub precision: Precision,
    /// The fused variants (`policy.rs`); off: every op in launches of its own, for debugging.
    pub fusion: bool,
}

/// `RILL_CUDA_FUSION=0` turns the fused variants off (`CudaOptions::fusion`).
fn fusion_from_env() -> bool {
    std::env::var("RILL_CUDA_FUSION").map_or(true, |v| v.trim() != "0")
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            graphs: true,
            dependent_launch: true,
            precision: Precision::Exact,
            fusion: fusion_from_env(),
        }
    }
}

/// Counters of recorded steps (tests check that replay really happens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Steps captured into graphs.
    pub recorded: u64,
    /// Steps replayed from a graph.
    pub replayed: u64,
    /// Graphs held now.
    pub cached: usize,
}

impl CudaBackend {
    /// Open the first NVIDIA GPU. Without a driver this is a clean error, never a panic.
    pub fn new() -> Result<CudaBackend> {
        Self::with_options(CudaOptions::default())
    }

    /// `new` with explicit options.
    pub fn with_options(opts: CudaOptions) -> Result<CudaBackend> {
        if !driver::driver_present() {
            return Err(cuda_err(
                "no NVIDIA driver found (libcuda could not be loaded); use --backend cpu or wgpu",
            ));
        }
        let dev = Device::open(0)?;
        let kernels = Kernels::load(dev.max_smem_optin)?;
        let profiling = std::env::var_os("RILL_PROFILE").is_some_and(|v| v == "1");
        let sync_scratch = driver::mem_alloc(SYNC_SCRATCH_BYTES)
            .map_err(|e| e.unwrap_or_else(|| cuda_err("out of GPU memory for 4 KB of sync scratch")))?;
        driver::htod_sync(sync_scratch, &[0u8; SYNC_SCRATCH_BYTES])?;
        let inner = Inner {
            stream: Stream::new()?,
            capture: Mutex::new(Stream::new()?),
            kernels,
            recordings: Mutex::new(HashMap::new()),
            recording_threads: AtomicUsize::new(0),
            graphs: Mutex::new(GraphCache::default()),
            workspaces: workspace::Workspaces::default(),
            profile: profiling.then(Profiler::new),
            // Programmatic dependent launch needs compute capability 9.0; profiling times kernels
            // one at a time, so it runs them strictly in order.
            pdl: AtomicBool::new(
                policy::Device { sms: 0, cc: dev.cc }.dependent_launch() && !profiling && opts.dependent_launch,
            ),
            graph_pdl: AtomicBool::new(true),
            graphs_enabled: !profiling && opts.graphs,
            policy: policy::Policy {
                device: policy::Device {
                    sms: dev.sms as usize,
                    cc: dev.cc,
                },
                precision: opts.precision,
                fusion: opts.fusion,
            },
            shadows: Mutex::new(shadow::Shadows::default()),
            shadows_live: AtomicBool::new(false),
            tc_learned: ops::matvec_tc::Learned::default(),
            next_id: AtomicU64::new(1),
            ahead: Mutex::new(Vec::new()),
            sync_scratch,
            dev,
        };
        Ok(CudaBackend { inner: Arc::new(inner) })
    }
}

impl CudaBackend {
    pub fn graph_stats(&self) -> GraphStats {
        self.inner.graph_stats()
    }

    /// The device facts and options this backend's kernel-variant decisions read (`policy.rs`):
    /// what a plan compiler asks the same questions with.
    pub fn policy(&self) -> policy::Policy {
        self.inner.policy
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Some(p) = &self.inner.profile {
            if self.inner.sync().is_ok() {
                let r = p.report();
                if !r.is_empty() {
                    eprint!("{r}");
                }
            }
        }
    }
}

/// Shared handle for `backend::create_with`.
pub fn create(opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(CudaBackend::with_options(CudaOptions {
        precision: opts.precision,
        ..CudaOptions::default()
    })?))
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_name(&self) -> String {
        let d = &self.inner.dev;
        format!(
            "{} (sm_{}{}, {} SMs, {:.1} GiB)",
            d.name,
            d.cc.0,
            d.cc.1,
            d.sms,
            d.total_mem as f64 / (1u64 << 30) as f64
        )
    }

    fn driver_info(&self) -> String {
        let v = self.inner.dev.driver_version;
        let on = |b: bool| if b { "on" } else { "off" };
        format!(
            "CUDA driver {}.{}, graphs {}, dependent launch {}, fusion {}, {} kernel modules",
            v / 1000,
            (v % 1000) / 10,
            on(self.inner.graphs_enabled),
            on(self.inner.pdl.load(std::sync::atomic::Ordering::Relaxed)),
            on(self.inner.policy.fusion),
            self.inner.kernels.module_names().len()
        )
    }

    fn precision(&self) -> Precision {
        if self.inner.policy.precision == Precision::Fast {
            Precision::Fast
        } else {
            Precision::Exact
        }
    }

    fn memory_available(&self) -> Option<u64> {
        self.inner.dev.mem_info().ok().map(|m| m.0)
    }

    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        self.inner.alloc(dtype, shape)
    }
    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        self.inner
            .upload(DType::F32, shape, bytemuck::cast_slice(data), data.len())
    }
    fn upload_u32(&self, data: &[u32], shape: &[usize]) -> Result<Tensor> {
        self.inner
            .upload(DType::U32, shape, bytemuck::cast_slice(data), data.len())
    }
    fn upload_weight(&self, w: &WeightData) -> Result<Tensor> {
        self.inner.upload_weight(w)
    }
    fn write_u32(&self, t: &Tensor, data: &[u32]) -> Result<()> {
        self.inner.write(t, DType::U32, bytemuck::cast_slice(data), data.len())
    }
    fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        let b = self.inner.read(t, DType::F32)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    fn read_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        let b = self.inner.read(t, DType::U32)?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    fn read_f32_async<'a>(&'a self, t: &'a Tensor) -> ReadFuture<'a, Vec<f32>> {
        Box::pin(std::future::ready(self.read_f32(t)))
    }
    fn read_u32_async<'a>(&'a self, t: &'a Tensor) -> ReadFuture<'a, Vec<u32>> {
        Box::pin(std::future::ready(self.read_u32(t)))
    }
    fn read_u32_ahead(&self, t: &Tensor) -> Result<ReadFuture<'_, Vec<u32>>> {
        let started = self.inner.read_ahead(t, DType::U32)?;
        Ok(Box::pin(async move {
            let b = self.inner.finish_ahead(started)?;
            Ok(b.chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        }))
    }
    fn zero(&self, t: &Tensor) -> Result<()> {
        self.inner.zero(t)
    }
    fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.inner.copy(src, dst)
    }
    fn copy_rows(&self, src: &Tensor, src_row: usize, dst: &Tensor, dst_row: usize, n: usize) -> Result<()> {
        self.inner.copy_rows(src, src_row, dst, dst_row, n)
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }

    fn step_begin(&self, key: u64) -> Result<StepMode> {
        self.inner.step_begin(key)
    }
    fn step_end(&self, key: u64, ok: bool) -> Result<()> {
        self.inner.step_end(key, ok)
    }
    fn run_plan(&self, plan: &Plan<'_>) -> Result<()> {
        fusion::run(self, plan.ops(), self.fusions(), &mut None)
    }
    fn run_plan_listed(&self, plan: &Plan<'_>, launched: &mut Vec<&'static str>) -> Result<()> {
        fusion::run(self, plan.ops(), self.fusions(), &mut Some(launched))
    }

    fn embed(&self, table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()> {
        ops::linear::embed(&self.inner, table, ids, out)
    }
    fn matmul(&self, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
        ops::linear::matmul(&self.inner, w, x, out)
    }
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
        ops::norm::rms_norm(&self.inner, x, w, eps, out)
    }
    fn add_assign(&self, acc: &Tensor, x: &Tensor) -> Result<()> {
        ops::eltwise::add_assign(&self.inner, acc, x)
    }
    fn swiglu(&self, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
        ops::eltwise::swiglu(&self.inner, gate, up, out)
    }
    fn sigmoid_mul_assign(&self, x: &Tensor, gate: &Tensor) -> Result<()> {
        ops::norm::sigmoid_mul_assign(&self.inner, x, gate)
    }
    fn sigmoid_scale_add(&self, acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()> {
        ops::eltwise::sigmoid_scale_add(&self.inner, acc, x, gate_logit)
    }
    fn conv1d_causal_silu(&self, x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<()> {
        ops::conv::conv1d_causal_silu(&self.inner, x, w, state, out)
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
        ops::eltwise::gdn_gates(&self.inner, a, b, ssm_a, dt_bias, g_out, beta_out)
    }
    fn l2_norm_qk(&self, u: &Tensor, dims: GdnDims, eps: f32) -> Result<()> {
        ops::norm::l2_norm_qk(&self.inner, u, dims, eps)
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
        ops::delta::delta_rule(&self.inner, "delta_rule_recurrent", u, g, beta, state, out, dims)
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
        ops::delta::delta_rule(&self.inner, "delta_rule_chunked", u, g, beta, state, out, dims)
    }
    fn gated_rms_norm(&self, x: &Tensor, z: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
        ops::norm::gated_rms_norm(&self.inner, x, z, w, eps, out)
    }
    fn split_qgate(&self, qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<()> {
        ops::eltwise::split_qgate(&self.inner, qg, head_dim, q, gate)
    }
    fn rope_neox(&self, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, pos: Pos) -> Result<()> {
        ops::attention::rope_neox(&self.inner, x, head_dim, n_rot, theta, pos)
    }
    fn kv_store(&self, k: &Tensor, v: &Tensor, k_cache: &Tensor, v_cache: &Tensor, pos: Pos) -> Result<()> {
        ops::attention::kv_store(&self.inner, k, v, k_cache, v_cache, pos)
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
        ops::attention::attention(&self.inner, q, k_cache, v_cache, pos, dims, scale, out)
    }
    fn records_rows(&self, b: usize) -> bool {
        // The row ops (ops/rows.rs) read the rows on the device; the products decide.
        self.inner.policy.record_rows(b)
    }
    fn conv1d_silu_rows(&self, x: &Tensor, w: &Tensor, states: &Tensor, rows: Rows, out: &Tensor) -> Result<()> {
        ops::rows::conv1d_silu(&self.inner, x, w, states, rows, out)
    }
    fn delta_rule_rows(
        &self,
        u: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        states: &Tensor,
        out: &Tensor,
        dims: GdnDims,
        rows: Rows,
    ) -> Result<()> {
        ops::rows::delta_rule(&self.inner, u, g, beta, states, out, dims, rows)
    }
    fn rope_neox_rows(&self, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, rows: Rows) -> Result<()> {
        ops::rows::rope_neox(&self.inner, x, head_dim, n_rot, theta, rows)
    }
    fn kv_store_rows(
        &self,
        k: &Tensor,
        v: &Tensor,
        k_pool: &Tensor,
        v_pool: &Tensor,
        ctx: usize,
        rows: Rows,
    ) -> Result<()> {
        ops::rows::kv_store(&self.inner, k, v, k_pool, v_pool, ctx, rows)
    }
    fn attention_rows(
        &self,
        q: &Tensor,
        k_pool: &Tensor,
        v_pool: &Tensor,
        ctx: usize,
        rows: Rows,
        dims: AttnDims,
        scale: f32,
        out: &Tensor,
    ) -> Result<()> {
        ops::rows::attention(&self.inner, q, k_pool, v_pool, ctx, rows, dims, scale, out)
    }
    fn moe_route(&self, logits: &Tensor, k: usize, scale: f32, ids: &Tensor, weights: &Tensor) -> Result<()> {
        ops::moe::moe_route(&self.inner, logits, k, scale, ids, weights)
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
        ops::linear::moe_experts(&self.inner, x, gate_exps, up_exps, down_exps, ids, weights, out)
    }
    fn argmax(&self, logits: &Tensor, out: &Tensor) -> Result<()> {
        ops::eltwise::argmax(&self.inner, logits, out)
    }
}
