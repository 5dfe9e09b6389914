//! wgpu backend: WGSL compute shaders on Vulkan, Metal, DX12 (and WebGPU in the browser).
//!
//! Buffers live on the device; ops are recorded into one command encoder and submitted when the
//! host needs a result (`read_*`, `sync`) or the per-submission parameter arena is full. Each op
//! is one dispatch of a shader from `shaders-wgsl/` (one file per op; weight formats are spliced in
//! from `dequant_<type>.wgsl`), compiled once per (shader, variant) and cached.

mod buffer;
mod ops;
mod pipelines;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::{check, AttnDims, Backend, DType, GdnDims, Pos, ReadFuture, Tensor, WeightData, WeightUpload};
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use pipelines::PipelineCache;

/// Parameter block per dispatch: one aligned slot of a per-submission uniform arena.
const PARAM_SLOT: u64 = 256;
/// Dispatches per submission before the arena is flushed.
const PARAM_SLOTS: u64 = 1024;

/// Recording state: the open encoder and the parameter arena of the current submission.
struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    params: Vec<u8>,
}

/// Per-shader wall time when `RILL_PROFILE=1` (every dispatch is then submitted and waited for,
/// so the totals are exclusive but the run is slower). Printed to stderr when the backend drops.
#[derive(Default)]
struct Profile {
    on: bool,
    by_shader: HashMap<String, (u64, f64)>,
}

pub struct WgpuBackend {
    profile: Mutex<Profile>,
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    pipelines: PipelineCache,
    param_buf: wgpu::Buffer,
    /// Reused host-readback staging buffer (see `buffer::read_async`).
    readback: Mutex<Option<wgpu::Buffer>>,
    /// The browser reports validation errors and a lost device through callbacks, not error
    /// scopes that could be waited on: the first one is kept here and fails the next read.
    #[cfg(target_arch = "wasm32")]
    device_error: Arc<Mutex<Option<String>>>,
    /// Ops' persistent intermediates by slot name (see `buffer::scratch`).
    scratch: Mutex<HashMap<&'static str, Arc<buffer::WgpuBuffer>>>,
    rec: Mutex<Recorder>,
}

pub(crate) fn gpu_err(msg: impl std::fmt::Display) -> Error {
    Error::Backend(format!("wgpu: {msg}"))
}

/// Keep the first uncaptured error and the loss of the device, which the browser reports
/// through callbacks (natively wgpu's default handler panics on an uncaptured error instead).
#[cfg(target_arch = "wasm32")]
fn web_error_sink(device: &wgpu::Device) -> Arc<Mutex<Option<String>>> {
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

impl WgpuBackend {
    /// Pick the best adapter (a discrete or integrated GPU over a CPU fallback such as lavapipe;
    /// `RILL_WGPU_ADAPTER=substring` picks by name) and open a device with its full limits.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<WgpuBackend> {
        pollster::block_on(Self::new_async())
    }

    /// `new`, awaiting the adapter and the device (the browser cannot block on them). In the
    /// browser the adapter is WebGPU's (`navigator.gpu`, also in a worker).
    pub async fn new_async() -> Result<WgpuBackend> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let want = std::env::var("RILL_WGPU_ADAPTER").ok().map(|s| s.to_lowercase());
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
                want.as_ref().is_none_or(|w| i.name.to_lowercase().contains(w))
                    && a.get_downlevel_capabilities()
                        .flags
                        .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
            })
            .min_by_key(rank)
            .ok_or_else(|| {
                if cfg!(target_arch = "wasm32") {
                    gpu_err("this browser offers no WebGPU adapter (is WebGPU or hardware acceleration turned off?)")
                } else {
                    gpu_err(
                        "no GPU adapter with compute shaders found (install a Vulkan driver, e.g. mesa-vulkan-drivers)",
                    )
                }
            })?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("rill"),
                required_features: wgpu::Features::empty(),
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| gpu_err(format!("cannot open {}: {e}", info.name)))?;
        #[cfg(target_arch = "wasm32")]
        let device_error = web_error_sink(&device);
        let param_buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: PARAM_SLOT * PARAM_SLOTS,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(WgpuBackend {
            profile: Mutex::new(Profile {
                on: std::env::var_os("RILL_PROFILE").is_some_and(|v| v == "1"),
                ..Default::default()
            }),
            pipelines: PipelineCache::new(),
            device,
            queue,
            info,
            limits,
            param_buf,
            readback: Mutex::new(None),
            #[cfg(target_arch = "wasm32")]
            device_error,
            scratch: Mutex::new(HashMap::new()),
            rec: Mutex::new(Recorder {
                encoder: None,
                params: Vec::new(),
            }),
        })
    }

    /// The adapter's limits, which the device was opened with.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The first device error the browser reported, if any (see `device_error`).
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn check_device_error(&self) -> Result<()> {
        match self.device_error.lock().ok().and_then(|e| e.clone()) {
            Some(e) => Err(gpu_err(e)),
            None => Ok(()),
        }
    }

    fn recorder(&self) -> Result<std::sync::MutexGuard<'_, Recorder>> {
        self.rec.lock().map_err(|_| gpu_err("recorder lock poisoned"))
    }

    /// Submit everything recorded so far (params first, then the commands).
    fn flush_locked(&self, rec: &mut Recorder) {
        if let Some(enc) = rec.encoder.take() {
            if !rec.params.is_empty() {
                self.queue.write_buffer(&self.param_buf, 0, &rec.params);
            }
            self.queue.submit([enc.finish()]);
        }
        rec.params.clear();
    }

    fn encoder<'a>(&self, rec: &'a mut Recorder) -> &'a mut wgpu::CommandEncoder {
        rec.encoder.get_or_insert_with(|| {
            self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("rill ops"),
            })
        })
    }

    /// Record one dispatch of `shader` (file stem in `shaders-wgsl/`) in `variant` (a weight type
    /// name such as `q4_k`, or "" for none). `params` fill the shader's uniform `P` (binding 0);
    /// `bindings` are the storage buffers at bindings 1, 2, ... in order.
    pub(crate) fn dispatch(
        &self,
        shader: &str,
        variant: &str,
        params: &[u32],
        bindings: &[&Tensor],
        workgroups: [u32; 3],
    ) -> Result<()> {
        self.batch()?.dispatch(shader, variant, params, bindings, workgroups)
    }

    /// Exclusive access to the recorder for a sequence of dispatches that must not interleave
    /// with other threads' ops (an op whose dispatches share the backend's scratch buffers).
    pub(crate) fn batch(&self) -> Result<Batch<'_>> {
        Ok(Batch {
            be: self,
            rec: self.recorder()?,
        })
    }
    /// Whether the adapter is a CPU emulation (lavapipe, SwiftShader, WARP).
    pub fn is_cpu_adapter(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Split `n` workgroups over x and y so that neither exceeds the per-dimension limit.
    /// Shaders recover the linear index as `wg.x + wg.y * nwg.x`.
    pub(crate) fn grid(&self, n: u32) -> [u32; 2] {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        if n <= max {
            [n, 1]
        } else {
            [max, n.div_ceil(max)]
        }
    }
}

/// Dispatches recorded under one hold of the recorder lock (`WgpuBackend::batch`).
pub(crate) struct Batch<'a> {
    be: &'a WgpuBackend,
    rec: std::sync::MutexGuard<'a, Recorder>,
}

impl Batch<'_> {
    /// See `WgpuBackend::dispatch`.
    pub(crate) fn dispatch(
        &mut self,
        shader: &str,
        variant: &str,
        params: &[u32],
        bindings: &[&Tensor],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let be = self.be;
        if workgroups.contains(&0) {
            return Ok(());
        }
        let max = be.limits.max_compute_workgroups_per_dimension;
        if workgroups.iter().any(|&w| w > max) {
            return Err(gpu_err(format!(
                "{shader}: dispatch {workgroups:?} exceeds {max} per dimension"
            )));
        }
        if params.len() * 4 > PARAM_SLOT as usize {
            return Err(gpu_err(format!("{shader}: too many parameters")));
        }
        let pipeline = be.pipelines.get(&be.device, shader, variant)?;
        let mut bufs = Vec::with_capacity(bindings.len());
        for t in bindings {
            let b = buffer::get(t)?;
            if b.size > be.limits.max_storage_buffer_binding_size {
                return Err(gpu_err(format!(
                    "{shader}: a buffer of {} bytes exceeds this device's storage binding limit of {} bytes",
                    b.size, be.limits.max_storage_buffer_binding_size
                )));
            }
            bufs.push(b);
        }
        let rec = &mut *self.rec;
        if rec.params.len() as u64 >= PARAM_SLOT * PARAM_SLOTS {
            be.flush_locked(rec);
        }
        let offset = rec.params.len() as u64;
        let mut slot = [0u8; PARAM_SLOT as usize];
        for (i, w) in params.iter().enumerate() {
            slot[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        rec.params.extend_from_slice(&slot);
        let layout = pipeline.get_bind_group_layout(0);
        let mut entries = Vec::with_capacity(bufs.len() + 1);
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &be.param_buf,
                offset,
                size: wgpu::BufferSize::new(PARAM_SLOT),
            }),
        });
        for (i, b) in bufs.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.buffer.as_entire_binding(),
            });
        }
        let bg = be.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(shader),
            layout: &layout,
            entries: &entries,
        });
        let enc = be.encoder(rec);
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(shader),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        drop(pass);
        if be.profile.lock().is_ok_and(|p| p.on) {
            let t0 = std::time::Instant::now();
            be.flush_locked(rec);
            be.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| gpu_err(format!("device poll: {e}")))?;
            let dt = t0.elapsed().as_secs_f64();
            if let Ok(mut p) = be.profile.lock() {
                let e = p.by_shader.entry(format!("{shader}/{variant}")).or_default();
                e.0 += 1;
                e.1 += dt;
            }
        }
        Ok(())
    }
}

impl Drop for WgpuBackend {
    fn drop(&mut self) {
        if let Ok(p) = self.profile.lock() {
            if p.on && !p.by_shader.is_empty() {
                let mut v: Vec<_> = p.by_shader.iter().collect();
                v.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
                let total: f64 = v.iter().map(|e| e.1 .1).sum();
                eprintln!("wgpu profile ({total:.3} s in dispatches):");
                for (name, (n, t)) in v {
                    eprintln!(
                        "  {name:<32} {n:>8} dispatches {t:>9.4} s {:>5.1}%",
                        100.0 * t / total.max(1e-12)
                    );
                }
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
        format!("{} {}", self.info.driver, self.info.driver_info)
            .trim()
            .to_string()
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
        Ok(Some(Box::new(buffer::StreamedWeight::new(
            self, name, ggml_type, shape,
        )?)))
    }
    fn write_u32(&self, t: &Tensor, data: &[u32]) -> Result<()> {
        buffer::write(self, t, DType::U32, bytemuck::cast_slice(data), data.len())
    }
    fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        check::dtype("read_f32", "t", t, DType::F32)?;
        Ok(buffer::words(&buffer::read(self, t)?, f32::from_le_bytes))
    }
    fn read_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        check::dtype("read_u32", "t", t, DType::U32)?;
        Ok(buffer::words(&buffer::read(self, t)?, u32::from_le_bytes))
    }
    fn read_f32_async<'a>(&'a self, t: &'a Tensor) -> ReadFuture<'a, Vec<f32>> {
        Box::pin(async move {
            check::dtype("read_f32", "t", t, DType::F32)?;
            Ok(buffer::words(&buffer::read_async(self, t).await?, f32::from_le_bytes))
        })
    }
    fn read_u32_async<'a>(&'a self, t: &'a Tensor) -> ReadFuture<'a, Vec<u32>> {
        Box::pin(async move {
            check::dtype("read_u32", "t", t, DType::U32)?;
            Ok(buffer::words(&buffer::read_async(self, t).await?, u32::from_le_bytes))
        })
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
        let mut rec = self.recorder()?;
        self.flush_locked(&mut rec);
        drop(rec);
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| gpu_err(format!("device poll: {e}")))?;
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

/// Shared handle for `backend::create`.
#[cfg(not(target_arch = "wasm32"))]
pub fn create() -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(WgpuBackend::new()?))
}
