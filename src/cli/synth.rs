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
    #[arg(long, default_value = crate::synth::DEFAULT_TOKENIZER)]
    tokenizer_from: PathBuf,
}

pub fn run(a: SynthArgs) -> Result<()> {
    // The file is written in place (synth output is large): refuse a FIFO (whose open would
    // block), a device or a directory before generating anything.
    super::output::check_target(&a.output)?;
    let report = synthesize(&SynthOptions {
        shape: a.shape,
        quant: a.quant,
        layers: a.layers,
        seed: a.seed,
        tokenizer_from: a.tokenizer_from,
        output: a.output.clone(),
        progress: true,
    })?;
    let mix: Vec<String> = report
        .type_mix
        .iter()
        .map(|(t, c)| format!("{t}: {} tensors", c.tensors))
        .collect();
    eprintln!(
        "wrote {}: {} tensors, {:.2} GB in {:.1} s ({:.0} MB/s); {}",
        a.output.display(),
        report.tensor_count,
        report.bytes_written as f64 / 1e9,
        report.seconds,
        report.mb_per_s(),
        mix.join(", ")
    );
    Ok(())
}
