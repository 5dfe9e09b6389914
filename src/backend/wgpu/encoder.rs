//! Recording dispatches cheaply: the per-dispatch work in the token loop is a hash lookup of the
//! pipeline and of the bind group, 64 bytes of parameters copied into an arena, and three pass
//! commands.
//!
//! * One compute pass stays open across ops; it ends only for a copy or clear, a host access,
//!   or a submission. A submission goes out every `Caps::submit_every` dispatches so the GPU starts
//!   while the CPU records the rest of the step.
//! * Pipelines are keyed by `(Kernel, format)`, bind groups by the pipeline and the (buffer id,
//!   offset, size) of every binding: the scratch, state and weight buffers of a decode step are
//!   the same every token, so after the first token no bind group is created.
//! * Per-op parameters live in one uniform arena, bound with a dynamic offset (a parameter change
//!   never needs a new bind group).
//! * Steps the executor marks (`Backend::step_begin`) are recorded as resolved dispatches; the
//!   next call with the same key re-encodes them without running any op code.
//! * `RILL_PROFILE=1`: GPU timestamps between the dispatches of one pass where the adapter has
//!   `TIMESTAMP_QUERY_INSIDE_PASSES` (honest per-kernel time), else a submit-and-wait wall clock
//!   per dispatch (mostly submission overhead; said so in the report).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, MutexGuard};

use super::buffer::{self, WgpuBuffer};
use super::kernels::{self, Kernel, Slot, PARAM_BYTES};
use super::{gpu_err, WgpuBackend};
use crate::backend::{DType, Tensor};
use crate::error::Result;
use crate::gguf::GgmlType;

/// Parameter slots in the arena: a submission holds at most `Caps::submit_every` dispatches.
const PARAM_SLOTS: u64 = super::caps::SUBMIT_EVERY_MAX as u64;
/// Most storage bindings of one kernel (`attn_qk_prep`'s; `caps` runs a kernel only where the
/// adapter allows its count).
const MAX_BINDS: usize = super::geometry::PREP_BINDINGS as usize;
/// Recorded steps kept (a few sessions x head variants).
const MAX_STEPS: usize = 16;
/// Most timestamps per submission when profiling.
const MAX_QUERIES: u32 = 256;

/// FxHash: the keys here are a few integers, hashed on every dispatch.
#[derive(Default, Clone, Copy)]
pub(crate) struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// A storage binding: a whole tensor, or a byte range of its buffer (a piece of a weight).
#[derive(Clone, Copy)]
pub(crate) struct Bind<'a> {
    t: &'a Tensor,
    range: Option<(u64, u64)>,
}

impl<'a> From<&'a Tensor> for Bind<'a> {
    fn from(t: &'a Tensor) -> Self {
        Bind { t, range: None }
    }
}

impl<'a> Bind<'a> {
    /// Bytes `offset..offset + size` of `t`'s buffer.
    pub fn range(t: &'a Tensor, offset: u64, size: u64) -> Self {
        Bind {
            t,
            range: Some((offset, size)),
        }
    }
}

/// A compiled kernel with its explicit layout.
pub(crate) struct Pipe {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    /// Storage bindings 1.. (binding 0 is the parameter block).
    storage: Vec<Slot>,
    /// Dense index: profile totals and bind-group keys.
    index: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct BgKey {
    pipe: u32,
    n: u8,
    /// (buffer id, offset, size) per storage binding.
    b: [[u64; 3]; MAX_BINDS],
}

/// A norm's or `matvec_swiglu_xq`'s output and its int8 planes for the packed-dot products
/// (lib_norm_dot.wgsl, matvec_swiglu_xq.wgsl), written by the same dispatch: a product of that output binds the planes and skips `mv_dot_prep`. Both are
/// clones, so neither buffer (nor its id) is freed while this is held.
struct DotX {
    out: Tensor,
    xq: Tensor,
}

impl DotX {
    /// Whether `id` may be one of the two buffers (a write to either makes the planes stale); a
    /// tensor whose buffer cannot be looked up counts as a match.
    fn names(&self, id: u64) -> bool {
        [&self.out, &self.xq]
            .iter()
            .any(|t| buffer::get(t).map_or(true, |b| b.id == id))
    }
}

/// One dispatch as recorded for a step replay.
struct Recorded {
    pipe: Arc<Pipe>,
    bg: wgpu::BindGroup,
    params: [u32; (PARAM_BYTES / 4) as usize],
    wg: [u32; 3],
    weight_bytes: u64,
}

struct Step {
    dispatches: Vec<Recorded>,
    /// Ids of every buffer the step binds (a dropped one invalidates it).
    ids: Vec<u64>,
}

/// The step being recorded. Only the recording thread's dispatches belong to it: another
/// thread's ops on the same backend (another model, a test) are encoded but not recorded.
struct Active {
    key: u64,
    thread: std::thread::ThreadId,
    step: Step,
    /// Still replayable (no copy, clear or host access happened inside it).
    replayable: bool,
}

impl Active {
    fn mine(&mut self) -> Option<&mut Active> {
        (self.thread == std::thread::current().id()).then_some(self)
    }
}

#[derive(Default)]
struct Steps {
    active: Option<Active>,
    done: FxMap<u64, Step>,
    order: VecDeque<u64>,
}

struct Timestamps {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    period_ns: f64,
}

/// A kernel's profile: dispatches, GPU seconds, and the bytes of the weights its matrix-vector
/// dispatches read (each weight byte once: the GB/s column).
#[derive(Default, Clone, Copy)]
struct Total {
    n: u64,
    secs: f64,
    weight_bytes: u64,
}

#[derive(Default)]
pub(crate) struct Profiler {
    on: bool,
    ts: Option<Timestamps>,
    /// Pipe index and weight bytes of each dispatch since the pass's first timestamp.
    pending: Vec<(u32, u64)>,
    /// Per pipe index.
    totals: Vec<Total>,
}

/// Everything the recorder owns, behind the backend's one lock.
pub(crate) struct State {
    pipes: FxMap<(Kernel, Option<GgmlType>), Arc<Pipe>>,
    labels: Vec<String>,
    bind_groups: FxMap<BgKey, wgpu::BindGroup>,
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    params: Vec<u8>,
    param_buf: wgpu::Buffer,
    param_stride: u64,
    in_submit: u32,
    /// Dispatches after which the open submission goes: `submit_every`, or
    /// `Caps::submit_first` from a step's start to its first submission.
    submit_at: u32,
    /// Dispatches per submission now: `Caps::submit_every`, or `Caps::submit_ahead` inside a step
    /// that started while a read started ahead was pending (the device still busy).
    submit_every: u32,
    /// Ops' persistent intermediates by slot name (`Encoder::scratch`).
    scratch: HashMap<&'static str, Arc<WgpuBuffer>>,
    /// The norm output whose packed-dot planes are current (`Encoder::set_dot_x`).
    dot_x: Option<DotX>,
    profile: Profiler,
    steps: Steps,
}

impl State {
    pub fn new(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        uniform_align: u64,
        profile: bool,
        timestamps: bool,
        submit_every: u32,
    ) -> State {
        let param_stride = PARAM_BYTES.div_ceil(uniform_align) * uniform_align;
        let param_buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: param_stride * PARAM_SLOTS,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let ts = (profile && timestamps).then(|| {
            let bytes = u64::from(MAX_QUERIES) * 8;
            Timestamps {
                set: device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: MAX_QUERIES,
                }),
                resolve: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("profile resolve"),
                    size: bytes,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }),
                read: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("profile read"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                period_ns: f64::from(queue.get_timestamp_period()),
            }
        });
        State {
            pipes: FxMap::default(),
            labels: Vec::new(),
            bind_groups: FxMap::default(),
            encoder: None,
            pass: None,
            params: Vec::with_capacity((param_stride * PARAM_SLOTS) as usize),
            param_buf,
            param_stride,
            in_submit: 0,
            submit_at: submit_every,
            submit_every,
            scratch: HashMap::new(),
            dot_x: None,
            profile: Profiler {
                on: profile,
                ts,
                ..Default::default()
            },
            steps: Steps::default(),
        }
    }

    /// The per-kernel profile, longest first (empty when profiling is off).
    pub fn profile_report(&self) -> String {
        let p = &self.profile;
        if !p.on || p.totals.iter().all(|t| t.n == 0) {
            return String::new();
        }
        let mut v: Vec<(&str, Total)> = p
            .totals
            .iter()
            .enumerate()
            .filter(|(_, t)| t.n > 0)
            .map(|(i, t)| (self.labels.get(i).map_or("?", |s| s.as_str()), *t))
            .collect();
        v.sort_by(|a, b| b.1.secs.total_cmp(&a.1.secs));
        let total: f64 = v.iter().map(|e| e.1.secs).sum();
        let how = if p.ts.is_some() {
            "GPU timestamps between dispatches of one pass"
        } else {
            "wall clock of a submit-and-wait per dispatch: mostly submission overhead"
        };
        let mut s = format!("wgpu profile ({total:.4} s in dispatches; {how}):\n");
        for (name, t) in v {
            let gbs = if t.weight_bytes > 0 {
                format!(
                    " {:>7.0} GB/s of weights",
                    t.weight_bytes as f64 / t.secs.max(1e-12) / 1e9
                )
            } else {
                String::new()
            };
            s.push_str(&format!(
                "  {name:<36} {:>8} dispatches {:>9.4} s {:>5.1}% {:>9.1} us each{gbs}\n",
                t.n,
                t.secs,
                100.0 * t.secs / total.max(1e-12),
                1e6 * t.secs / t.n as f64
            ));
        }
        s
    }
}

/// Exclusive access to the recorder (one lock per op, however many dispatches it records).
pub(crate) struct Encoder<'a> {
    pub(crate) be: &'a WgpuBackend,
    st: MutexGuard<'a, State>,
}

impl<'a> Encoder<'a> {
    pub fn new(be: &'a WgpuBackend, st: MutexGuard<'a, State>) -> Self {
        let mut e = Encoder { be, st };
        e.bury();
        e
    }

    /// Forget bind groups and recorded steps that name a dropped buffer.
    fn bury(&mut self) {
        let dead = self.be.graveyard.take();
        if dead.is_empty() {
            return;
        }
        let dead: std::collections::HashSet<u64, BuildHasherDefault<Fx>> = dead.into_iter().collect();
        self.st
            .bind_groups
            .retain(|k, _| k.b[..k.n as usize].iter().all(|b| !dead.contains(&b[0])));
        let steps = &mut self.st.steps;
        steps.done.retain(|_, s| s.ids.iter().all(|id| !dead.contains(id)));
        let done = &steps.done;
        steps.order.retain(|k| done.contains_key(k));
    }

    /// Split `n` workgroups over x and y so that neither exceeds the per-dimension limit.
    /// Shaders recover the linear index as `wg.x + wg.y * nwg.x`.
    pub fn grid(&self, n: u32) -> [u32; 2] {
        self.be.grid(n)
    }

    /// The command encoder for a copy or clear (ends the open compute pass).
    pub fn commands(&mut self) -> &mut wgpu::CommandEncoder {
        self.end_pass();
        // A copy or clear may write the norm output or its planes.
        self.st.dot_x = None;
        if let Some(a) = self.st.steps.active.as_mut().and_then(Active::mine) {
            a.replayable = false; // a step with copies is not replayed
        }
        let dev = &self.be.device;
        self.st
            .encoder
            .get_or_insert_with(|| dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("rill") }))
    }

    /// The host is about to read or write a buffer: a step in progress cannot be replayed.
    pub fn host_access(&mut self) {
        // A host write may overwrite the norm output.
        self.st.dot_x = None;
        if let Some(a) = self.st.steps.active.as_mut().and_then(Active::mine) {
            a.replayable = false;
        }
    }

    fn end_pass(&mut self) {
        if self.st.pass.take().is_some() && self.st.profile.on && !self.st.profile.pending.is_empty() {
            // Timestamps are resolved per submission: one pass per submission while profiling.
            self.flush();
        }
    }

    /// Submit everything recorded so far (the parameter arena first, then the commands).
    pub fn flush(&mut self) {
        self.submit();
    }

    /// `flush`, returning the submission's index (`None` when nothing was pending).
    pub fn submit(&mut self) -> Option<wgpu::SubmissionIndex> {
        self.st.pass = None;
        let st = &mut *self.st;
        st.submit_at = st.submit_every;
        let Some(mut enc) = st.encoder.take() else {
            st.params.clear();
            st.in_submit = 0;
            return None;
        };
        let n_ts = if st.profile.pending.is_empty() {
            0
        } else {
            st.profile.pending.len() as u32 + 1
        };
        if let (Some(ts), true) = (st.profile.ts.as_ref(), n_ts > 0) {
            enc.resolve_query_set(&ts.set, 0..n_ts, &ts.resolve, 0);
            enc.copy_buffer_to_buffer(&ts.resolve, 0, &ts.read, 0, u64::from(n_ts) * 8);
        }
        if !st.params.is_empty() {
            self.be.queue.write_buffer(&st.param_buf, 0, &st.params);
        }
        let index = self.be.queue.submit([enc.finish()]);
        st.params.clear();
        st.in_submit = 0;
        if n_ts > 0 {
            collect_timestamps(self.be, &mut st.profile, n_ts);
        }
        Some(index)
    }

    fn pipe(&mut self, kernel: Kernel, fmt: Option<GgmlType>) -> Result<Arc<Pipe>> {
        if let Some(p) = self.st.pipes.get(&(kernel, fmt)) {
            return Ok(Arc::clone(p));
        }
        let be = self.be;
        let caps = &be.caps;
        let label = kernels::label(kernel, fmt, caps);
        let src = kernels::source(kernel, fmt, caps)?;
        let slots = kernels::bindings(&src)?;
        if slots.first() != Some(&Slot::Uniform) || slots[1..].contains(&Slot::Uniform) {
            return Err(gpu_err(format!("{label}: binding 0 must be the only uniform")));
        }
        let most = MAX_BINDS.min(caps.max_storage as usize);
        if slots.len() - 1 > most {
            return Err(gpu_err(format!("{label}: more than {most} storage bindings")));
        }
        let entries: Vec<wgpu::BindGroupLayoutEntry> = slots
            .iter()
            .enumerate()
            .map(|(i, s)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match s {
                        Slot::Uniform => wgpu::BufferBindingType::Uniform,
                        Slot::Read => wgpu::BufferBindingType::Storage { read_only: true },
                        Slot::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                    },
                    has_dynamic_offset: *s == Slot::Uniform,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let dev = &be.device;
        // Natively a compile error is caught here; the browser cannot wait for an error scope,
        // so there it reaches the device's error callback and fails the next read.
        #[cfg(not(target_arch = "wasm32"))]
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        #[cfg(not(target_arch = "wasm32"))]
        let t0 = std::time::Instant::now();
        let layout = dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(&label),
            entries: &entries,
        });
        let pl = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(&label),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        };
        let module = if be.caps.shader_checks {
            dev.create_shader_module(desc)
        } else {
            // SAFETY: the kernels are this crate's own WGSL (`kernels.rs`): every loop is bounded
            // by its parameters and every index is in range by construction, which the op tests
            // check against the CPU reference with and without naga's checks (caps.rs).
            unsafe { dev.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        };
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(&pl),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[],
                // Every kernel writes its workgroup memory before reading it.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(gpu_err(format!("shader {label} failed to compile: {e}")));
        }
        // Profiling: each pipeline's creation time too. Drivers that compile lazily (lavapipe
        // runs LLVM at the first dispatch) show the rest in the profile's first dispatch.
        #[cfg(not(target_arch = "wasm32"))]
        if self.st.profile.on {
            eprintln!(
                "rill wgpu: compiled {label} in {:.0} ms",
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        let st = &mut *self.st;
        let p = Arc::new(Pipe {
            pipeline,
            layout,
            storage: slots[1..].to_vec(),
            index: st.labels.len() as u32,
        });
        st.labels.push(label);
        st.profile.totals.push(Total::default());
        st.pipes.insert((kernel, fmt), Arc::clone(&p));
        Ok(p)
    }

    /// Record one dispatch of `kernel` (in weight format `fmt` for kernels that read weights).
    /// `params` fill the shader's uniform `P` (binding 0); `binds` are the storage bindings
    /// 1, 2, ... in order.
    pub fn run(
        &mut self,
        kernel: Kernel,
        fmt: Option<GgmlType>,
        params: &[u32],
        binds: &[Bind<'_>],
        workgroups: [u32; 3],
    ) -> Result<()> {
        if workgroups.contains(&0) {
            return Ok(());
        }
        let pipe = self.pipe(kernel, fmt)?;
        let caps = &self.be.caps;
        let label = || kernels::label(kernel, fmt, caps);
        let max = caps.max_workgroups_per_dim;
        if workgroups.iter().any(|&w| w > max) {
            return Err(gpu_err(format!(
                "{}: dispatch {workgroups:?} exceeds {max} per dimension",
                label()
            )));
        }
        if params.len() as u64 * 4 > PARAM_BYTES {
            return Err(gpu_err(format!("{}: too many parameters", label())));
        }
        if binds.len() != pipe.storage.len() {
            return Err(gpu_err(format!(
                "{}: {} bindings given, the shader has {}",
                label(),
                binds.len(),
                pipe.storage.len()
            )));
        }
        let mut key = BgKey {
            pipe: pipe.index,
            n: binds.len() as u8,
            b: [[0; 3]; MAX_BINDS],
        };
        let mut bufs: [Option<&WgpuBuffer>; MAX_BINDS] = [None; MAX_BINDS];
        for (i, b) in binds.iter().enumerate() {
            let buf = buffer::get(b.t)?;
            let (off, size) = b.range.unwrap_or((0, buf.size));
            if off % caps.binding_align != 0 || size % 4 != 0 || size == 0 || off + size > buf.size {
                return Err(gpu_err(format!(
                    "{}: binding {} range {off}+{size} of a {}-byte buffer is not bindable",
                    label(),
                    i + 1,
                    buf.size
                )));
            }
            if size > caps.max_binding {
                return Err(gpu_err(format!(
                    "{}: a binding of {size} bytes exceeds this device's storage binding limit of {} bytes \
                     (use a shorter context or batch, or --backend cpu)",
                    label(),
                    caps.max_binding
                )));
            }
            key.b[i] = [buf.id, off, size];
            bufs[i] = Some(buf);
            // Any dispatch that may write the norm output or its planes makes them stale (a norm
            // with planes sets them again after its dispatch).
            if pipe.storage[i] == Slot::ReadWrite && self.st.dot_x.as_ref().is_some_and(|d| d.names(buf.id)) {
                self.st.dot_x = None;
            }
        }
        let bg = match self.st.bind_groups.get(&key) {
            Some(bg) => bg.clone(),
            None => {
                let st = &*self.st;
                let mut entries = Vec::with_capacity(binds.len() + 1);
                entries.push(wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &st.param_buf,
                        offset: 0,
                        size: wgpu::BufferSize::new(PARAM_BYTES),
                    }),
                });
                for (i, buf) in bufs[..binds.len()].iter().enumerate() {
                    let [_, off, size] = key.b[i];
                    let buf = buf.ok_or_else(|| gpu_err("binding missing"))?;
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &buf.buffer,
                            offset: off,
                            size: wgpu::BufferSize::new(size),
                        }),
                    });
                }
                let bg = self.be.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &pipe.layout,
                    entries: &entries,
                });
                self.st.bind_groups.insert(key, bg.clone());
                bg
            }
        };
        let mut p = [0u32; (PARAM_BYTES / 4) as usize];
        p[..params.len()].copy_from_slice(params);
        // The profile's GB/s: a matrix-vector kernel reads each byte of its weight bindings once.
        let weight_bytes = match kernel {
            Kernel::Matvec | Kernel::MatvecTall => key.b[0][2],
            Kernel::MatvecSwiglu | Kernel::MatvecSwigluXq => key.b[0][2] + key.b[3][2],
            // x, then a weight and an output per product.
            Kernel::MatvecGroup2 | Kernel::MatvecGroup3 | Kernel::MatvecGroup4 => {
                key.b[1..binds.len()].iter().step_by(2).map(|b| b[2]).sum()
            }
            _ => 0,
        };
        if let Some(Active { step, .. }) = self.st.steps.active.as_mut().and_then(Active::mine) {
            step.ids.extend(key.b[..binds.len()].iter().map(|b| b[0]));
            step.dispatches.push(Recorded {
                pipe: Arc::clone(&pipe),
                bg: bg.clone(),
                params: p,
                wg: workgroups,
                weight_bytes,
            });
        }
        self.encode(&pipe, &bg, &p, workgroups, weight_bytes)
    }

    /// Append one dispatch to the open pass (opening one if needed).
    fn encode(
        &mut self,
        pipe: &Pipe,
        bg: &wgpu::BindGroup,
        params: &[u32],
        wg: [u32; 3],
        weight_bytes: u64,
    ) -> Result<()> {
        let be = self.be;
        if self.st.params.len() as u64 >= self.st.param_stride * PARAM_SLOTS {
            self.flush();
        }
        let st = &mut *self.st;
        let offset = st.params.len() as u64;
        st.params.extend_from_slice(bytemuck::cast_slice(params));
        st.params.resize((offset + st.param_stride) as usize, 0);
        if st.pass.is_none() {
            let enc = st.encoder.get_or_insert_with(|| {
                be.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("rill") })
            });
            let mut pass = enc
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("rill ops"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            if let Some(ts) = st.profile.ts.as_ref() {
                pass.write_timestamp(&ts.set, 0);
                st.profile.pending.clear();
            }
            st.pass = Some(pass);
        }
        let pass = st.pass.as_mut().ok_or_else(|| gpu_err("compute pass missing"))?;
        pass.set_pipeline(&pipe.pipeline);
        pass.set_bind_group(0, bg, &[offset as u32]);
        pass.dispatch_workgroups(wg[0], wg[1], wg[2]);
        st.in_submit += 1;
        if st.profile.on {
            if let Some(ts) = st.profile.ts.as_ref() {
                st.profile.pending.push((pipe.index, weight_bytes));
                pass.write_timestamp(&ts.set, st.profile.pending.len() as u32);
                if st.profile.pending.len() as u32 + 1 >= MAX_QUERIES {
                    self.flush();
                }
            } else {
                let t0 = std::time::Instant::now();
                self.flush();
                be.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| gpu_err(format!("device poll: {e}")))?;
                let t = &mut self.st.profile.totals[pipe.index as usize];
                t.n += 1;
                t.secs += t0.elapsed().as_secs_f64();
                t.weight_bytes += weight_bytes;
            }
        }
        if self.st.in_submit >= self.st.submit_at {
            self.flush();
        }
        Ok(())
    }

    /// A tensor of `shape` on a persistent scratch buffer named `slot` (an op's intermediates): the
    /// buffer is created on first use, replaced by a larger one when a call needs more, and reused
    /// by every later call, so ops allocate nothing in the token loop. Dispatches that share a slot
    /// are ordered by wgpu's usage tracking like any other read-write buffer.
    pub fn scratch(&mut self, slot: &'static str, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let bytes = buffer::f32_bytes("scratch", dtype, shape)?;
        let buf = match self.st.scratch.get(slot) {
            Some(b) if b.size >= bytes => Arc::clone(b),
            _ => {
                self.st.dot_x = None;
                let b = Arc::new(buffer::create(self.be, slot, bytes, false)?);
                self.st.scratch.insert(slot, Arc::clone(&b));
                b
            }
        };
        Ok(Tensor {
            buf,
            dtype,
            shape: shape.to_vec(),
        })
    }

    /// `xq` holds the packed-dot planes of `out` as the dispatch just recorded wrote them.
    pub fn set_dot_x(&mut self, out: &Tensor, xq: Tensor) {
        self.st.dot_x = Some(DotX { out: out.clone(), xq });
    }

    /// The planes of `x` if a norm wrote them and nothing has written `x` or them since.
    pub fn dot_x(&self, x: &Tensor) -> Option<Tensor> {
        let d = self.st.dot_x.as_ref()?;
        let same = x.same_buffer(&d.out) && x.dtype == d.out.dtype && x.numel() == d.out.numel();
        same.then(|| d.xq.clone())
    }

    // ---- recorded steps ----

    /// Replay the step recorded under `key`, if there is one; otherwise start recording it.
    /// Returns whether it was replayed.
    pub fn step_begin(&mut self, key: u64) -> Result<bool> {
        self.st.steps.active = None;
        // The GPU is idle while the host reads a step's result: the next step's first dispatches
        // go as soon as `submit_first` of them are encoded (what is pending is counted in). When
        // the executor runs a step ahead, the device still has the last step's work: nothing
        // waits for this one's first submission, and fewer, larger submissions cost less.
        let caps = &self.be.caps;
        if self.be.reads_ahead_pending() {
            self.st.submit_every = caps.submit_ahead;
            self.st.submit_at = caps.submit_ahead;
        } else {
            self.st.submit_every = caps.submit_every;
            self.st.submit_at = caps.submit_first;
        }
        // A replay runs no op code (nothing tracks the planes): a step uses only planes of its own
        // norms, and none survive a step's boundary.
        self.st.dot_x = None;
        let Some(step) = self.st.steps.done.remove(&key) else {
            self.st.steps.active = Some(Active {
                key,
                thread: std::thread::current().id(),
                step: Step {
                    dispatches: Vec::new(),
                    ids: Vec::new(),
                },
                replayable: true,
            });
            return Ok(false);
        };
        let r = step
            .dispatches
            .iter()
            .try_for_each(|d| self.encode(&d.pipe, &d.bg, &d.params, d.wg, d.weight_bytes));
        self.st.steps.done.insert(key, step);
        r.map(|()| true)
    }

    /// End the step being recorded; keep it for replay when it completed and stayed replayable.
    pub fn step_end(&mut self, key: u64, ok: bool) {
        self.st.dot_x = None;
        self.st.submit_every = self.be.caps.submit_every;
        // Another thread's recording is not this call's to end.
        if self.st.steps.active.as_mut().and_then(Active::mine).is_none() {
            return;
        }
        let Some(Active {
            key: k,
            mut step,
            replayable,
            ..
        }) = self.st.steps.active.take()
        else {
            return;
        };
        if k != key || !ok || !replayable || step.dispatches.is_empty() {
            return;
        }
        step.ids.sort_unstable();
        step.ids.dedup();
        let steps = &mut self.st.steps;
        if steps.done.len() >= MAX_STEPS {
            if let Some(old) = steps.order.pop_front() {
                steps.done.remove(&old);
            }
        }
        steps.done.insert(key, step);
        steps.order.retain(|&o| o != key);
        steps.order.push_back(key);
    }
}

/// Read the timestamps of the submission just made and add each dispatch's time to its kernel.
fn collect_timestamps(be: &WgpuBackend, p: &mut Profiler, n: u32) {
    let Some(ts) = p.ts.as_ref() else {
        return;
    };
    let slice = ts.read.slice(..u64::from(n) * 8);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    if be.device.poll(wgpu::PollType::wait_indefinitely()).is_err() || !matches!(rx.recv(), Ok(Ok(()))) {
        p.pending.clear();
        return;
    }
    if let Ok(view) = slice.get_mapped_range() {
        let t: Vec<u64> = view
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        for (i, &(pipe, bytes)) in p.pending.iter().enumerate() {
            let dt = t[i + 1].saturating_sub(t[i]) as f64 * ts.period_ns * 1e-9;
            if let Some(tot) = p.totals.get_mut(pipe as usize) {
                tot.n += 1;
                tot.secs += dt;
                tot.weight_bytes += bytes;
            }
        }
    }
    ts.read.unmap();
    p.pending.clear();
}
