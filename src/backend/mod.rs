//! The backend contract: device buffers behind opaque handles and the model's op set.
//!
//! The executor (`crate::exec`) records a whole prefill or decode step as a sequence of op calls on
//! a `&dyn Backend`; it never touches tensor bytes. A backend may execute each op immediately (cpu)
//! or enqueue it and submit at `sync`/`read_*` (GPU backends). The only host reads in the token loop
//! are `read_u32` of the sampled token (or `read_f32` of logits when the caller asks for them).
//!
//! Shapes are written row-major, outermost first, the PyTorch way: a ggml tensor with
//! `ne = {ne0, ne1, ne2}` has `shape = [ne2, ne1, ne0]`. A weight matrix `[out, in]` holds `out`
//! rows of `in` contiguous values (quant blocks run along the row); `matmul` computes
//! `y[t][o] = dot(W[o], x[t])`.

pub mod check;
/// The CPU reference backend (rayon threads): native only, the browser runs on WebGPU.
#[cfg(not(target_arch = "wasm32"))]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gguf::{GgmlType, TensorBytes};

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

/// The inputs and outputs of `gdn_gates`, for the fused `Backend::gdn_conv_gates`.
#[derive(Clone, Copy)]
pub struct GdnGates<'a> {
    pub a: &'a Tensor,
    pub b: &'a Tensor,
    pub ssm_a: &'a Tensor,
    pub dt_bias: &'a Tensor,
    pub g: &'a Tensor,
    pub beta: &'a Tensor,
}

/// The tensors of `Backend::gdn_recurrent_step`: the projections `qkv` `[T, conv_dim]` and `z`
/// `[T, Hv*dv]`, the conv weights `[conv_dim, K]` and state `[K-1, conv_dim]` (updated), the gates'
/// inputs and outputs, the delta-rule state `[Hv, dv, dk]` (updated), the gated norm's weight `[dv]`,
/// the scratch `conv_out` `[T, conv_dim]` and `o` `[T, Hv*dv]`, and the output `out` `[T, Hv*dv]`.
#[derive(Clone, Copy)]
pub struct GdnStep<'a> {
    pub qkv: &'a Tensor,
    pub z: &'a Tensor,
    pub conv_w: &'a Tensor,
    pub conv_state: &'a Tensor,
    pub gates: GdnGates<'a>,
    pub state: &'a Tensor,
    pub norm_w: &'a Tensor,
    pub conv_out: &'a Tensor,
    pub o: &'a Tensor,
    pub out: &'a Tensor,
}

/// `Backend::gdn_recurrent_step` as its three ops (the trait's default, and a backend's fallback
/// for the shapes its fused kernel does not take), after the op's own rules.
pub fn gdn_recurrent_step_ops<B: Backend + ?Sized>(
    be: &B,
    s: GdnStep<'_>,
    dims: GdnDims,
    l2_eps: f32,
    eps: f32,
) -> Result<()> {
    check::gdn_recurrent_step(s, dims)?;
    be.gdn_conv_gates(s.qkv, s.conv_w, s.conv_state, s.conv_out, dims, l2_eps, s.gates)?;
    be.delta_rule_recurrent(s.conv_out, s.gates.g, s.gates.beta, s.state, s.o, dims)?;
    be.gated_rms_norm(s.o, s.z, s.norm_w, eps, s.out)
}

/// The tensors of `Backend::attn_qk_prep`: the projections `qg` `[T, 2*H*D]` (query and gate
/// interleaved per head), `k` and `v` `[T, Hkv*D]`; the per-head norm weights `[D]`; the scratch
/// `q` and the outputs `gate`, `q_normed` `[T, H*D]` and `k_normed` `[T, Hkv*D]`.
#[derive(Clone, Copy)]
pub struct AttnPrep<'a> {
    pub qg: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub q_norm: &'a Tensor,
    pub k_norm: &'a Tensor,
    pub q: &'a Tensor,
    pub gate: &'a Tensor,
    pub q_normed: &'a Tensor,
    pub k_normed: &'a Tensor,
}

/// The shared expert of a MoE FFN, for `Backend::moe_experts_shared`: its weights `gate`, `up`
/// `[n_ff_sh, d]` and `down` `[d, n_ff_sh]`, the logit of its gate `gate_logit` `[T, 1]`, and the
/// scratch the composition of plain ops needs: `gate_tmp`, `up_tmp`, `act` `[T, n_ff_sh]` and
/// `out` `[T, d]` (their contents afterwards are unspecified).
#[derive(Clone, Copy)]
pub struct SharedExpert<'a> {
    pub gate: &'a Tensor,
    pub up: &'a Tensor,
    pub down: &'a Tensor,
    pub gate_logit: &'a Tensor,
    pub gate_tmp: &'a Tensor,
    pub up_tmp: &'a Tensor,
    pub act: &'a Tensor,
    pub out: &'a Tensor,
}

/// A routed MoE FFN's experts (`Backend::moe_experts_shared`'s operands but its input and output):
/// gate and up `[E, n_ff, d]`, down `[E, d, n_ff]` (every expert's), the routing's `ids` (U32) and
/// `weights` `[T, k]`, and the shared expert `sh`.
#[derive(Clone, Copy)]
pub struct MoeExperts<'a> {
    pub gate_exps: &'a Tensor,
    pub up_exps: &'a Tensor,
    pub down_exps: &'a Tensor,
    pub ids: &'a Tensor,
    pub weights: &'a Tensor,
    pub sh: SharedExpert<'a>,
}

impl<'a> MoeExperts<'a> {
    /// What the experts' products read besides x: the weights, the routing and the shared
    /// expert's weights and gate logit.
    pub fn reads(&self) -> [&'a Tensor; 9] {
        let sh = self.sh;
        [
            self.gate_exps,
            self.up_exps,
            self.down_exps,
            self.ids,
            self.weights,
            sh.gate,
            sh.up,
            sh.down,
            sh.gate_logit,
        ]
    }
    /// The shared expert's scratch (written).
    pub fn scratch(&self) -> [&'a Tensor; 4] {
        [self.sh.gate_tmp, self.sh.up_tmp, self.sh.act, self.sh.out]
    }
}

/// The residual update and RMSNorm that follow a block's output (spec/MODEL.md §3): `acc += y`,
/// then `out = rms_norm(acc; w, eps)`, the next block's input, `y` being the producing op's result
/// (`Backend::matmul_add_rms_norm`, `Backend::moe_route_experts_shared`), and with `then` the
/// next block's first products of it: `matmul_group(then.ws, out, then.outs)` (a GPU backend may
/// norm inside those products' launch instead of a launch of its own).
#[derive(Clone, Copy)]
pub struct AddNorm<'a> {
    pub acc: &'a Tensor,
    pub w: &'a Tensor,
    pub eps: f32,
    pub out: &'a Tensor,
    pub then: Option<Group<'a>>,
}

/// Products of one input (`Backend::matmul_group`'s operands but the input): `outs[i] =
/// matmul(ws[i], x)`.
#[derive(Clone, Copy)]
pub struct Group<'a> {
    pub ws: &'a [&'a Tensor],
    pub outs: &'a [&'a Tensor],
}

/// The tensors of `Backend::moe_ffn`, a MoE layer's FFN from its block's output `y` `[T, d]` on: the
/// residual add and input norm `input` (`input.acc += y`, `input.out = rms_norm(input.acc)`, the
/// experts' x), the router `[E, d]` and the shared expert's gate `[1, d]` with their products
/// `logits` `[T, E]` and `experts.sh.gate_logit`, the routing (`k`, `scale`, into `experts.ids` and
/// `experts.weights`), the experts and their output `out` `[T, d]`.
#[derive(Clone, Copy)]
pub struct MoeFfn<'a> {
    pub input: AddNorm<'a>,
    pub y: &'a Tensor,
    pub router: &'a Tensor,
    pub shared_gate: &'a Tensor,
    pub logits: &'a Tensor,
    pub k: usize,
    pub scale: f32,
    pub experts: MoeExperts<'a>,
    pub out: &'a Tensor,
}

/// `Backend::moe_ffn` as its ops (the trait's default, and a backend's fallback), after the op's
/// own rules: `add_rms_norm(input.acc, y, ..)`, `matmul_group([router, shared_gate], input.out,
/// [logits, sh.gate_logit])`, `moe_route_experts_shared(input.out, logits, .., out, next)`.
pub fn moe_ffn_ops<B: Backend + ?Sized>(be: &B, m: MoeFfn<'_>, next: Option<AddNorm<'_>>) -> Result<()> {
    check::moe_ffn(m, next)?;
    let x = m.input.out;
    be.add_rms_norm(m.input.acc, m.y, m.input.w, m.input.eps, x)?;
    be.matmul_group(&[m.router, m.shared_gate], x, &[m.logits, m.experts.sh.gate_logit])?;
    be.moe_route_experts_shared(x, m.logits, m.k, m.scale, m.experts, m.out, next)
}

/// Most products one `Backend::matmul_group` takes (a Gated DeltaNet layer has four).
pub const MAX_GROUP: usize = 4;

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
/// Fused ops (`add_rms_norm`, `matmul_swiglu`, `conv1d_silu_l2qk`, `kv_store`, `moe_experts_shared`,
/// ...) have default implementations that compose the plain ops, so they are the CPU reference by
/// construction; GPU backends override them with one kernel where that saves launches or passes.
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

    // ---- ops ----
    /// `out[t] = dequant(table[ids[t]])`; table `[vocab, d]` (any weight type), ids U32 `[T]`, out `[T, d]`.
    fn embed(&self, table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()>;
    /// `out[t][o] = dot(W[o], x[t])`; W `[n_out, n_in]` (any weight type or F32), x `[T, n_in]`, out `[T, n_out]`.
    fn matmul(&self, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()>;
    /// Several products of one input in one op: `outs[i] = matmul(ws[i], x)`, at most
    /// `MAX_GROUP` of them (the projections of a layer that share its normed input). The weights
    /// may differ in format and row count; every pair follows `matmul`'s rules and no output may
    /// alias another. GPU backends launch them as one kernel where they can (one launch and one
    /// tail instead of several on the decode path).
    fn matmul_group(&self, ws: &[&Tensor], x: &Tensor, outs: &[&Tensor]) -> Result<()> {
        check::matmul_group(ws, x, outs)?;
        for (w, out) in ws.iter().zip(outs) {
            self.matmul(w, x, out)?;
        }
        Ok(())
    }
    /// RMSNorm over groups of `w.len()` consecutive values: `x / sqrt(mean(x^2) + eps) * w`.
    /// `x.numel()` must be a multiple of `w.numel()` (per-head norms pass `[T, H*D]` with `w` `[D]`).
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()>;
    /// `acc += x` elementwise (in place).
    fn add_assign(&self, acc: &Tensor, x: &Tensor) -> Result<()>;
    /// Fused residual add and the next RMSNorm: `acc += x; out = rms_norm(acc; w)`.
    fn add_rms_norm(&self, acc: &Tensor, x: &Tensor, w: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
        check::add_rms_norm(acc, x, w, out)?;
        self.add_assign(acc, x)?;
        self.rms_norm(acc, w, eps, out)
    }
    /// A block's last product, its residual add and the next RMSNorm: `y = matmul(w, x)`, then
    /// `add_rms_norm(next.acc, y, next.w, next.eps, next.out)` (and `next.then`'s products of
    /// `next.out`: `add_norm_after`). `y` is scratch: its contents
    /// afterwards are unspecified (a backend may add the product into `next.acc` directly, so that
    /// the norm needs no residual add of its own). The default is that composition (the CPU
    /// reference).
    fn matmul_add_rms_norm(&self, w: &Tensor, x: &Tensor, y: &Tensor, next: AddNorm<'_>) -> Result<()> {
        check::matmul_add_rms_norm(w, x, y, next)?;
        self.matmul(w, x, y)?;
        add_norm_after(self, y, Some(next))
    }
    /// `out = silu(gate) * up`.
    fn swiglu(&self, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()>;
    /// The FFN's input side in one op: `out = silu(W_gate x) * (W_up x)`. `gate_tmp` and
    /// `up_tmp` `[T, n_ff]` are scratch: their contents afterwards are unspecified.
    fn matmul_swiglu(
        &self,
        w_gate: &Tensor,
        w_up: &Tensor,
        x: &Tensor,
        gate_tmp: &Tensor,
        up_tmp: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        check::matmul_swiglu(w_gate, w_up, x, gate_tmp, up_tmp, out)?;
        self.matmul(w_gate, x, gate_tmp)?;
        self.matmul(w_up, x, up_tmp)?;
        self.swiglu(gate_tmp, up_tmp, out)
    }
    /// `x *= sigmoid(gate)` elementwise (in place).
    fn sigmoid_mul_assign(&self, x: &Tensor, gate: &Tensor) -> Result<()>;
    /// `acc[t] += sigmoid(gate_logit[t]) * x[t]`; acc, x `[T, d]`, gate_logit `[T, 1]`.
    fn sigmoid_scale_add(&self, acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<()>;

    /// Causal depthwise conv1d + SiLU over T tokens, continuing from and updating the rolling state.
    /// x `[T, C]` raw projections; w `[C, K]` F32 (tap K-1 multiplies the newest token);
    /// state `[K-1, C]` (oldest first) holds the raw inputs of the previous K-1 tokens; out `[T, C]`.
    fn conv1d_causal_silu(&self, x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<()>;
    /// `conv1d_causal_silu` followed by `l2_norm_qk` on its output.
    fn conv1d_silu_l2qk(
        &self,
        x: &Tensor,
        w: &Tensor,
        state: &Tensor,
        out: &Tensor,
        dims: GdnDims,
        eps: f32,
    ) -> Result<()> {
        self.conv1d_causal_silu(x, w, state, out)?;
        self.l2_norm_qk(out, dims, eps)
    }
    /// The Gated DeltaNet's per-token preparation in one op: `gdn_gates` on `gates`, then
    /// `conv1d_silu_l2qk(x, w, state, out, dims, eps)`. Both read only their own inputs, so a
    /// backend may run them as one launch.
    #[allow(clippy::too_many_arguments)]
    fn gdn_conv_gates(
        &self,
        x: &Tensor,
        w: &Tensor,
        state: &Tensor,
        out: &Tensor,
        dims: GdnDims,
        eps: f32,
        gates: GdnGates<'_>,
    ) -> Result<()> {
        check::gdn_conv_gates(x, w, state, out, dims, gates)?;
        self.gdn_gates(gates.a, gates.b, gates.ssm_a, gates.dt_bias, gates.g, gates.beta)?;
        self.conv1d_silu_l2qk(x, w, state, out, dims, eps)
    }
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
    /// The recurrent middle of a Gated DeltaNet layer: `gdn_conv_gates(qkv -> conv_out; l2_eps)`,
    /// `delta_rule_recurrent(conv_out -> o)`, `gated_rms_norm(o, z; eps) -> out`. The scratch
    /// tensors' contents afterwards are unspecified (a backend may keep the intermediates on chip).
    fn gdn_recurrent_step(&self, s: GdnStep<'_>, dims: GdnDims, l2_eps: f32, eps: f32) -> Result<()> {
        gdn_recurrent_step_ops(self, s, dims, l2_eps, eps)
    }

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
    /// The attention layer's steps between its projections and the attention itself, in one op:
    /// `split_qgate(qg) -> (a.q, a.gate)`, per-head RMSNorm of q (`a.q_norm`) into `a.q_normed`
    /// and of k (`a.k_norm`) into `a.k_normed`, NeoX RoPE (`rope_neox`: `n_rot`, `theta`, `pos`)
    /// on both, then `kv_store(a.k_normed, a.v)` into the caches at `pos`. `a.q` is scratch (its
    /// contents afterwards are unspecified); `a.gate`, `a.q_normed`, `a.k_normed` and the cache
    /// rows are outputs.
    #[allow(clippy::too_many_arguments)]
    fn attn_qk_prep(
        &self,
        a: AttnPrep<'_>,
        head_dim: usize,
        n_rot: usize,
        theta: f32,
        eps: f32,
        k_cache: &Tensor,
        v_cache: &Tensor,
        pos: Pos,
    ) -> Result<()> {
        check::attn_qk_prep(a, head_dim, n_rot, theta, k_cache, v_cache, pos)?;
        self.split_qgate(a.qg, head_dim, a.q, a.gate)?;
        self.rms_norm(a.q, a.q_norm, eps, a.q_normed)?;
        self.rms_norm(a.k, a.k_norm, eps, a.k_normed)?;
        self.rope_neox(a.q_normed, head_dim, n_rot, theta, pos)?;
        self.rope_neox(a.k_normed, head_dim, n_rot, theta, pos)?;
        self.kv_store(a.k_normed, a.v, k_cache, v_cache, pos)
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

    /// `attention` then `out *= sigmoid(gate)` (the gated attention's output gate, spec/MODEL.md
    /// §6); gate `[T, H*D]`. The default composes `attention` and `sigmoid_mul_assign` (the CPU
    /// reference); a GPU backend may apply the gate where it writes the output.
    #[allow(clippy::too_many_arguments)]
    fn attention_gated(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        pos: Pos,
        dims: AttnDims,
        scale: f32,
        gate: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        check::attention_gated(q, k_cache, v_cache, pos, dims, gate, out)?;
        self.attention(q, k_cache, v_cache, pos, dims, scale, out)?;
        self.sigmoid_mul_assign(out, gate)
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
    /// The routed experts and the shared expert of a MoE FFN in one op:
    /// `out[t] = moe_experts(x)[t] + sigmoid(sh.gate_logit[t]) * down_sh(silu(gate_sh x[t]) * up_sh x[t])`
    /// (`moe_experts`' operands in `e`, the shared expert's in `e.sh`). The default composes
    /// `moe_experts`, `matmul_swiglu`, `matmul` and `sigmoid_scale_add` (the CPU reference); a GPU
    /// backend may run the shared expert as one more expert per token inside the experts'
    /// launches.
    fn moe_experts_shared(&self, x: &Tensor, e: MoeExperts<'_>, out: &Tensor) -> Result<()> {
        moe_experts_shared_composed(self, x, e, out)
    }
    /// A MoE FFN's routing and experts in one op: `moe_route(logits, k, scale, e.ids, e.weights)`
    /// then `moe_experts_shared(x, e, out)` (logits `[T, E]` of the E experts of `e.gate_exps`),
    /// ids and weights written as `moe_route` writes them; with `next`, then `add_norm_after(out,
    /// next)`, `out` being scratch (as `matmul_add_rms_norm`'s `y`). The default is that
    /// composition (the CPU reference); a GPU backend may route inside the experts' first launch,
    /// or add their sum into `next.acc`.
    #[allow(clippy::too_many_arguments)]
    fn moe_route_experts_shared(
        &self,
        x: &Tensor,
        logits: &Tensor,
        k: usize,
        scale: f32,
        e: MoeExperts<'_>,
        out: &Tensor,
        next: Option<AddNorm<'_>>,
    ) -> Result<()> {
        check::moe_route_experts_shared(x, logits, k, e, out, next)?;
        self.moe_route(logits, k, scale, e.ids, e.weights)?;
        moe_experts_shared_then(self, x, e, out, next)
    }

    /// A MoE layer's FFN (`MoeFfn`): its block's output added into the residual and normed, the
    /// router, the routing, the experts and, with `next`, their output added into `next.acc` and
    /// normed (`moe_route_experts_shared`'s `next`); `logits`, `y` and `out` are scratch afterwards
    /// (`y` and `out` may be one tensor). The default is `moe_ffn_ops` (the CPU reference); a GPU
    /// backend may norm, route and compute the router in one launch.
    fn moe_ffn(&self, m: MoeFfn<'_>, next: Option<AddNorm<'_>>) -> Result<()> {
        moe_ffn_ops(self, m, next)
    }

    /// Row-wise argmax of `logits` `[T, V]` into U32 `out` `[T]`: the first index of the largest
    /// value, NaN and -inf never chosen (the sampler's rule), `NON_FINITE` for a row where every
    /// value is NaN or -inf.
    fn argmax(&self, logits: &Tensor, out: &Tensor) -> Result<()>;
}

/// `Backend::moe_experts_shared` composed of plain ops: its default (the CPU reference), and
/// what a backend that fuses only some cases runs for the others.
pub fn moe_experts_shared_composed<B: Backend + ?Sized>(
    be: &B,
    x: &Tensor,
    e: MoeExperts<'_>,
    out: &Tensor,
) -> Result<()> {
    check::moe_experts_shared(x, e, out)?;
    let sh = e.sh;
    be.moe_experts(x, e.gate_exps, e.up_exps, e.down_exps, e.ids, e.weights, out)?;
    be.matmul_swiglu(sh.gate, sh.up, x, sh.gate_tmp, sh.up_tmp, sh.act)?;
    be.matmul(sh.down, sh.act, sh.out)?;
    be.sigmoid_scale_add(out, sh.out, sh.gate_logit)
}

/// `moe_experts_shared` then `next`'s residual add and norm of its output: the routed op's tail in
/// the default composition and in a backend's fallback (`moe_route_experts_shared`).
pub fn moe_experts_shared_then<B: Backend + ?Sized>(
    be: &B,
    x: &Tensor,
    e: MoeExperts<'_>,
    out: &Tensor,
    next: Option<AddNorm<'_>>,
) -> Result<()> {
    be.moe_experts_shared(x, e, out)?;
    add_norm_after(be, out, next)
}

/// `next`'s residual add and norm of an op's result `y` (`add_rms_norm(next.acc, y, ..)`) and its
/// products of the normed rows (`next.then`), if any.
pub fn add_norm_after<B: Backend + ?Sized>(be: &B, y: &Tensor, next: Option<AddNorm<'_>>) -> Result<()> {
    let Some(n) = next else { return Ok(()) };
    be.add_rms_norm(n.acc, y, n.w, n.eps, n.out)?;
    match n.then {
        Some(g) => be.matmul_group(g.ws, n.out, g.outs),
        None => Ok(()),
    }
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
