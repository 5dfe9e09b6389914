//! Shared CLI plumbing: backend selection, model loading with a progress bar.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};

use crate::backend;
use crate::error::Result;
use crate::exec::Model;
use crate::gguf::GgufFile;
use crate::model::Config;
use crate::tokenizer::Tokenizer;

/// A model and its tokenizer, ready to run.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
}

/// Open `path`, build the tokenizer, and upload the weights to `backend_name`, showing a progress
/// bar on a terminal.
pub fn load(path: &Path, backend_name: &str) -> Result<Loaded> {
    // Parse the file before starting a (possibly slow) device, so bad files fail fast.
    let file = GgufFile::open(path)?;
    let in_model = |e: crate::Error| e.in_model(path);
    let tokenizer = Tokenizer::from_gguf(&file).map_err(in_model)?;
    Config::from_gguf(&file)
        .and_then(|c| c.check_tokenizer_size(tokenizer.vocab_size()))
        .map_err(in_model)?;
    let be = backend::create(backend_name)?;
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
