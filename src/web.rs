//! The browser entry (feature `web`, wasm32 only): the native engine behind wasm-bindgen, for
//! `web/worker.js`. Only what the browser lacks is replaced here: the GGUF header is parsed from
//! a prefix of the user's `File`, tensors are streamed from it piece by piece (`BlobSource`), the
//! device is opened and read asynchronously; the tokenizer, executor, sampler and WGSL shaders
//! are the native ones.
//!
//! One `Engine` per worker. Its methods take `&self` so that `stop` can run while `generate` is
//! suspended on a device read; state that a running call owns is moved out of its `RefCell` for
//! the call's duration, so no borrow is ever held across an await.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

use crate::backend::wgpu::WgpuBackend;
use crate::backend::{Backend, BackendOptions, ReadFuture};
use crate::error::{Error, Result};
use crate::exec::{Logits, Model, Session};
use crate::gguf::{GgufFile, TensorBytes};
use crate::model::limits::check_tensor_sizes;
use crate::model::TensorSource;
use crate::sample::{Sampler, SamplerConfig};
use crate::tokenizer::{render_chat_prompt, ChatMessage, ChatOptions, Tokenizer};

/// First guess at the header's size: a Qwen3.5 header with its 248k-token vocabulary and merges
/// is about 10 MB. Doubled while the header continues past it, up to `MAX_HEADER`.
const FIRST_PREFIX: u64 = 16 << 20;
const MAX_HEADER: u64 = 512 << 20;
/// Bytes per read from the file: bounds the wasm memory a load needs, whatever the model's size.
const PIECE: usize = 8 << 20;
/// Context of a session unless `load` is told otherwise.
const DEFAULT_CTX: usize = 4096;

fn js_err(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

/// A JS exception (a rejected promise, a thrown value) as an engine error.
fn from_js(what: &str, v: JsValue) -> Error {
    let msg = v
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| v.as_string())
        .unwrap_or_else(|| format!("{v:?}"));
    Error::Backend(format!("{what}: {msg}"))
}

/// Bytes `[start, start + len)` of a `Blob` (a `File` from the picker, a download, an OPFS file).
async fn read_blob(blob: &web_sys::Blob, start: u64, len: usize) -> Result<Vec<u8>> {
    let end = start + len as u64;
    let part = blob
        .slice_with_f64_and_f64(start as f64, end as f64)
        .map_err(|e| from_js("slicing the file", e))?;
    let buf = JsFuture::from(part.array_buffer())
        .await
        .map_err(|e| from_js("reading the file", e))?;
    let arr = js_sys::Uint8Array::new(&buf);
    if arr.length() as usize != len {
        return Err(Error::InvalidArgument(format!(
            "the file returned {} bytes at offset {start} instead of {len} (was it changed while loading?)",
            arr.length()
        )));
    }
    let mut out = crate::alloc::vec_filled(len, 0u8, "a piece of the model file")?;
    arr.copy_to(&mut out);
    Ok(out)
}

/// The tensors of a GGUF `Blob`, read piece by piece: only one piece is in wasm memory at a time.
struct BlobSource {
    blob: web_sys::Blob,
}

impl TensorSource for BlobSource {
    fn read(&self, start: u64, len: usize) -> ReadFuture<'_, TensorBytes> {
        Box::pin(async move { Ok(TensorBytes::from_vec(read_blob(&self.blob, start, len).await?)) })
    }
    fn max_read(&self) -> usize {
        PIECE
    }
}

/// Parse the GGUF header from a prefix of the blob, growing the prefix until it holds it all.
async fn read_header(blob: &web_sys::Blob) -> Result<GgufFile> {
    let file_len = blob.size() as u64;
    let mut want = FIRST_PREFIX.min(file_len);
    loop {
        let prefix = read_blob(blob, 0, want as usize).await?;
        if let Some(file) = GgufFile::from_prefix(prefix, file_len)? {
            return Ok(file);
        }
        if want >= MAX_HEADER {
            return Err(Error::InvalidArgument(format!(
                "the GGUF header is larger than {} MiB",
                MAX_HEADER >> 20
            )));
        }
        want = (want * 2).min(file_len).min(MAX_HEADER);
    }
}

/// A loaded model with its tokenizer and one conversation.
struct Loaded {
    model: Model,
    tokenizer: Tokenizer,
    session: Session,
    /// The tokens the session has consumed, so that a prompt extending them (the next chat turn)
    /// feeds only its new tokens.
    fed: Vec<u32>,
}

impl Loaded {
    /// Start the conversation over.
    fn reset(&mut self) -> Result<()> {
        self.session = self.model.new_session(self.session.n_ctx)?;
        self.fed.clear();
        Ok(())
    }
}

/// Why a generation ended.
#[derive(Clone, Copy)]
enum Finish {
    /// The model produced an end-of-generation token.
    Eog,
    /// `max_tokens` were generated.
    Length,
    /// `Engine::stop` was called.
    Stopped,
}

impl Finish {
    fn name(self) -> &'static str {
        match self {
            Finish::Eog => "eog",
            Finish::Length => "length",
            Finish::Stopped => "stopped",
        }
    }
}

/// The engine of the browser demo: one WebGPU device, at most one model.
#[wasm_bindgen]
pub struct Engine {
    backend: Arc<WgpuBackend>,
    /// `None` before the first load, and while a load or a generation owns it.
    loaded: RefCell<Option<Loaded>>,
    busy: Cell<bool>,
    stop: Cell<bool>,
    sampling: Cell<SamplerConfig>,
}

/// Marks the engine busy for one call; clears the mark however the call ends.
struct BusyGuard<'a>(&'a Cell<bool>);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

#[wasm_bindgen]
impl Engine {
    /// Open the WebGPU device. Fails with a readable message when the browser has no WebGPU
    /// adapter.
    pub async fn create() -> std::result::Result<Engine, JsError> {
        let backend = WgpuBackend::with_options_async(&BackendOptions::default())
            .await
            .map_err(js_err)?;
        Ok(Engine {
            backend: Arc::new(backend),
            loaded: RefCell::new(None),
            busy: Cell::new(false),
            stop: Cell::new(false),
            sampling: Cell::new(SamplerConfig::default()),
        })
    }

    /// The adapter and the limits that decide which models fit, as JSON.
    pub fn device_info(&self) -> String {
        let l = self.backend.limits();
        serde_json::json!({
            "device": self.backend.device_name(),
            "driver": self.backend.driver_info(),
            "limits": {
                "maxBufferSize": l.max_buffer_size,
                "maxStorageBufferBindingSize": l.max_storage_buffer_binding_size,
                "maxComputeInvocationsPerWorkgroup": l.max_compute_invocations_per_workgroup,
                "maxComputeWorkgroupStorageSize": l.max_compute_workgroup_storage_size,
                "maxComputeWorkgroupsPerDimension": l.max_compute_workgroups_per_dimension,
            },
        })
        .to_string()
    }

    /// Bytes of wasm linear memory. It only ever grows, so this is the peak of the heap.
    pub fn wasm_memory_bytes() -> f64 {
        wasm_bindgen::memory()
            .unchecked_into::<js_sys::WebAssembly::Memory>()
            .buffer()
            .unchecked_into::<js_sys::ArrayBuffer>()
            .byte_length() as f64
    }

    /// Load a GGUF `File`/`Blob`, replacing any loaded model: the header from a prefix, then each
    /// tensor streamed to the device. `on_progress(done_bytes, total_bytes)` is called as tensor
    /// bytes are uploaded. `n_ctx` 0 means the default context (4096). Returns the model's
    /// description as JSON.
    pub async fn load(
        &self,
        blob: web_sys::Blob,
        n_ctx: u32,
        on_progress: js_sys::Function,
    ) -> std::result::Result<String, JsError> {
        let _busy = self.begin()?;
        // Free the old model's device memory before the new one arrives.
        self.loaded.replace(None);
        let file = read_header(&blob).await.map_err(js_err)?;
        // The limit by WebGPU's name, as the browser's adapter reports it. A tensor larger than
        // one storage binding is bound in pieces, but it must fit one buffer. (The loader checks
        // every tensor against the backend's own rules again before uploading any.)
        let limits = [("maxBufferSize", self.backend.limits().max_buffer_size)];
        check_tensor_sizes(&file, &limits)
            .map_err(|e| js_err(format!("the model is too large for this browser's WebGPU adapter: {e}")))?;
        let tokenizer = Tokenizer::from_gguf(&file).map_err(js_err)?;
        let total: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
        let mut done = 0u64;
        let mut progress = |n: u64| {
            done += n;
            // A throwing callback must not abort the load.
            let _ = on_progress.call2(&JsValue::NULL, &(done as f64).into(), &(total as f64).into());
        };
        let backend: Arc<dyn Backend> = self.backend.clone();
        let model = Model::load_async(&file, &BlobSource { blob }, backend, &mut progress)
            .await
            .map_err(js_err)?;
        let n_ctx = if n_ctx == 0 { DEFAULT_CTX } else { n_ctx as usize };
        let session = model.new_session(n_ctx).map_err(js_err)?;
        let cfg = &model.config;
        let info = serde_json::json!({
            "name": cfg.name,
            "arch": cfg.arch.gguf_name(),
            "layers": cfg.n_layer,
            "embedding": cfg.n_embd,
            "vocab": cfg.n_vocab,
            "context": n_ctx,
            "fileBytes": file.file_len(),
            "tensorBytes": total,
        })
        .to_string();
        self.loaded.replace(Some(Loaded {
            model,
            tokenizer,
            session,
            fed: Vec::new(),
        }));
        Ok(info)
    }

    /// Token ids of `text`; `parse_special` turns `<|im_start|>` etc. into their tokens.
    pub fn tokenize(&self, text: &str, parse_special: bool) -> std::result::Result<Vec<u32>, JsError> {
        self.with_loaded(|l| Ok(l.tokenizer.encode(text, parse_special)))
    }

    /// The prompt of a chat, `[{"role": "user", "content": "..."}, ...]` as JSON, in the Qwen3.5
    /// template with an open assistant turn, as token ids.
    pub fn chat_tokens(&self, messages_json: &str, enable_thinking: bool) -> std::result::Result<Vec<u32>, JsError> {
        let messages = parse_messages(messages_json).map_err(js_err)?;
        self.with_loaded(|l| chat_prompt(&l.tokenizer, &messages, enable_thinking))
    }

    /// Set the sampling parameters of the next generations (temperature 0 is greedy, computed on
    /// the device).
    pub fn set_sampling(
        &self,
        temperature: f32,
        top_k: u32,
        top_p: f32,
        min_p: f32,
        repeat_penalty: f32,
        seed: u32,
    ) -> std::result::Result<(), JsError> {
        let cfg = SamplerConfig {
            temperature,
            top_k: top_k as usize,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n: 64,
            seed: seed.into(),
        };
        cfg.validate().map_err(js_err)?;
        self.sampling.set(cfg);
        Ok(())
    }

    /// Continue the conversation with `prompt` (token ids) and generate up to `max_tokens`,
    /// calling `on_token(id, text)` for each token as it comes (`text` is the newly complete
    /// UTF-8, possibly empty). When `prompt` extends the tokens already fed, only the new ones are
    /// run; otherwise the conversation starts over. Returns `{"prompt": fed, "generated": n,
    /// "finish": "eog" | "length" | "stopped"}` as JSON.
    pub async fn generate(
        &self,
        prompt: Vec<u32>,
        max_tokens: u32,
        on_token: js_sys::Function,
    ) -> std::result::Result<String, JsError> {
        let _busy = self.begin()?;
        self.stop.set(false);
        let mut loaded = self.loaded.take().ok_or_else(|| JsError::new("no model is loaded"))?;
        let result = self.run(&mut loaded, &prompt, max_tokens as usize, &on_token).await;
        if result.is_err() {
            // A failed step may have left the session half-updated.
            let _ = loaded.reset();
        }
        self.loaded.replace(Some(loaded));
        let (fed, generated, finish) = result.map_err(js_err)?;
        Ok(serde_json::json!({ "prompt": fed, "generated": generated, "finish": finish.name() }).to_string())
    }

    /// Ask a running `generate` to end after its current token.
    pub fn stop(&self) {
        self.stop.set(true);
    }

    /// Forget the conversation (the model stays loaded).
    pub fn reset(&self) -> std::result::Result<(), JsError> {
        if self.busy.get() {
            return Err(JsError::new("the engine is busy (stop the generation first)"));
        }
        match self.loaded.borrow_mut().as_mut() {
            Some(l) => l.reset().map_err(js_err),
            None => Ok(()),
        }
    }
}

impl Engine {
    fn begin(&self) -> std::result::Result<BusyGuard<'_>, JsError> {
        if self.busy.replace(true) {
            return Err(JsError::new("the engine is busy with another load or generation"));
        }
        Ok(BusyGuard(&self.busy))
    }

    fn with_loaded<T>(&self, f: impl FnOnce(&Loaded) -> Result<T>) -> std::result::Result<T, JsError> {
        match self.loaded.try_borrow().as_deref() {
            Ok(Some(l)) => f(l).map_err(js_err),
            Ok(None) if self.busy.get() => Err(JsError::new("the engine is busy with a load or generation")),
            _ => Err(JsError::new("no model is loaded")),
        }
    }

    /// The token loop of `generate`: returns (prompt tokens run, tokens generated, why it ended).
    async fn run(
        &self,
        l: &mut Loaded,
        prompt: &[u32],
        max_tokens: usize,
        on_token: &js_sys::Function,
    ) -> Result<(usize, usize, Finish)> {
        if prompt.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        // A recurrent state cannot be rewound: continue only if the prompt extends what was fed
        // (and adds at least one token, whose logits start the answer) and the rest fits.
        let common = l.fed.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let room = l.session.n_ctx.saturating_sub(l.session.pos);
        if common < l.fed.len() || common == prompt.len() || prompt.len() - common + max_tokens > room {
            l.reset()?;
        }
        let Loaded {
            model,
            tokenizer,
            session,
            fed,
        } = l;
        let new = &prompt[fed.len()..];
        if session.pos + new.len() + max_tokens > session.n_ctx {
            return Err(Error::ContextOverflow {
                prompt: session.pos + new.len(),
                generate: max_tokens,
                ctx: session.n_ctx,
            });
        }
        let mut sampler = Sampler::new(self.sampling.get())?;
        for &t in fed.iter().chain(new) {
            sampler.accept(t);
        }
        let mut next = if sampler.is_greedy() {
            model.prefill_greedy_async(session, new, &mut |_, _| {}).await?
        } else {
            let logits = model.prefill_async(session, new, Logits::Last, &mut |_, _| {}).await?;
            sampler.sample(&logits)?
        };
        fed.extend_from_slice(new);
        let mut dec = tokenizer.stream_decoder(false);
        let mut generated = 0;
        // Shows one generated token; what ends generation after it, if anything.
        let mut show = |t: u32| {
            generated += 1;
            let piece = dec.push(t);
            let _ = on_token.call2(&JsValue::NULL, &t.into(), &JsValue::from_str(&piece));
            if tokenizer.is_eog(t) {
                Some(Finish::Eog)
            } else if generated >= max_tokens {
                Some(Finish::Length)
            } else if self.stop.get() {
                Some(Finish::Stopped)
            } else {
                None
            }
        };
        let finish = if let Some(f) = show(next) {
            f
        } else if sampler.is_greedy() {
            // The host one step ahead of the device (`Model::generate_greedy_async`): the session
            // also consumes the token generation stopped at, and `fed` follows what it consumed.
            let pos0 = session.pos;
            let mut finish = Finish::Length;
            let toks = model
                .generate_greedy_async(session, next, max_tokens - 1, &mut |t| {
                    sampler.accept(t);
                    Ok(match show(t) {
                        Some(f) => {
                            finish = f;
                            false
                        }
                        None => true,
                    })
                })
                .await?;
            let consumed = session.pos - pos0;
            fed.push(next);
            fed.extend_from_slice(&toks[..consumed.saturating_sub(1).min(toks.len())]);
            finish
        } else {
            loop {
                let token = next;
                let logits = model.decode_async(session, token).await?;
                next = sampler.sample(&logits)?;
                fed.push(token);
                if let Some(f) = show(next) {
                    break f;
                }
            }
        };
        let tail = dec.finish();
        if !tail.is_empty() {
            let _ = on_token.call2(&JsValue::NULL, &JsValue::NULL, &JsValue::from_str(&tail));
        }
        Ok((new.len(), generated, finish))
    }
}

/// `[{"role": ..., "content": ...}, ...]`.
fn parse_messages(json: &str) -> Result<Vec<ChatMessage>> {
    let bad = |why: &str| Error::InvalidArgument(format!("chat messages: {why}"));
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| bad(&e.to_string()))?;
    let items = v.as_array().ok_or_else(|| bad("expected an array"))?;
    items
        .iter()
        .map(|m| {
            let field = |k: &str| {
                m.get(k)
                    .and_then(|x| x.as_str())
                    .ok_or_else(|| bad(&format!("each message needs a string '{k}'")))
            };
            Ok(ChatMessage::new(field("role")?, field("content")?))
        })
        .collect()
}

/// The chat prompt's tokens, as `rill run --chat` builds them: only the template's markers are
/// special, so `<|im_start|>` typed in a message stays text.
fn chat_prompt(tok: &Tokenizer, messages: &[ChatMessage], enable_thinking: bool) -> Result<Vec<u32>> {
    let opts = ChatOptions {
        add_generation_prompt: true,
        enable_thinking,
    };
    Ok(tok.encode_chat(&render_chat_prompt(messages, &[], opts)?).tokens)
}
