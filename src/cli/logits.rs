//! `rill logits`: float32 logits of every prompt position, written as safetensors.

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Args;
use safetensors::tensor::{Dtype, TensorView};

use super::common;
use crate::error::{Error, Result};
use crate::exec::Logits;

#[derive(Args)]
pub struct LogitsArgs {
    /// GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// Comma-separated token ids.
    #[arg(long, conflicts_with = "prompt", required_unless_present = "prompt")]
    tokens: Option<String>,
    /// Prompt text (tokenized without special-token parsing).
    #[arg(short, long)]
    prompt: Option<String>,
    /// Output safetensors file: `logits` F32 [T, vocab], `tokens` I32 [T].
    #[arg(short, long)]
    output: PathBuf,
    /// Feed the tokens one at a time (recurrent decode path) instead of one batched prefill.
    #[arg(long)]
    decode: bool,
    /// Compute backend: auto (cuda if this build has it and an NVIDIA GPU is present, else a GPU
    /// through wgpu, else cpu), cpu, wgpu, cuda.
    #[arg(long, default_value = "auto")]
    backend: String,
}

pub fn run(a: LogitsArgs) -> Result<()> {
    let loaded = common::load(&a.model, &a.backend)?;
    let model = &loaded.model;
    let ids = match (&a.tokens, &a.prompt) {
        (Some(t), _) => common::parse_ids(t)?,
        (None, Some(p)) => loaded.tokenizer.encode(p, false),
        (None, None) => return Err(Error::InvalidArgument("give --tokens or --prompt".into())),
    };
    if ids.is_empty() {
        return Err(Error::InvalidArgument("no tokens".into()));
    }
    let vocab = model.config.n_vocab;
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::InvalidArgument(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    let mut session = model.new_session(ids.len())?;
    let logits = if a.decode {
        let mut all = Vec::with_capacity(ids.len() * vocab);
        for &t in &ids {
            all.extend(model.decode(&mut session, t)?);
        }
        all
    } else {
        let bar = common::token_bar(ids.len() as u64, "prompt");
        let l = model.prefill(&mut session, &ids, Logits::All, &mut |d, _| bar.set_position(d as u64))?;
        bar.finish_and_clear();
        l
    };
    write_logits(&a.output, &ids, &logits, vocab)?;
    eprintln!("wrote logits [{}, {}] to {}", ids.len(), vocab, a.output.display());
    Ok(())
}

fn write_logits(path: &std::path::Path, ids: &[u32], logits: &[f32], vocab: usize) -> Result<()> {
    let lbytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tbytes: Vec<u8> = ids.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect();
    let st = |e: safetensors::SafeTensorError| Error::SafeTensors(e.to_string());
    let mut map = HashMap::new();
    map.insert(
        "logits".to_string(),
        TensorView::new(Dtype::F32, vec![ids.len(), vocab], &lbytes).map_err(st)?,
    );
    map.insert(
        "tokens".to_string(),
        TensorView::new(Dtype::I32, vec![ids.len()], &tbytes).map_err(st)?,
    );
    safetensors::serialize_to_file(&map, None, path).map_err(st)
}
