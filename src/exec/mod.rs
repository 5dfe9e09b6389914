//! The shared model executor: the layer loop, prefill vs decode scheduling and the per-sequence
//! state. Written once against `&dyn Backend`; it never names a backend type.

mod scratch;
mod session;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

pub use session::{LayerState, Session, Snapshot, SnapshotLayer};

use crate::backend::{Backend, DType, Tensor};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::weights::{AttnWeights, Ffn, GdnWeights, Layer, Mixer};
use crate::model::{Config, Weights};
use scratch::Scratch;

/// Which delta-rule algorithm a batch of tokens uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaMode {
    /// Recurrence for one token (decode), chunked algorithm for a batch (prefill).
    Auto,
    Recurrent,
    Chunked,
}

/// Tunables of the executor.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Largest number of prompt tokens run through the layers at once (bounds activation memory).
    pub ubatch: usize,
    pub delta: DeltaMode,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            ubatch: 512,
            delta: DeltaMode::Auto,
        }
    }
}

/// Which logits a forward pass returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (prefill of a prompt whose continuation starts later).
    None,
    /// Only the last position's `[n_vocab]`.
    Last,
    /// Every position, `[T, n_vocab]` row-major.
    All,
}

/// Residual-stream snapshots of one batch (`Model::trace_hidden`), each `[T, d]` row-major.
#[derive(Debug, Clone, Default)]
pub struct HiddenTrace {
    /// Token embeddings.
    pub embed: Vec<f32>,
    /// Output of each decoder layer (residual stream before the final norm).
    pub layers: Vec<Vec<f32>>,
    /// After the final RMSNorm (the LM head's input).
    pub final_norm: Vec<f32>,
}

/// Buffers of the final norm + LM head for a given number of rows.
struct HeadBuffers {
    /// `[1, d]`: the last residual row, when only the last position's logits are wanted.
    last_row: Tensor,
    /// `[rows, d]` normed hidden states.
    normed: Tensor,
    /// `[rows, n_vocab]`.
    logits: Tensor,
    /// U32 `[rows]` on-device argmax.
    argmax: Tensor,
}

/// A loaded model bound to a backend.
pub struct Model {
    pub config: Config,
    backend: Arc<dyn Backend>,
    weights: Weights,
    pub options: ExecOptions,
    /// Activation buffers per batch size, reused across calls.
    scratch: Mutex<HashMap<usize, Scratch>>,
    /// LM-head buffers per row count.
    head: Mutex<HashMap<usize, HeadBuffers>>,
}

impl Model {
    /// Read the config from `file`, check every tensor, and upload the weights.
    /// `on_tensor(bytes)` is called after each tensor is uploaded (progress).
    pub fn load(file: &GgufFile, backend: Arc<dyn Backend>, on_tensor: &mut dyn FnMut(u64)) -> Result<Model> {
        let config = Config::from_gguf(file)?;
        let weights = Weights::load(file, &config, &backend, on_tensor)?;
        backend.sync()?;
        Ok(Model {
            config,
            backend,
            weights,
            options: ExecOptions::default(),
            scratch: Mutex::new(HashMap::new()),
            head: Mutex::new(HashMap::new()),
        })
    }

    /// Convenience: open a GGUF file and load it without progress reporting.
    pub fn open(path: impl AsRef<Path>, backend: Arc<dyn Backend>) -> Result<Model> {
        let file = GgufFile::open(path)?;
        Model::load(&file, backend, &mut |_| {})
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// A fresh sequence with room for `n_ctx` tokens.
    pub fn new_session(&self, n_ctx: usize) -> Result<Session> {
        Session::new(self.backend.as_ref(), &self.config, n_ctx)
    }

    /// Run a prompt through the model in batches of at most `options.ubatch` tokens, continuing from
    /// the session's state. `progress(done, total)` is called after each batch.
    pub fn prefill(
        &self,
        s: &mut Session,
        tokens: &[u32],
        want: Logits,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        self.check_room(s, tokens.len())?;
        let ub = self.options.ubatch.max(1);
        let mut out = Vec::new();
        let mut done = 0;
        for chunk in tokens.chunks(ub) {
            let last_chunk = done + chunk.len() == tokens.len();
            let w = match want {
                Logits::All => Logits::All,
                Logits::Last if last_chunk => Logits::Last,
                _ => Logits::None,
            };
            let mode = match self.options.delta {
                DeltaMode::Auto if chunk.len() > 1 => DeltaMode::Chunked,
                DeltaMode::Auto => DeltaMode::Recurrent,
                m => m,
            };
            let part = self.forward(s, chunk, w, mode)?;
            out.extend_from_slice(&part);
            done += chunk.len();
            progress(done, tokens.len());
        }
        Ok(out)
    }

    /// One decode step: feed `token`, return the logits `[n_vocab]` of its position.
    pub fn decode(&self, s: &mut Session, token: u32) -> Result<Vec<f32>> {
        self.check_room(s, 1)?;
        let mode = self.decode_mode();
        self.forward(s, &[token], Logits::Last, mode)
    }

    /// One decode step that returns the argmax token, computed on the device (one 4-byte read).
    pub fn decode_greedy(&self, s: &mut Session, token: u32) -> Result<u32> {
        self.check_room(s, 1)?;
        let mode = self.decode_mode();
        self.run_layers(s, &[token], mode)?;
        self.head_argmax(1)
    }

    /// The argmax of the last position of a prefill, computed on the device.
    pub fn prefill_greedy(
        &self,
        s: &mut Session,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<u32> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        let (head, last) = tokens.split_at(tokens.len() - 1);
        if !head.is_empty() {
            self.prefill(s, head, Logits::None, progress)?;
        }
        self.check_room(s, 1)?;
        let mode = if head.is_empty() {
            DeltaMode::Recurrent
        } else {
            self.decode_mode()
        };
        self.run_layers(s, last, mode)?;
        self.head_argmax(1)
    }

    /// Run `tokens` as one batch (like one prefill micro-batch) and return the residual stream
    /// `[T, d]` after the embedding, after every layer, and after the final norm. For debugging
    /// and layer-by-layer comparisons with a reference implementation.
    pub fn trace_hidden(&self, s: &mut Session, tokens: &[u32]) -> Result<HiddenTrace> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        self.check_room(s, tokens.len())?;
        let mode = match self.options.delta {
            DeltaMode::Auto if tokens.len() > 1 => DeltaMode::Chunked,
            DeltaMode::Auto => DeltaMode::Recurrent,
            m => m,
        };
        let mut trace = HiddenTrace::default();
        let mut obs = |layer: Option<usize>, h: Vec<f32>| match layer {
            None => trace.embed = h,
            Some(_) => trace.layers.push(h),
        };
        self.run_layers_observed(s, tokens, mode, Some(&mut obs))?;
        let be = self.backend.as_ref();
        let t = tokens.len();
        let normed = be.alloc(DType::F32, &[t, self.config.n_embd])?;
        {
            let cache = self
                .scratch
                .lock()
                .map_err(|_| Error::Backend("scratch lock poisoned".into()))?;
            let sc = cache.get(&t).ok_or_else(|| Error::Backend("scratch missing".into()))?;
            be.rms_norm(&sc.h, &self.weights.output_norm, self.config.eps, &normed)?;
        }
        trace.final_norm = be.read_f32(&normed)?;
        Ok(trace)
    }

    fn decode_mode(&self) -> DeltaMode {
        match self.options.delta {
            DeltaMode::Chunked => DeltaMode::Chunked,
            _ => DeltaMode::Recurrent,
        }
    }

    fn check_room(&self, s: &Session, n: usize) -> Result<()> {
        if s.pos + n > s.n_ctx {
            return Err(Error::ContextOverflow {
                prompt: s.pos,
                generate: n,
                ctx: s.n_ctx,
            });
        }
        Ok(())
    }

    fn forward(&self, s: &mut Session, tokens: &[u32], want: Logits, mode: DeltaMode) -> Result<Vec<f32>> {
        self.run_layers(s, tokens, mode)?;
        match want {
            Logits::None => Ok(Vec::new()),
            Logits::Last => self.head_logits(tokens.len(), true),
            Logits::All => self.head_logits(tokens.len(), false),
        }
    }

    /// Embed `tokens` and run every layer, leaving the residual stream in the scratch `h`.
    fn run_layers(&self, s: &mut Session, tokens: &[u32], mode: DeltaMode) -> Result<()> {
        self.run_layers_observed(s, tokens, mode, None)
    }

    /// `run_layers`, optionally reading the residual stream back after the embedding (`None`) and
    /// after each layer (`Some(i)`). Only debugging and tests observe; the token loop passes `None`.
    fn run_layers_observed(
        &self,
        s: &mut Session,
        tokens: &[u32],
        mode: DeltaMode,
        mut observe: Option<&mut dyn FnMut(Option<usize>, Vec<f32>)>,
    ) -> Result<()> {
        let be = self.backend.as_ref();
        let t = tokens.len();
        let mut cache = self
            .scratch
            .lock()
            .map_err(|_| Error::Backend("scratch lock poisoned".into()))?;
        if !cache.contains_key(&t) {
            if cache.len() >= 3 {
                cache.clear();
            }
            cache.insert(t, Scratch::new(be, &self.config, t)?);
        }
        let sc = cache.get(&t).ok_or_else(|| Error::Backend("scratch missing".into()))?;
        be.write_u32(&sc.ids, tokens)?;
        be.embed(&self.weights.token_embd, &sc.ids, &sc.h)?;
        if let Some(f) = observe.as_mut() {
            f(None, be.read_f32(&sc.h)?);
        }
        let pos0 = s.pos;
        for (i, (layer, state)) in self.weights.layers.iter().zip(s.layers.iter()).enumerate() {
            self.run_layer(layer, state, sc, pos0, mode)?;
            if let Some(f) = observe.as_mut() {
                f(Some(i), be.read_f32(&sc.h)?);
            }
        }
        s.pos += t;
        Ok(())
    }

    fn run_layer(&self, l: &Layer, state: &LayerState, sc: &Scratch, pos0: usize, mode: DeltaMode) -> Result<()> {
        let be = self.backend.as_ref();
        let eps = self.config.eps;
        be.rms_norm(&sc.h, &l.attn_norm, eps, &sc.xn)?;
        match (&l.mixer, state) {
            (Mixer::Gdn(w), LayerState::Gdn { conv, delta }) => self.gdn(w, conv, delta, sc, mode)?,
            (Mixer::Attn(w), LayerState::Attn { k, v }) => self.attention(w, k, v, sc, pos0)?,
            _ => return Err(Error::Backend("session does not match the model's layer types".into())),
        }
        be.add_assign(&sc.h, &sc.mix)?;
        be.rms_norm(&sc.h, &l.post_norm, eps, &sc.xn)?;
        self.ffn(&l.ffn, sc)?;
        be.add_assign(&sc.h, &sc.mix)
    }

    /// Gated DeltaNet mixer (spec/MODEL.md §5): xn -> mix.
    fn gdn(&self, w: &GdnWeights, conv: &Tensor, delta: &Tensor, sc: &Scratch, mode: DeltaMode) -> Result<()> {
        let be = self.backend.as_ref();
        let dims = self.config.gdn;
        be.matmul(&w.qkv, &sc.xn, &sc.mixed)?;
        be.matmul(&w.gate, &sc.xn, &sc.z)?;
        be.matmul(&w.beta, &sc.xn, &sc.b)?;
        be.matmul(&w.alpha, &sc.xn, &sc.a)?;
        be.gdn_gates(&sc.a, &sc.b, &w.ssm_a, &w.dt_bias, &sc.g, &sc.beta)?;
        be.conv1d_causal_silu(&sc.mixed, &w.conv1d, conv, &sc.conv_out)?;
        // HF's kernel uses a fixed 1e-6 for the q/k L2 norm (spec/MODEL.md §4.1).
        be.l2_norm_qk(&sc.conv_out, dims, 1e-6)?;
        match mode {
            DeltaMode::Chunked => be.delta_rule_chunked(&sc.conv_out, &sc.g, &sc.beta, delta, &sc.o, dims)?,
            _ => be.delta_rule_recurrent(&sc.conv_out, &sc.g, &sc.beta, delta, &sc.o, dims)?,
        }
        be.gated_rms_norm(&sc.o, &sc.z, &w.ssm_norm, self.config.eps, &sc.o_normed)?;
        be.matmul(&w.out, &sc.o_normed, &sc.mix)
    }

    /// Gated full attention (spec/MODEL.md §6): xn -> mix, appending to the KV cache.
    fn attention(&self, w: &AttnWeights, kc: &Tensor, vc: &Tensor, sc: &Scratch, pos0: usize) -> Result<()> {
        let be = self.backend.as_ref();
        let cfg = &self.config;
        let dims = cfg.attn;
        let hd = dims.head_dim;
        be.matmul(&w.q, &sc.xn, &sc.qg)?;
        be.matmul(&w.k, &sc.xn, &sc.k)?;
        be.matmul(&w.v, &sc.xn, &sc.v)?;
        be.split_qgate(&sc.qg, hd, &sc.q, &sc.gate)?;
        be.rms_norm(&sc.q, &w.q_norm, cfg.eps, &sc.q_normed)?;
        be.rms_norm(&sc.k, &w.k_norm, cfg.eps, &sc.k_normed)?;
        be.rope_neox(&sc.q_normed, hd, cfg.n_rot, cfg.rope_theta, pos0)?;
        be.rope_neox(&sc.k_normed, hd, cfg.n_rot, cfg.rope_theta, pos0)?;
        be.copy_rows(&sc.k_normed, 0, kc, pos0, sc.t)?;
        be.copy_rows(&sc.v, 0, vc, pos0, sc.t)?;
        let scale = 1.0 / (hd as f32).sqrt();
        be.attention(&sc.q_normed, kc, vc, pos0, dims, scale, &sc.att)?;
        be.sigmoid_mul_assign(&sc.att, &sc.gate)?;
        be.matmul(&w.out, &sc.att, &sc.mix)
    }

    /// FFN (spec/MODEL.md §7): xn -> mix.
    fn ffn(&self, f: &Ffn, sc: &Scratch) -> Result<()> {
        let be = self.backend.as_ref();
        match f {
            Ffn::Dense { gate, up, down } => self.swiglu_mlp(gate, up, down, sc, &sc.mix),
            Ffn::Moe {
                router,
                gate_exps,
                up_exps,
                down_exps,
                shexp_gate,
                gate_sh,
                up_sh,
                down_sh,
            } => {
                let missing = || Error::Backend("MoE scratch missing".into());
                let logits = sc.router_logits.as_ref().ok_or_else(missing)?;
                let ids = sc.expert_ids.as_ref().ok_or_else(missing)?;
                let wts = sc.expert_w.as_ref().ok_or_else(missing)?;
                let shared = sc.shared_out.as_ref().ok_or_else(missing)?;
                let sg = sc.shared_gate.as_ref().ok_or_else(missing)?;
                let m = self.config.moe.as_ref().ok_or_else(missing)?;
                be.matmul(router, &sc.xn, logits)?;
                be.moe_route(logits, m.n_expert_used, m.weights_scale, ids, wts)?;
                be.moe_experts(&sc.xn, gate_exps, up_exps, down_exps, ids, wts, &sc.mix)?;
                self.swiglu_mlp(gate_sh, up_sh, down_sh, sc, shared)?;
                be.matmul(shexp_gate, &sc.xn, sg)?;
                be.sigmoid_scale_add(&sc.mix, shared, sg)
            }
        }
    }

    fn swiglu_mlp(&self, gate: &Tensor, up: &Tensor, down: &Tensor, sc: &Scratch, out: &Tensor) -> Result<()> {
        let be = self.backend.as_ref();
        be.matmul(gate, &sc.xn, &sc.ff_gate)?;
        be.matmul(up, &sc.xn, &sc.ff_up)?;
        be.swiglu(&sc.ff_gate, &sc.ff_up, &sc.ff_act)?;
        be.matmul(down, &sc.ff_act, out)
    }

    /// Final norm + LM head on the last `rows` positions of the scratch for batch size `t`
    /// (`last_only`: just the last row). Returns the logits read back to the host.
    fn head_logits(&self, t: usize, last_only: bool) -> Result<Vec<f32>> {
        let logits = self.head(t, last_only)?;
        self.backend.read_f32(&logits)
    }

    fn head_argmax(&self, t: usize) -> Result<u32> {
        let logits = self.head(t, true)?;
        let heads = self
            .head
            .lock()
            .map_err(|_| Error::Backend("head lock poisoned".into()))?;
        let hb = heads
            .get(&1)
            .ok_or_else(|| Error::Backend("head buffers missing".into()))?;
        self.backend.argmax(&logits, &hb.argmax)?;
        let v = self.backend.read_u32(&hb.argmax)?;
        v.first()
            .copied()
            .ok_or_else(|| Error::Backend("argmax returned nothing".into()))
    }

    /// Compute the logits tensor for the last row (or all `t` rows) of the current batch.
    fn head(&self, t: usize, last_only: bool) -> Result<Tensor> {
        let be = self.backend.as_ref();
        let cfg = &self.config;
        let rows = if last_only { 1 } else { t };
        let cache = self
            .scratch
            .lock()
            .map_err(|_| Error::Backend("scratch lock poisoned".into()))?;
        let sc = cache.get(&t).ok_or_else(|| Error::Backend("scratch missing".into()))?;
        let mut heads = self
            .head
            .lock()
            .map_err(|_| Error::Backend("head lock poisoned".into()))?;
        if !heads.contains_key(&rows) {
            if heads.len() >= 3 {
                heads.clear();
            }
            let hb = HeadBuffers {
                last_row: be.alloc(DType::F32, &[1, cfg.n_embd])?,
                normed: be.alloc(DType::F32, &[rows, cfg.n_embd])?,
                logits: be.alloc(DType::F32, &[rows, cfg.n_vocab])?,
                argmax: be.alloc(DType::U32, &[rows])?,
            };
            heads.insert(rows, hb);
        }
        let hb = heads
            .get(&rows)
            .ok_or_else(|| Error::Backend("head buffers missing".into()))?;
        if last_only {
            be.copy_rows(&sc.h, t - 1, &hb.last_row, 0, 1)?;
            be.rms_norm(&hb.last_row, &self.weights.output_norm, cfg.eps, &hb.normed)?;
        } else {
            be.rms_norm(&sc.h, &self.weights.output_norm, cfg.eps, &hb.normed)?;
        }
        be.matmul(&self.weights.output, &hb.normed, &hb.logits)?;
        Ok(hb.logits.clone())
    }
}
