//! wgpu backend: WGSL compute shaders on Vulkan, Metal, DX12 (and WebGPU in the browser).
//!
//! Buffers live on the device; ops record dispatches into one open compute pass (`encoder`),
//! submitted every few dozen dispatches and when the host needs a result. Kernels are assembled
//! from `shaders-wgsl/` per (kernel, weight format) and the variants the adapter allows
//! (`caps`: subgroup reductions, cooperative matrices), compiled once and cached.

mod buffer;
pub(crate) mod caps;
mod encoder;
pub mod fuse;
mod geometry;
pub(crate) mod kernels;
mod ops;
mod options;
pub(crate) mod policy;
mod readback;
mod stream;
#[cfg(target_arch = "wasm32")]
mod web;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::{
    check, fusion, AttnDims, Backend, BackendOptions, DType, GdnDims, Pos, Precision, Rows, StepMode, Tensor,
    WeightData, WeightUpload,
};
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use caps::Caps;
use encoder::{Encoder, State};
pub use geometry::CoopTile;
use options::UserSwitches;
pub use options::{Tuning, WgpuOptions};

pub struct WgpuBackend {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    pub(crate) caps: Caps,
    graveyard: Arc<buffer::Graveyard>,
    /// Reusable host-readback staging buffers (readback.rs).
    readback: readback::Pool,
    /// Reads started ahead (`Backend::read_u32_ahead`) not yet waited for.
    ahead: Arc<AtomicUsize>,
    state: Mutex<State>,
    /// The browser reports validation errors and a lost device through callbacks, not error
    /// scopes that could be waited on: the first one is kept here and fails the next read.
    #[cfg(target_arch = "wasm32")]
    device_error: Arc<Mutex<Option<String>>>,
}

/// One read started ahead, counted in `WgpuBackend::ahead` while it lives.
struct AheadCount(Arc<AtomicUsize>);

impl AheadCount {
    fn new(n: &Arc<AtomicUsize>) -> AheadCount {
        n.fetch_add(1, Ordering::Relaxed);
        AheadCount(Arc::clone(n))
    }
}

impl Drop for AheadCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) fn gpu_err(msg: impl std::fmt::Display) -> Error {
    Error::Backend(format!("wgpu: {msg}"))
}

impl WgpuBackend {
    /// The best adapter at the exact precision (see `with_options`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<WgpuBackend> {
        WgpuBackend::with_options(&BackendOptions::default())
    }

    /// Pick the best adapter (a discrete or integrated GPU over a CPU fallback such as lavapipe;
    /// `RILL_WGPU_ADAPTER=substring` picks by name) and open a device with its full limits (as far
    /// as `opts.wgpu` leaves them) and the optional features the selected kernel variants use
    /// (`caps`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn with_options(opts: &BackendOptions) -> Result<WgpuBackend> {
        pollster::block_on(WgpuBackend::with_options_async(opts))
    }

    /// `with_options`, awaiting the adapter and the device (the browser cannot block on them;
    /// there the adapter is WebGPU's, `navigator.gpu`, also in a worker).
    pub async fn with_options_async(opts: &BackendOptions) -> Result<WgpuBackend> {
        let user = UserSwitches::from_env();
        let wo = user.apply(opts.wgpu);
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let rank = |a: &wgpu::Adapter| {
            let i = a.get_info();
            let kind = match i.device_type {
                wgpu::DeviceType::DiscreteGpu => 0,
                wgpu::DeviceType::IntegratedGpu => 1,
                wgpu::DeviceType::VirtualGpu => 2,
                wgpu::DeviceType::Other => 3,
                wgpu::DeviceType::Cpu => 4,
            };
            // Prefer Vulkan/Metal/DX12 over GL for the same device.
            let api = if i.backend == wgpu::Backend::Gl { 1 } else { 0 };
            (kind, api)
        };
        let adapter = adapters
            .into_iter()
            .filter(|a| {
                let i = a.get_info();
                user.adapter.as_ref().is_none_or(|w| i.name.to_lowercase().contains(w))
                    && a.get_downlevel_capabilities()
                        .flags
                        .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
            })
            .min_by_key(rank)
            .ok_or_else(|| {
                gpu_err(if cfg!(target_arch = "wasm32") {
                    "this browser offers no WebGPU adapter (is WebGPU or hardware acceleration turned off?)"
                } else {
                    "no GPU adapter with compute shaders found (install a Vulkan driver, e.g. mesa-vulkan-drivers)"
                })
            })?;
        let info = adapter.get_info();
        let features = caps::wanted_features(&adapter, opts.precision, &wo);
        let coop16 = caps::has_coop16(&adapter);
        let mut limits = adapter.limits();
        let caps = Caps::select(
            features,
            &limits,
            opts.precision,
            coop16,
            caps::native_dot4(&adapter),
            &wo,
        )
        .with_subgroup_sizes(info.subgroup_min_size, info.subgroup_max_size);
        // Lowered binding limits (tests) are enforced by wgpu's validation too.
        limits.max_storage_buffer_binding_size = caps.max_binding;
        limits.max_storage_buffers_per_shader_stage = caps.max_storage;
        let experimental = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            // SAFETY: the cooperative-matrix feature is experimental in wgpu 30; rill uses only the
            // 16x16 f16 -> f32 configuration the adapter lists, with the load/store forms
            // verified on the H200 (../shared/TOOLCHAIN.md) and naga's known bug avoided.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("rill"),
                required_features: features,
                required_limits: limits,
                experimental_features: experimental,
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| gpu_err(format!("cannot open {}: {e}", info.name)))?;
        #[cfg(target_arch = "wasm32")]
        let device_error = web::error_sink(&device);
        let profile = std::env::var_os("RILL_PROFILE").is_some_and(|v| v == "1");
        let state = State::new(
            &device,
            &queue,
            caps.uniform_align,
            profile,
            caps.timestamps_in_passes,
            caps.submit_every,
        );
        Ok(WgpuBackend {
            device,
            queue,
            info,
            caps,
            graveyard: Arc::default(),
            readback: readback::Pool::default(),
            ahead: Arc::default(),
            state: Mutex::new(state),
            #[cfg(target_arch = "wasm32")]
            device_error,
        })
    }

    /// The limits the device was opened with (the adapter's, as the browser reports them).
    pub fn limits(&self) -> wgpu::Limits {
        self.device.limits()
    }

    /// Exclusive access to the recorder for one op's dispatches.
    pub(crate) fn encoder(&self) -> Result<Encoder<'_>> {
        let st = self.state.lock().map_err(|_| gpu_err("recorder lock poisoned"))?;
        Ok(Encoder::new(self, st))
    }

    /// Whether a read started ahead is pending: the device may still be running the step before.
    pub(crate) fn reads_ahead_pending(&self) -> bool {
        self.ahead.load(Ordering::Relaxed) > 0
    }

    /// Whether the adapter is a CPU emulation (lavapipe, SwiftShader, WARP).
    pub fn is_cpu_adapter(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The selected kernel variants, in words.
    pub fn variants(&self) -> String {
        self.caps.describe()
    }

    /// Split `n` workgroups over x and y so that neither exceeds the per-dimension limit.
    pub(crate) fn grid(&self, n: u32) -> [u32; 2] {
        let max = self.caps.max_workgroups_per_dim;
        if n <= max {
            [n, 1]
        } else {
            [max, n.div_ceil(max)]
        }
    }

    /// Whether a weight of `ty`, `shape`, `bytes` can live and run on this device: one buffer of
    /// at most the device's largest buffer, and (when it is larger than one storage binding) rows
    /// that can be bound in pieces. Fails naming the tensor, the limit and what to do instead.
    pub(crate) fn check_weight(&self, name: &str, ty: GgmlType, shape: &[usize], bytes: u64) -> Result<()> {
        let caps = &self.caps;
        let cols = shape.last().copied().unwrap_or(1) as u64;
        let rows = shape
            .iter()
            .rev()
            .skip(1)
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64));
        let row = ty.row_size(cols);
        if row.zip(rows).and_then(|(r, n)| r.checked_mul(n)) != Some(bytes) {
            return Err(gpu_err(format!(
                "weight '{name}': {bytes} bytes do not match {ty} shape {shape:?}"
            )));
        }
        let advice = "run with --backend cpu, or on a device with larger limits";
        if bytes > caps.max_buffer {
            return Err(gpu_err(format!(
                "weight '{name}' ({bytes} bytes, {ty} {shape:?}) exceeds this device's largest buffer \
                 (max_buffer_size {} bytes): {advice}",
                caps.max_buffer
            )));
        }
        if bytes > caps.max_binding && ops::piece_rows(caps, row.unwrap_or(0)).is_none() {
            return Err(gpu_err(format!(
                "weight '{name}' ({bytes} bytes, {ty} {shape:?}) exceeds this device's storage binding \
                 limit (max_storage_buffer_binding_size {} bytes) and its rows of {} bytes cannot be \
                 bound in pieces: {advice}",
                caps.max_binding,
                row.unwrap_or(0)
            )));
        }
        Ok(())
    }
}

impl Drop for WgpuBackend {
    fn drop(&mut self) {
        if let Ok(st) = self.state.lock() {
            let r = st.profile_report();
            if !r.is_empty() {
                eprint!("{r}");
            }
        }
    }
}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn device_name(&self) -> String {
        format!(
            "{} ({:?}, {:?})",
            self.info.name, self.info.backend, self.info.device_type
        )
    }

    fn driver_info(&self) -> String {
        format!(
            "{} {}; {}",
            self.info.driver,
            self.info.driver_info,
            self.caps.describe()
        )
        .trim()
        .to_string()
    }

    fn precision(&self) -> Precision {
        self.caps.precision()
    }

    fn check_weight_fits(&self, name: &str, ggml_type: GgmlType, shape: &[usize], n_bytes: u64) -> Result<()> {
        self.check_weight(name, ggml_type, shape, n_bytes)
    }

    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        buffer::alloc(self, dtype, shape)
    }
    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        buffer::upload(self, DType::F32, shape, bytemuck::cast_slice(data), data.len())
    }
    fn upload_u32(&self, data: &[u32], shape: &[usize]) -> Result<Tensor> {
        buffer::upload(self, DType::U32, shape, bytemuck::cast_slice(data), data.len())
    }
    fn upload_weight(&self, w: &WeightData) -> Result<Tensor> {
        buffer::upload_weight(self, w)
    }
    fn begin_weight(
        &self,
        name: &str,
        ggml_type: GgmlType,
        shape: &[usize],
    ) -> Result<Option<Box<dyn WeightUpload + '_>>> {
        Ok(Some(Box::new(stream::StreamedWeight::new(
            self, name, ggml_type, shape,
        )?)))
    }
    // The browser cannot block on the device: its reads are awaited; native code keeps the
    // blocking reads (the default async reads are ready futures of them).
    #[cfg(target_arch = "wasm32")]
    fn read_f32_async<'a>(&'a self, t: &'a Tensor) -> crate::backend::ReadFuture<'a, Vec<f32>> {
        Box::pin(async move {
            check::dtype("read_f32", "t", t, DType::F32)?;
            Ok(readback::le_words(
                &readback::read_async(self, t).await?,
                f32::from_le_bytes,
            ))
        })
    }
    #[cfg(target_arch = "wasm32")]
    fn read_u32_async<'a>(&'a self, t: &'a Tensor) -> crate::backend::ReadFuture<'a, Vec<u32>> {
        Box::pin(async move {
            check::dtype("read_u32", "t", t, DType::U32)?;
            Ok(readback::le_words(
                &readback::read_async(self, t).await?,
                u32::from_le_bytes,
            ))
        })
    }
    fn read_u32_ahead(&self, t: &Tensor) -> Result<crate::backend::ReadFuture<'_, Vec<u32>>> {
        check::dtype("read_u32", "t", t, DType::U32)?;
        let pending = readback::start(self, t)?;
        // Counted until the future is done or dropped (`reads_ahead_pending`).
        let counted = AheadCount::new(&self.ahead);
        Ok(Box::pin(async move {
            let _counted = counted;
            let bytes = match pending {
                Some(p) => p.wait_async(self).await?,
                None => Vec::new(),
            };
            Ok(readback::le_words(&bytes, u32::from_le_bytes))
        }))
    }
    fn write_u32(&self, t: &Tensor, data: &[u32]) -> Result<()> {
        buffer::write(self, t, DType::U32, bytemuck::cast_slice(data), data.len())
    }
    fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        check::dtype("read_f32", "t", t, DType::F32)?;
        Ok(readback::le_words(&readback::read(self, t)?, f32::from_le_bytes))
    }
    fn read_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        check::dtype("read_u32", "t", t, DType::U32)?;
        Ok(readback::le_words(&readback::read(self, t)?, u32::from_le_bytes))
    }
    fn zero(&self, t: &Tensor) -> Result<()> {
        buffer::zero(self, t)
    }
    fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        buffer::copy(self, src, dst)
    }
    fn copy_rows(&self, src: &Tensor, src_row: usize, dst: &Tensor, dst_row: usize, n: usize) -> Result<()> {
        buffer::copy_rows(self, src, src_row, dst, dst_row, n)
    }
    fn sync(&self) -> Result<()> {
        self.encoder()?.flush();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| gpu_err(format!("device poll: {e}")))?;
        Ok(())
    }

    fn step_begin(&self, key: u64) -> Result<StepMode> {
        let replayed = self.encoder()?.step_begin(key)?;
        Ok(if replayed { StepMode::Replayed } else { StepMode::Record })
    }
    fn run_plan(&self, plan: &crate::backend::Plan<'_>) -> Result<()> {
        crate::backend::fusion::run(self, plan.ops(), fusion::Fuse::fusions(self), &mut None)
    }
    fn run_plan_listed(&self, plan: &crate::backend::Plan<'_>, launched: &mut Vec<&'static str>) -> Result<()> {
        crate::backend::fusion::run(self, plan.ops(), fusion::Fuse::fusions(self), &mut Some(launched))
    }
    fn step_end(&self, key: u64, ok: bool) -> Result<()> {
        self.encoder()?.step_end(key, ok);
        Ok(())
    }

    fn embed(&self, table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()> {
        ops::embed(self, table, ids, out)
    }
    fn matmul(&self, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
        ops::matmul(self, w, x, out)
    }
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
        ops::rms_norm(self, x, w, eps, out)
    }
    fn add_assign(&self, acc: &Tensor, x: &Tensor) -> Result<()> {
        ops::add_assign(self, acc, x)
    }
    fn swiglu(&self, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
        ops::swiglu(self, gate, up, out)
    }
    fn sigmoid_mul_assign(&self, x: &Tensor, gate: &Tensor) -> Result<()> {
        ops::sigmoid_mul_assign(self, x, gate)
    }
    fn sigmoid_scale_add(&self, acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()> {
        ops::sigmoid_scale_add(self, acc, x, gate_logit)
    }
    fn conv1d_causal_silu(&self, x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<()> {
        ops::conv1d_causal_silu(self, x, w, state, out)
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
        ops::gdn_gates(self, a, b, ssm_a, dt_bias, g_out, beta_out)
    }
    fn l2_norm_qk(&self, u: &Tensor, dims: GdnDims, eps: f32) -> Result<()> {
        ops::l2_norm_qk(self, u, dims, eps)
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
        ops::delta_rule_recurrent(self, u, g, beta, state, out, dims)
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
        ops::delta_rule_chunked(self, u, g, beta, state, out, dims)
    }
    fn gated_rms_norm(&self, x: &Tensor, z: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
        ops::gated_rms_norm(self, x, z, w, eps, out)
    }
    fn split_qgate(&self, qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<()> {
        ops::split_qgate(self, qg, head_dim, q, gate)
    }
    fn rope_neox(&self, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, pos: Pos) -> Result<()> {
        ops::rope_neox(self, x, head_dim, n_rot, theta, pos)
    }
    fn kv_store(&self, k: &Tensor, v: &Tensor, k_cache: &Tensor, v_cache: &Tensor, pos: Pos) -> Result<()> {
        ops::kv_store(self, k, v, k_cache, v_cache, pos)
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
        ops::attention(self, q, k_cache, v_cache, pos, dims, scale, out)
    }
    fn conv1d_silu_rows(&self, x: &Tensor, w: &Tensor, states: &Tensor, rows: Rows, out: &Tensor) -> Result<()> {
        ops::conv1d_silu_rows(self, x, w, states, rows, out)
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
        ops::delta_rule_rows(self, u, g, beta, states, out, dims, rows)
    }
    fn rope_neox_rows(&self, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, rows: Rows) -> Result<()> {
        ops::rope_neox_rows(self, x, head_dim, n_rot, theta, rows)
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
        ops::kv_store_rows(self, k, v, k_pool, v_pool, ctx, rows)
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
        ops::attention_rows(self, q, k_pool, v_pool, ctx, rows, dims, scale, out)
    }
    fn moe_route(&self, logits: &Tensor, k: usize, scale: f32, ids: &Tensor, weights: &Tensor) -> Result<()> {
        ops::moe_route(self, logits, k, scale, ids, weights)
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
        ops::moe_experts(self, x, gate_exps, up_exps, down_exps, ids, weights, out)
    }
    fn argmax(&self, logits: &Tensor, out: &Tensor) -> Result<()> {
        ops::argmax(self, logits, out)
    }
}

/// Shared handle for `backend::create_with`.
#[cfg(not(target_arch = "wasm32"))]
pub fn create(opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(WgpuBackend::with_options(opts)?))
}
