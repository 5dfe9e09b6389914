//! `rill synth`: write a real-shaped GGUF with random weights.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::synth::{synthesize, SynthOptions};

#[derive(Args)]
pub struct SynthArgs {
    /// Model shape (e.g. qwen3.5-9b, qwen3.5-35b-a3b, tiny-dense).
    #[arg(long)]
    shape: String,
    /// Quantization: f16, bf16, q8_0, q4_k_m, q6_k.
    #[arg(long)]
    quant: String,
    /// Output GGUF file.
    #[arg(short, long)]
    output: PathBuf,
    /// Keep only the first N layers.
    #[arg(long)]
    layers: Option<usize>,
    /// Random seed for the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// GGUF whose tokenizer is copied (padded to the shape's vocabulary size).
    #[arg(long, default_value = "tests/fixtures/qwen3-vocab.gguf")]
    tokenizer_from: PathBuf,
}

pub fn run(a: SynthArgs) -> Result<()> {
    let report = synthesize(&SynthOptions {
        shape: a.shape,
        quant: a.quant,
        layers: a.layers,
        seed: a.seed,
        tokenizer_from: a.tokenizer_from,
        output: a.output.clone(),
        progress: true,
    })?;
    eprintln!("wrote {} ({report:?})", a.output.display());
    Ok(())
}
