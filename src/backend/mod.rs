//! The backend contract: device buffers behind opaque handles and the model's op set.
//!
//! The executor (`crate::exec`) describes a whole prefill or decode step as a plan of the model's
//! plain ops (`plan`) and hands it to the backend (`Backend::run_plan`); it never touches tensor
//! bytes and never knows what a backend fuses. The CPU backend runs a plan op by op (the reference);
//! a GPU backend launches runs of ops as one kernel where it has one (`fusion`), enqueues, and
//! submits at `sync`/`read_*`. The only host reads in the token loop are `read_u32` of the sampled
//! token (or `read_f32` of logits when the caller asks for them).
//!
//! Shapes are written row-major, outermost first, the PyTorch way: a ggml tensor with
//! `ne = {ne0, ne1, ne2}` has `shape = [ne2, ne1, ne0]`. A weight matrix `[out, in]` holds `out`
//! rows of `in` contiguous values (quant blocks run along the row); `matmul` computes
//! `y[t][o] = dot(W[o], x[t])`.

pub mod check;
pub mod compose;
/// The CPU reference backend (rayon threads): native only, the browser runs on WebGPU.
#[cfg(not(target_arch = "wasm32"))]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fusion;
pub mod plan;
pub mod rows;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gguf::{GgmlType, TensorBytes};
pub use fusion::{AddNorm, AttnPrep, GdnGates, GdnStep, Group, MoeExperts, MoeFfn, SharedExpert, MAX_GROUP};
pub use plan::{DeltaAlgo, Op, Plan};
pub use rows::{Rows, SeqRow};

/// Element type of a device tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// Activations, states, caches, norm weights.
    F32,
    /// Token ids, expert ids.
    U32,
    /// A weight kept in its GGUF block format (F16, BF16, Q8_0, Q4_K, ...). Read only by `matmul`,
    /// `embed` and `moe_experts`, which dequantize in-kernel.
    Ggml(GgmlType),
}

/// A backend's buffer. Backends downcast through `as_any` to their own buffer type.
pub trait DeviceBuffer: Any + Send + Sync {
    fn as_any(&self) -> &dyn Any;
}

/// An opaque device tensor: a shared handle to a backend buffer plus its type and shape.
/// Cloning is cheap (the buffer is shared, not copied).
#[derive(Clone)]
pub struct Tensor {
    pub buf: Arc<dyn DeviceBuffer>,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Tensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Size of the last dimension (row length).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
    /// Product of all but the last dimension.
    pub fn rows(&self) -> usize {
        let n = self.shape.len();
        if n == 0 {
            1
        } else {
            self.shape[..n - 1].iter().product()
        }
    }
    /// The same buffer seen with another shape of as many elements (row views for `copy_rows`).
    pub fn reshaped(&self, shape: &[usize]) -> Result<Tensor> {
        if shape.iter().product::<usize>() != self.numel() {
            return Err(shape_err("reshape", format!("{:?} -> {shape:?}", self.shape)));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            ..self.clone()
        })
    }
    pub fn same_buffer(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.buf, &other.buf)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {:?})", self.dtype, self.shape)
    }
}

/// A weight as read from a GGUF file, ready to upload (zero-copy view of the mapped file).
#[derive(Clone)]
pub struct WeightData {
    pub name: String,
    pub ggml_type: GgmlType,
    /// Row-major shape, outermost first (ggml `ne` reversed).
    pub shape: Vec<usize>,
    pub bytes: TensorBytes,
}

/// A weight being uploaded piece by piece (`Backend::begin_weight`): the browser streams each
/// tensor from a file it cannot map, so no whole tensor has to sit in wasm memory.
pub trait WeightUpload {
    /// Append the next bytes. Every piece but the last must be a multiple of 4 bytes long.
    fn write(&mut self, bytes: &[u8]) -> Result<()>;
    /// All bytes are written: the weight tensor (an error if some are missing).
    fn finish(self: Box<Self>) -> Result<Tensor>;
}

/// Geometry of a Gated DeltaNet layer (spec/MODEL.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    /// Key heads `Hk`.
    pub hk: usize,
    /// Value heads `Hv` (multiple of `hk`; value head `j` uses key head `j % hk`).
    pub hv: usize,
    /// Key head dim `dk`.
    pub dk: usize,
    /// Value head dim `dv`.
    pub dv: usize,
}

impl GdnDims {
    pub fn key_dim(&self) -> usize {
        self.hk * self.dk
    }
    pub fn value_dim(&self) -> usize {
        self.hv * self.dv
    }
    /// Channels of the causal conv: `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

/// Geometry of a gated full-attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

/// The position of the first token of a batch, known on the host and on the device: `dev` is a
/// U32 tensor `[1]` holding `host`. Backends that run ops as they are called may use `host`;
/// a backend that replays a recorded step (a CUDA graph) must read `dev`, which the executor
/// rewrites before every step, so the recording stays valid from token to token.
#[derive(Clone, Copy)]
pub struct Pos<'a> {
    pub host: usize,
    pub dev: &'a Tensor,
}

/// What a backend does with the ops of one decode step (`Backend::step_begin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepMode {
    /// Execute the ops as they are called.
    Run,
    /// The ops are being recorded, not executed; `step_end` finishes the recording and runs it.
    Record,
    /// The backend launched its recording of this step; the executor skips the ops.
    Replayed,
}

/// Which precision tier a backend's kernels run at (../shared/fixtures/README.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Strict tier: f32 activations on dequantized weights (every backend has it).
    #[default]
    Exact,
    /// The backend's faster tier (f16/bf16 tensor-core products, quantized activations); each
    /// backend documents which tier its fast paths meet. Backends without one run `Exact`.
    Fast,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Fast => "fast",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Precision> {
        match s {
            "exact" => Ok(Precision::Exact),
            "fast" => Ok(Precision::Fast),
            other => Err(Error::InvalidArgument(format!(
                "unknown precision '{other}' (expected exact or fast)"
            ))),
        }
    }
}

/// Options for `create_with`.
#[derive(Debug, Clone, Copy, Default)]
pub struct BackendOptions {
    pub precision: Precision,
    /// The wgpu backend's capabilities limited or overridden (tests, measurements); the default
    /// is the adapter's own choice.
    #[cfg(feature = "wgpu")]
    pub wgpu: wgpu::WgpuOptions,
}

/// What `argmax` writes for a row with no allowed value (every logit NaN or -inf), the same rows
/// the sampler rejects. The executor turns it into `Error::NonFiniteLogits`.
pub const NON_FINITE: u32 = u32::MAX;

/// A device-to-host read that the caller can await (the browser cannot block on the GPU).
pub type ReadFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + 'a>>;

/// The op set. Every op checks dtypes and shapes and returns `Error::Backend` on a mismatch.
/// Output tensors are preallocated by the caller and must not alias inputs unless the op says
/// it works in place. All arithmetic is f32 unless a backend documents otherwise (`Precision`).
/// The rules of each op (dtypes, shapes, aliasing) are written once, in `check`, and every
/// backend calls them; the CPU backend defines the math.
///
/// The ops are the model's plain math; a step runs as a plan of them (`run_plan`), and what a GPU
/// backend launches as one kernel is its own choice (`fusion`), never the caller's.
pub trait Backend: Send + Sync {
    /// Short name used by `--backend` (`cpu`, `wgpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Human-readable device name (CPU model, GPU name).
    fn device_name(&self) -> String;
    /// Driver / runtime description for benchmarks.
    fn driver_info(&self) -> String {
        String::new()
    }
    /// The precision tier this backend instance runs at.
    fn precision(&self) -> Precision {
        Precision::Exact
    }
    /// Bytes of device memory free for new buffers, when the backend can tell.
    fn memory_available(&self) -> Option<u64> {
        None
    }

    // ---- memory ----
    /// A zero-filled tensor of `dtype` F32 or U32.
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Tensor>;
    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> Result<Tensor>;
    fn upload_u32(&self, data: &[u32], shape: &[usize]) -> Result<Tensor>;
    /// Upload a weight in its block format (`DType::Ggml`); kernels dequantize it.
    fn upload_weight(&self, w: &WeightData) -> Result<Tensor>;
    /// Start uploading a weight of `shape` (row-major) in its block format whose bytes will
    /// arrive in pieces. `None` (the default): the backend has no such path, and the loader
    /// collects the pieces and calls `upload_weight`. GPU backends copy each piece to the device.
    fn begin_weight(
        &self,
        _name: &str,
        _ggml_type: GgmlType,
        _shape: &[usize],
    ) -> Result<Option<Box<dyn WeightUpload + '_>>> {
        Ok(None)
    }
    /// Whether `upload_weight(w)` would succeed and the weight could run on this device (buffer
    /// and binding limits). The loader asks for every tensor before uploading any, so a model
    /// that cannot run fails at once, naming the tensor and the limit.
    fn check_upload(&self, w: &WeightData) -> Result<()> {
        self.check_weight_fits(&w.name, w.ggml_type, &w.shape, w.bytes.as_slice().len() as u64)
    }
    /// `check_upload` from the tensor's description alone (the browser checks from the file's
    /// header, before any tensor byte is read). Default: yes.
    fn check_weight_fits(&self, _name: &str, _ggml_type: GgmlType, _shape: &[usize], _n_bytes: u64) -> Result<()> {
        Ok(())
    }
    /// Overwrite an existing U32 tensor (token ids) from the host.
    fn write_u32(&self, t: &Tensor, data: &[u32]) -> Result<()>;
    fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>>;
    fn read_u32(&self, t: &Tensor) -> Result<Vec<u32>>;
    /// `read_f32` that can be awaited instead of blocking (the browser); the default reads
    /// synchronously.
    fn read_f32_async<'a>(&'a self, t: &'a Tensor) -> ReadFuture<'a, Vec<f32>> {
        Box::pin(std::future::ready(self.read_f32(t)))
    }
    /// `read_u32` that can be awaited instead of blocking.
    fn read_u32_async<'a>(&'a self, t: &'a Tensor) -> ReadFuture<'a, Vec<u32>> {
        Box::pin(std::future::ready(self.read_u32(t)))
    }
    /// Start reading `t` back: the copy is ordered after every op enqueued so far, ops enqueued
    /// after this call (which may overwrite `t`) do not change the result, and the future yields
    /// the values. The executor enqueues the next decode step before it waits for this step's
    /// token (`Model::generate_greedy`). The default reads at once (same values, no overlap).
    fn read_u32_ahead(&self, t: &Tensor) -> Result<ReadFuture<'_, Vec<u32>>> {
        let v = self.read_u32(t);
        Ok(Box::pin(std::future::ready(v)))
    }
    /// Fill an F32/U32 tensor with zeros.
    fn zero(&self, t: &Tensor) -> Result<()>;
    /// Copy all of `src` into `dst` (same dtype and element count).
    fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()>;
    /// Copy `n` rows of 2-D F32 tensors: `dst[dst_row + i] = src[src_row + i]` (same row length).
    fn copy_rows(&self, src: &Tensor, src_row: usize, dst: &Tensor, dst_row: usize, n: usize) -> Result<()>;
    /// Submit everything enqueued and wait for it.
    fn sync(&self) -> Result<()>;

    // ---- recorded steps ----
    /// Called by the executor before one decode step (the layers and the head of one token).
    /// `key` names the step's buffers and op sequence: the same key always means the same ops on
    /// the same buffers (only the contents of the token-id and position tensors change, written
    /// with `write_u32` before this call). A backend that can record and replay returns `Record`
    /// the first time and `Replayed` afterwards; no op inside a step reads to the host or syncs.
    fn step_begin(&self, _key: u64) -> Result<StepMode> {
        Ok(StepMode::Run)
    }
    /// Ends the step begun with `key`. `ok == false`: an op failed, discard any recording.
    fn step_end(&self, _key: u64, _ok: bool) -> Result<()> {
        Ok(())
    }
    /// Whether to offer a step of `b` rows of many sequences for recording (`step_begin`): only
    /// where this backend's row ops (`conv1d_silu_rows` .. `attention_rows`) read the rows from
    /// `Rows::dev` alone (the host values only for the rules), so that the step is the same ops
    /// on the same buffers whatever its rows, and where recording costs its products nothing.
    /// The defaults compose the one-sequence ops at host offsets: never.
    fn records_rows(&self, _b: usize) -> bool {
        false
    }

    // ---- plans ----
    /// Run a step's plan. The default runs its ops one by one (the reference); a GPU backend
    /// launches runs of them as one kernel where it has one.
    fn run_plan(&self, plan: &Plan<'_>) -> Result<()> {
        plan::run_ops(self, plan.ops())
    }
    /// `run_plan`, appending to `launched` what ran: the name of each fused run of ops
    /// (`fusion::Fusion::name`) and of each op run on its own (`Op::name`).
    fn run_plan_listed(&self, plan: &Plan<'_>, launched: &mut Vec<&'static str>) -> Result<()> {
        for op in plan.ops() {
            plan::run_op(self, op)?;
            launched.push(op.name());
        }
        Ok(())
    }

    // ---- ops ----
    /// `out[t] = dequant(table[ids[t]])`; table `[vocab, d]` (any weight type), ids U32 `[T]`, out `[T, d]`.
    fn embed(&self, table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()>;
    /// `out[t][o] = dot(W[o], x[t])`; W `[n_out, n_in]` (any weight type or F32), x `[T, n_in]`, out `[T, n_out]`.
    fn matmul(&self, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()>;
    /// RMSNorm over groups of `w.len()` consecutive values: `x / sqrt(mean(x^2) + eps) * w`.
    /// `x.numel()` must be a multiple of `w.numel()` (per-head norms pass `[T, H*D]` with `w` `[D]`).
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()>;
    /// `acc += x` elementwise (in place).
    fn add_assign(&self, acc: &Tensor, x: &Tensor) -> Result<()>;
    /// `out = silu(gate) * up`.
    fn swiglu(&self, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()>;
    /// `x *= sigmoid(gate)` elementwise (in place).
    fn sigmoid_mul_assign(&self, x: &Tensor, gate: &Tensor) -> Result<()>;
    /// `acc[t] += sigmoid(gate_logit[t]) * x[t]`; acc, x `[T, d]`, gate_logit `[T, 1]`.
    fn sigmoid_scale_add(&self, acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()>;

    /// Causal depthwise conv1d + SiLU over T tokens, continuing from and updating the rolling state.
    /// x `[T, C]` raw projections; w `[C, K]` F32 (tap K-1 multiplies the newest token);
    /// state `[K-1, C]` (oldest first) holds the raw inputs of the previous K-1 tokens; out `[T, C]`.
    fn conv1d_causal_silu(&self, x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<()>;
    /// Per-head delta-rule scalars: `beta = sigmoid(b)`, `g = ssm_a * softplus(a + dt_bias)`.
    /// a, b `[T, Hv]`; ssm_a, dt_bias `[Hv]`; g_out, beta_out `[T, Hv]`.
    fn gdn_gates(
        &self,
        a: &Tensor,
        b: &Tensor,
        ssm_a: &Tensor,
        dt_bias: &Tensor,
        g_out: &Tensor,
        beta_out: &Tensor,
    ) -> Result<()>;
    /// In place on the conv output `u` `[T, conv_dim]`: L2-normalise every q and k head
    /// (`x / sqrt(sum(x^2) + eps)`) and scale q by `1/sqrt(dk)`. v is left unchanged.
    fn l2_norm_qk(&self, u: &Tensor, dims: GdnDims, eps: f32) -> Result<()>;
    /// Gated delta rule, token by token (spec/DELTANET.md A.2, row-owned). q, k, v are read from
    /// `u` `[T, conv_dim]` (already normalised/scaled); g, beta `[T, Hv]`; state `[Hv, dv, dk]`
    /// value-major (updated); out `[T, Hv*dv]`. Value head `j` uses key head `j % hk`.
    fn delta_rule_recurrent(
        &self,
        u: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        state: &Tensor,
        out: &Tensor,
        dims: GdnDims,
    ) -> Result<()>;
    /// Same contract as `delta_rule_recurrent`, computed with the chunked algorithm (chunk 64,
    /// spec/DELTANET.md B). Equal to the recurrence up to f32 rounding.
    fn delta_rule_chunked(
        &self,
        u: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        state: &Tensor,
        out: &Tensor,
        dims: GdnDims,
    ) -> Result<()>;
    /// Gated RMSNorm per head: `out = rms_norm(x; w) * silu(z)` over groups of `w.len()` (= dv).
    fn gated_rms_norm(&self, x: &Tensor, z: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()>;

    /// Split the interleaved query/gate projection `qg` `[T, 2*H*D]` (`[q_0|gate_0|q_1|gate_1|...]`)
    /// into `q` `[T, H*D]` and `gate` `[T, H*D]`.
    fn split_qgate(&self, qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<()>;
    /// In place NeoX ("rotate half") RoPE on the first `n_rot` dims of every head of x `[T, nh*D]`,
    /// pair `(i, i + n_rot/2)`, frequency `theta^(-2i/n_rot)`, position `pos + t`.
    fn rope_neox(&self, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, pos: Pos) -> Result<()>;
    /// Append T rows to the KV cache: `k_cache[pos + t] = k[t]`, `v_cache[pos + t] = v[t]`;
    /// k, v `[T, W]`, caches `[ctx, W]`.
    fn kv_store(&self, k: &Tensor, v: &Tensor, k_cache: &Tensor, v_cache: &Tensor, pos: Pos) -> Result<()> {
        let t = check::kv_store(k, v, k_cache, v_cache, pos)?;
        self.copy_rows(k, 0, k_cache, pos.host, t)?;
        self.copy_rows(v, 0, v_cache, pos.host, t)
    }
    /// Causal GQA softmax attention of the T new queries (positions `pos..pos+T`) against the
    /// cache rows `0..pos+T`. q `[T, H*D]`; k_cache, v_cache `[ctx, Hkv*D]`; out `[T, H*D]`.
    /// Query head h uses KV head `h / (H / Hkv)`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        pos: Pos,
        dims: AttnDims,
        scale: f32,
        out: &Tensor,
    ) -> Result<()>;

    // ---- steps whose rows belong to different sequences (`rows`) ----
    //
    // Each row is one token of its own sequence, whose state lives in slot `rows[r].slot` of a
    // pool (layouts in `rows`). The defaults run the one-sequence ops row by row; a backend
    // with kernels for many rows overrides them.

    /// Causal conv1d + SiLU of one token per row: x, out `[B, C]`, w `[C, K]`, states
    /// `[S*(K-1), C]` (each row's slot updated).
    fn conv1d_silu_rows(&self, x: &Tensor, w: &Tensor, states: &Tensor, rows: Rows, out: &Tensor) -> Result<()> {
        rows::conv1d_silu(self, x, w, states, rows, out)
    }
    /// The recurrent delta rule of one token per row (`delta_rule_recurrent`'s contract) on
    /// its slot of `states` `[S*Hv*dv, dk]`.
    #[allow(clippy::too_many_arguments)]
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
        rows::delta_rule(self, u, g, beta, states, out, dims, rows)
    }
    /// `rope_neox` with row `r` at position `rows[r].pos`.
    fn rope_neox_rows(&self, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, rows: Rows) -> Result<()> {
        rows::rope_neox(self, x, head_dim, n_rot, theta, rows)
    }
    /// `k_pool[slot*ctx + pos] = k[r]`, the same for v; pools `[S*ctx, W]`.
    fn kv_store_rows(
        &self,
        k: &Tensor,
        v: &Tensor,
        k_pool: &Tensor,
        v_pool: &Tensor,
        ctx: usize,
        rows: Rows,
    ) -> Result<()> {
        rows::kv_store(self, k, v, k_pool, v_pool, ctx, rows)
    }
    /// `attention` of row `r`'s query against rows `0..=pos` of its slot: q, out `[B, H*D]`,
    /// pools `[S*ctx, Hkv*D]`.
    #[allow(clippy::too_many_arguments)]
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
        rows::attention(self, q, k_pool, v_pool, ctx, rows, dims, scale, out)
    }

    /// MoE routing: softmax over all experts of `logits` `[T, E]`, top-k, renormalise (sum clamped
    /// to >= 6.1035e-5), times `scale`. ids U32 `[T, k]`, weights F32 `[T, k]`.
    fn moe_route(&self, logits: &Tensor, k: usize, scale: f32, ids: &Tensor, weights: &Tensor) -> Result<()>;
    /// `out[t] = sum_j weights[t][j] * down_e(silu(gate_e x[t]) * up_e x[t])`, `e = ids[t][j]`.
    /// gate_exps, up_exps `[E, n_ff, d]`; down_exps `[E, d, n_ff]`; x, out `[T, d]`.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts(
        &self,
        x: &Tensor,
        gate_exps: &Tensor,
        up_exps: &Tensor,
        down_exps: &Tensor,
        ids: &Tensor,
        weights: &Tensor,
        out: &Tensor,
    ) -> Result<()>;

    /// Row-wise argmax of `logits` `[T, V]` into U32 `out` `[T]`: the first index of the largest
    /// value, NaN and -inf never chosen (the sampler's rule), `NON_FINITE` for a row where every
    /// value is NaN or -inf.
    fn argmax(&self, logits: &Tensor, out: &Tensor) -> Result<()>;
}

/// Names of the backends compiled into this build.
pub fn available() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(not(target_arch = "wasm32")) {
        v.push("cpu");
    }
    // `auto` is accepted by `create` but is not a backend of its own.
    if cfg!(feature = "wgpu") {
        v.push("wgpu");
    }
    if cfg!(feature = "cuda") {
        v.push("cuda");
    }
    v
}

/// Create a backend by name (`--backend`) at the exact precision. `auto` picks cuda when this
/// build has it and an NVIDIA GPU with its driver is present, else wgpu when this build has it
/// and a real GPU adapter exists (not a CPU emulation such as lavapipe), else the CPU backend.
pub fn create(name: &str) -> Result<Arc<dyn Backend>> {
    create_with(name, &BackendOptions::default())
}

/// `create` with options. A backend without a faster tier runs `Exact` whatever is asked;
/// `Backend::precision` says what it runs.
#[cfg(not(target_arch = "wasm32"))]
pub fn create_with(name: &str, opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    match name {
        "auto" => {
            // Every candidate fails quietly (no driver, no adapter): the next one is tried.
            #[cfg(feature = "cuda")]
            if let Ok(b) = cuda::create(opts) {
                return Ok(b);
            }
            #[cfg(feature = "wgpu")]
            if let Ok(b) = wgpu::WgpuBackend::with_options(opts) {
                if !b.is_cpu_adapter() {
                    return Ok(Arc::new(b));
                }
            }
            Ok(Arc::new(cpu::CpuBackend::new()))
        }
        "cpu" => Ok(Arc::new(cpu::CpuBackend::new())),
        #[cfg(feature = "wgpu")]
        "wgpu" => wgpu::create(opts),
        #[cfg(feature = "cuda")]
        "cuda" => cuda::create(opts),
        other => Err(Error::UnknownBackend(other.to_string(), available().join(", "))),
    }
}

/// In the browser a device is opened asynchronously: use `wgpu::WgpuBackend::with_options_async`.
#[cfg(target_arch = "wasm32")]
pub fn create_with(name: &str, _opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    Err(Error::Backend(format!(
        "backend '{name}': the browser opens its device asynchronously (await wgpu::WgpuBackend::with_options_async(..))"
    )))
}

/// A shape-mismatch error naming the op.
pub fn shape_err(op: &str, msg: impl std::fmt::Display) -> Error {
    Error::Backend(format!("{op}: {msg}"))
}
