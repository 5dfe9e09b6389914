//! `rill synth`: write a random-weight Qwen3.5 GGUF of a real model's exact layout, so that
//! benchmarks and load tests need no multi-GB downloads.
//!
//! * `shapes` — the table of model hyper-parameters;
//! * `layout` — the tensor list (names, `ne`, init) in converter order;
//! * `mix`    — the ggml type of each tensor for a `--quant` choice;
//! * `weights`— deterministic per-row random values;
//! * `pool`   — large K-quant tensors assembled from a pool of pre-quantized blocks;
//! * `write`  — metadata, tokenizer copy and the streaming generate → quantize → write loop.

mod layout;
mod mix;
mod pool;
mod shapes;
mod weights;
mod write;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use crate::error::{Error, Result};

pub use layout::{tensors, TensorSpec};
pub use mix::{fallback, quant_names, tensor_type, use_more_bits, Quant, TensorCtx};
pub use shapes::{shape, shape_names, ShapeParams};
pub use weights::{fill_row, Init};

/// The tokenizer `--tokenizer-from` defaults to: the real Qwen3 vocabulary.
pub const DEFAULT_TOKENIZER: &str = "tests/fixtures/qwen3-vocab.gguf";

/// What to synthesize (the `rill synth` command line).
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// A name from `shape_names()`.
    pub shape: String,
    /// A name from `quant_names()`.
    pub quant: String,
    /// Keep only the first N layers (the attention pattern is kept: every 4th layer is full).
    pub layers: Option<usize>,
    pub seed: u64,
    /// GGUF whose `tokenizer.*` keys are copied (tokens padded to the shape's vocabulary).
    pub tokenizer_from: PathBuf,
    pub output: PathBuf,
    /// Show a progress bar (bytes written) on stderr.
    pub progress: bool,
}

/// Tensors and bytes of one ggml type in the written file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeCount {
    pub tensors: usize,
    pub bytes: u64,
}

/// What `synthesize` wrote.
#[derive(Debug, Clone)]
pub struct SynthReport {
    pub path: PathBuf,
    /// Size of the whole file.
    pub bytes_written: u64,
    pub tensor_count: usize,
    /// Per ggml type name (`Q4_K`, `F32`, ...).
    pub type_mix: BTreeMap<String, TypeCount>,
    pub seconds: f64,
}

impl SynthReport {
    /// Write throughput in MB/s (10^6 bytes).
    pub fn mb_per_s(&self) -> f64 {
        self.bytes_written as f64 / 1e6 / self.seconds.max(1e-9)
    }
}

/// The shape of `opts`, shortened to `--layers` if given.
pub fn resolve_shape(name: &str, layers: Option<usize>) -> Result<ShapeParams> {
    let mut p = shape(name)?;
    if let Some(n) = layers {
        if n == 0 || n > p.n_layer {
            return Err(Error::InvalidArgument(format!(
                "--layers {n}: shape '{name}' has 1..={} layers",
                p.n_layer
            )));
        }
        p.n_layer = n;
    }
    Ok(p)
}

/// Write the GGUF described by `opts`.
pub fn synthesize(opts: &SynthOptions) -> Result<SynthReport> {
    let p = resolve_shape(&opts.shape, opts.layers)?;
    synthesize_params(&p, opts)
}

/// Write a GGUF of an explicit shape (tests and experiments with shapes outside the table);
/// `opts.shape` only names the model and `opts.layers` is ignored.
pub fn synthesize_params(p: &ShapeParams, opts: &SynthOptions) -> Result<SynthReport> {
    let start = Instant::now();
    let quant = Quant::parse(&opts.quant)?;
    let name = format!("synth {} {} ({} layers)", opts.shape, quant.name(), p.n_layer);
    let tokenizer = write::tokenizer_kvs(&opts.tokenizer_from, p.n_vocab)?;
    let (bytes_written, type_mix, tensor_count) = write::write_model(
        &opts.output,
        &write::Job {
            shape: p,
            quant,
            seed: opts.seed,
            name: &name,
            tokenizer,
            progress: opts.progress,
        },
    )?;
    Ok(SynthReport {
        path: opts.output.clone(),
        bytes_written,
        tensor_count,
        type_mix,
        seconds: start.elapsed().as_secs_f64(),
    })
}
