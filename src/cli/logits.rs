//! `rill logits`: float32 logits of every prompt position, written as safetensors.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};

use super::common;
use super::output::{self, Target};
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
    /// Prompt text (tokenized without special-token parsing). May start with '-'.
    #[arg(short, long, allow_hyphen_values = true)]
    prompt: Option<String>,
    /// Output safetensors file: `logits` F32 [T, vocab], `tokens` I32 [T]. An existing regular
    /// file (or the file a symbolic link points to) is replaced, keeping its permissions;
    /// devices, FIFOs and directories are refused.
    #[arg(short, long)]
    output: PathBuf,
    /// Feed the tokens one at a time (recurrent decode path) instead of one batched prefill.
    #[arg(long)]
    decode: bool,
    #[command(flatten)]
    device: common::BackendArgs,
}

pub fn run(a: LogitsArgs) -> Result<()> {
    // Refuse an unusable output before the (possibly slow) model load.
    let target = output::check_target(&a.output)?;
    let loaded = common::load(&a.model, &a.device)?;
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
    let n_logits = ids
        .len()
        .checked_mul(vocab)
        .ok_or_else(|| Error::InvalidArgument(format!("{} tokens x {vocab} logits overflow", ids.len())))?;
    let mut session = model.new_session(ids.len())?;
    let logits = if a.decode {
        let mut all = crate::alloc::vec_with_capacity(n_logits, "the logits")?;
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
    write_logits(&target, &ids, &logits, vocab)?;
    eprintln!("wrote logits [{}, {}] to {}", ids.len(), vocab, target.path().display());
    Ok(())
}

/// Stream a safetensors file (`logits` then `tokens`) without building it in memory.
fn write_logits(target: &Target, ids: &[u32], logits: &[f32], vocab: usize) -> Result<()> {
    let st = |e: safetensors::SafeTensorError| Error::SafeTensors(e.to_string());
    let lbytes = std::mem::size_of_val(logits);
    let tbytes = std::mem::size_of_val(ids);
    let info = |dtype, shape, start, len: usize| TensorInfo {
        dtype,
        shape,
        data_offsets: (start, start + len),
    };
    let metadata = Metadata::new(
        None,
        vec![
            (
                "logits".to_string(),
                info(Dtype::F32, vec![ids.len(), vocab], 0, lbytes),
            ),
            ("tokens".to_string(), info(Dtype::I32, vec![ids.len()], lbytes, tbytes)),
        ],
    )
    .map_err(st)?;
    let mut header = serde_json::to_string(&metadata)
        .map_err(|e| Error::SafeTensors(e.to_string()))?
        .into_bytes();
    // The format pads the header with spaces to a multiple of 8 bytes.
    header.resize(header.len().next_multiple_of(8), b' ');
    target.write(|w: &mut dyn Write| {
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        for v in logits {
            w.write_all(&v.to_le_bytes())?;
        }
        for &t in ids {
            w.write_all(&(t as i32).to_le_bytes())?;
        }
        Ok(())
    })
}
