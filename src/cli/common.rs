//! Shared CLI plumbing: backend and sampling flags, model loading with a progress bar.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::{self, BackendOptions, Precision};
use crate::error::Result;
use crate::exec::Model;
use crate::gguf::GgufFile;
use crate::model::Config;
use crate::sample::SamplerConfig;
use crate::tokenizer::Tokenizer;

/// A model and its tokenizer, ready to run.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
}

/// The device flags of every command that runs a model: which backend, at which precision tier.
#[derive(Args, Clone, Debug)]
pub struct BackendArgs {
    /// Compute backend: auto (cuda if this build has it and an NVIDIA GPU is present, else a GPU
    /// through wgpu, else cpu), cpu, wgpu, cuda.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Precision tier: fast (the default: a backend's faster kernels, e.g. tensor-core prefill
    /// with f16-rounded activations on cuda, which stays far closer to exact math than llama.cpp's
    /// quantized activations; backends without them run exact) or exact (f32 arithmetic on
    /// dequantized weights, the strict tier of the test fixtures). Every speed report names the
    /// tier it ran at.
    #[arg(long, default_value = "fast", value_parser = parse_precision)]
    pub precision: Precision,
}

fn parse_precision(s: &str) -> std::result::Result<Precision, String> {
    s.parse::<Precision>().map_err(|e| e.to_string())
}

/// A backend and the precision tier it runs at, for speed reports: `cuda (fast)`.
pub fn backend_label(be: &dyn backend::Backend) -> String {
    format!("{} ({})", be.name(), be.precision().name())
}

impl BackendArgs {
    /// Start the chosen backend.
    pub fn create(&self) -> Result<Arc<dyn backend::Backend>> {
        backend::create_with(
            &self.backend,
            &BackendOptions {
                precision: self.precision,
                ..BackendOptions::default()
            },
        )
    }
}

/// The sampling flags of `rill run` and `rill chat`.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p times the most likely (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty over the last 64 tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Random seed (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler configuration, validated; without `--seed` the seed comes from the clock.
    pub fn config(&self) -> Result<SamplerConfig> {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        let cfg = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: 64,
            seed,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Open `path`, build the tokenizer, and upload the weights to the backend `dev` names, showing a
/// progress bar on a terminal.
pub fn load(path: &Path, dev: &BackendArgs) -> Result<Loaded> {
    // Parse the file before starting a (possibly slow) device, so bad files fail fast.
    let file = GgufFile::open(path)?;
    let in_model = |e: crate::Error| e.in_model(path);
    let tokenizer = Tokenizer::from_gguf(&file).map_err(in_model)?;
    Config::from_gguf(&file)
        .and_then(|c| c.check_tokenizer_size(tokenizer.vocab_size()))
        .map_err(in_model)?;
    let be = dev.create()?;
    let total: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let bar = progress_bar(total, "loading");
    let model = Model::load(&file, Arc::clone(&be), &mut |n| bar.inc(n)).map_err(in_model)?;
    bar.finish_and_clear();
    Ok(Loaded { model, tokenizer })
}

/// A byte-count progress bar on stderr, hidden when stderr is not a terminal.
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// A token-count progress bar on stderr (prefill), hidden when not a terminal or for short work.
pub fn token_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() || total < 256 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} tokens ({eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// Parse `1,2,3` into token ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .map_err(|_| crate::Error::InvalidArgument(format!("'{p}' is not a token id")))
        })
        .collect()
}

/// Positions are 32-bit on the devices, so no context can be longer (memory runs out far sooner).
pub const MAX_CONTEXT: usize = u32::MAX as usize;

/// Refuse a context longer than `MAX_CONTEXT`; `what` says where the request came from.
pub fn check_ctx(n_ctx: usize, what: impl FnOnce() -> String) -> Result<()> {
    if n_ctx > MAX_CONTEXT {
        return Err(crate::Error::InvalidArgument(format!(
            "{} needs a context of {n_ctx} tokens; rill supports at most {MAX_CONTEXT}",
            what()
        )));
    }
    Ok(())
}

/// The default context: the model's trained context, capped to keep the KV cache modest.
pub fn default_ctx(model: &Model, needed: usize) -> usize {
    model.config.context_length.clamp(1, 8192).max(needed)
}

/// Write `text` to stdout. A closed pipe (`rill info | head -1`) is not an error: the reader is
/// done, so the output simply stops.
pub fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(crate::Error::IoPlain(e)),
        _ => Ok(()),
    }
}
