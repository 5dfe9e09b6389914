//! Writing the file: metadata as the converter writes it, the tokenizer copied from another
//! GGUF, then every tensor generated, quantized and written in bounded batches of rows.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::mpsc;

use rayon::prelude::*;

use super::layout::{self, TensorSpec};
use super::mix::{self, Quant, TensorCtx};
use super::pool;
use super::shapes::{self, ShapeParams};
use super::weights;
use super::TypeCount;
use crate::error::{Error, Result};
use crate::gguf::reader::DEFAULT_ALIGNMENT;
use crate::gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};

/// Output bytes generated per batch: bounds memory (one batch in flight) while giving rayon
/// enough rows to spread over all cores.
const BATCH_BYTES: usize = 64 << 20;
/// Values per rayon task at least, so tiny rows (64-wide) do not drown in scheduling overhead.
const MIN_VALUES_PER_TASK: usize = 16 << 10;
/// Token type UNUSED (TOKENIZER.md §1), given to the `[PAD<id>]` filler tokens.
const TOKEN_TYPE_UNUSED: i32 = 5;

/// Everything `write_model` needs besides the output path.
pub struct Job<'a> {
    pub shape: &'a ShapeParams,
    pub quant: Quant,
    pub seed: u64,
    pub name: &'a str,
    /// `tokenizer.*` key/values, already padded to the shape's vocabulary.
    pub tokenizer: Vec<(String, Value)>,
    pub progress: bool,
}

/// The `tokenizer.*` keys of `path`, with the per-token arrays padded to `n_vocab` entries the
/// way the converter pads HF's vocabulary: `[PAD<id>]` tokens of type UNUSED, score 0.
pub fn tokenizer_kvs(path: &Path, n_vocab: usize) -> Result<Vec<(String, Value)>> {
    let src = GgufFile::open(path)?;
    let n_tokens = src
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .map(Array::len)
        .ok_or_else(|| Error::Tokenizer(format!("{}: no tokenizer.ggml.tokens array to copy", path.display())))?;
    if n_tokens > n_vocab {
        // Truncating would orphan merges and special-token ids; ask for a matching vocabulary.
        return Err(Error::InvalidArgument(format!(
            "{} has {n_tokens} tokens but the shape's vocabulary is {n_vocab}; use a tokenizer \
             with at most {n_vocab} tokens (e.g. tests/fixtures/tiny-dense.F16.gguf for the tiny shapes)",
            path.display()
        )));
    }
    let mut out = Vec::new();
    for (key, value) in src.metadata() {
        if !key.starts_with("tokenizer.") {
            continue;
        }
        let padded = match (key.as_str(), value) {
            ("tokenizer.ggml.tokens", Value::Array(a)) => pad(a, n_vocab, |id| Value::String(format!("[PAD{id}]"))),
            ("tokenizer.ggml.token_type", Value::Array(a)) => pad(a, n_vocab, |_| Value::I32(TOKEN_TYPE_UNUSED)),
            ("tokenizer.ggml.scores", Value::Array(a)) => pad(a, n_vocab, |_| Value::F32(0.0)),
            _ => value.clone(),
        };
        out.push((key.clone(), padded));
    }
    Ok(out)
}

fn pad(a: &Array, n: usize, filler: impl Fn(usize) -> Value) -> Value {
    Value::Array(a.iter().chain((a.len()..n).map(filler)).collect())
}

/// Model metadata in the converter's key order (tests/fixtures/tiny-*.F16.gguf).
fn model_kvs(p: &ShapeParams, quant: Quant, name: &str) -> Vec<(String, Value)> {
    let a = p.arch;
    let k = |s: &str| format!("{a}.{s}");
    let u = |x: usize| Value::U32(x as u32);
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(name.into())),
        (k("block_count"), u(p.n_layer)),
        (k("context_length"), u(p.context_length)),
        (k("embedding_length"), u(p.n_embd)),
    ];
    if !p.is_moe() {
        kv.push((k("feed_forward_length"), u(p.n_ff)));
    }
    kv.extend([
        (k("attention.head_count"), u(p.n_head)),
        (k("attention.head_count_kv"), u(p.n_head_kv)),
        (
            k("rope.dimension_sections"),
            Value::Array(shapes::ROPE_SECTIONS.iter().map(|&s| Value::I32(s)).collect()),
        ),
        (k("rope.freq_base"), Value::F32(p.rope_theta)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(shapes::RMS_EPS)),
    ]);
    if p.is_moe() {
        kv.push((k("expert_count"), u(p.n_expert)));
        kv.push((k("expert_used_count"), u(p.n_expert_used)));
    }
    kv.extend([
        (k("attention.key_length"), u(p.head_dim)),
        (k("attention.value_length"), u(p.head_dim)),
        ("general.file_type".into(), Value::U32(quant.file_type())),
    ]);
    if p.is_moe() {
        kv.push((k("expert_feed_forward_length"), u(p.n_ff_exp)));
        kv.push((k("expert_shared_feed_forward_length"), u(p.n_ff_shexp)));
    }
    kv.extend([
        (k("ssm.conv_kernel"), u(p.conv_kernel)),
        (k("ssm.state_size"), u(p.dk)),
        (k("ssm.group_count"), u(p.hk)),
        (k("ssm.time_step_rank"), u(p.hv)),
        (k("ssm.inner_size"), u(p.value_dim())),
        (
            k("attention.recurrent_layers"),
            Value::Array((0..p.n_layer).map(|i| Value::Bool(!p.is_full_attention(i))).collect()),
        ),
        (k("full_attention_interval"), u(shapes::FULL_ATTENTION_INTERVAL)),
        (k("rope.dimension_count"), u(shapes::ROPE_DIMS)),
        ("general.quantization_version".into(), Value::U32(2)),
    ]);
    kv
}

/// A tensor with its chosen type and the seed of its row streams.
struct Planned {
    spec: TensorSpec,
    ty: GgmlType,
    seed: u64,
}

fn plan(job: &Job) -> Vec<Planned> {
    let p = job.shape;
    layout::tensors(p)
        .into_iter()
        .map(|spec| {
            let ty = mix::tensor_type(
                job.quant,
                &TensorCtx {
                    name: &spec.name,
                    ne: &spec.ne,
                    layer: spec.layer,
                    n_layer: p.n_layer,
                    tied: p.tied,
                    n_expert: p.n_expert,
                },
            );
            let seed = weights::tensor_seed(job.seed, &spec.name);
            Planned { spec, ty, seed }
        })
        .collect()
}

/// Write the whole file; returns (file bytes, type mix, tensor count).
pub fn write_model(path: &Path, job: &Job) -> Result<(u64, BTreeMap<String, TypeCount>, usize)> {
    let planned = plan(job);
    let mut gw = GgufWriter::new();
    for (key, value) in model_kvs(job.shape, job.quant, job.name)
        .into_iter()
        .chain(job.tokenizer.iter().cloned())
    {
        gw.add_kv(key, value);
    }
    let mut mix_counts: BTreeMap<String, TypeCount> = BTreeMap::new();
    let mut data_bytes = 0u64;
    for t in &planned {
        let i = gw.add_tensor(&t.spec.name, t.spec.ne.clone(), t.ty)?;
        let size = gw.tensor_size(i);
        data_bytes += size;
        let c = mix_counts.entry(t.ty.name().to_string()).or_default();
        c.tensors += 1;
        c.bytes += size;
    }

    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let mut w = CountingWriter {
        inner: BufWriter::with_capacity(8 << 20, file),
        written: 0,
    };
    gw.write_header(&mut w)?;

    let padded_total: u64 = (0..planned.len())
        .map(|i| gw.tensor_size(i) + padding(gw.tensor_size(i)))
        .sum();
    debug_assert!(padded_total >= data_bytes);
    let bar = progress_bar(job.progress, padded_total);

    // Generation (all cores, rayon) overlaps with writing (this scoped thread): two buffers
    // circulate, so at most 2 × BATCH_BYTES of output is in memory.
    let written = std::thread::scope(|s| -> Result<u64> {
        let (full_tx, full_rx) = mpsc::sync_channel::<Vec<u8>>(1);
        let (empty_tx, empty_rx) = mpsc::channel::<Vec<u8>>();
        for _ in 0..2 {
            // Cannot fail: the receiver is alive.
            let _ = empty_tx.send(Vec::new());
        }
        let bar_w = bar.clone();
        let writer = s.spawn(move || -> Result<u64> {
            for buf in full_rx {
                w.write_all(&buf).map_err(|e| Error::io(path, e))?;
                bar_w.inc(buf.len() as u64);
                // The producer may already be gone after its last batch.
                let _ = empty_tx.send(buf);
            }
            w.flush().map_err(|e| Error::io(path, e))?;
            Ok(w.written)
        });
        let pipe = Pipe {
            full: full_tx,
            empty: empty_rx,
        };
        let produced = planned.iter().enumerate().try_for_each(|(i, t)| {
            let n = write_tensor(&pipe, t)?;
            // The header's offsets assume exactly tensor_size bytes plus alignment padding.
            if n == gw.tensor_size(i) {
                Ok(())
            } else {
                Err(Error::tensor(
                    &t.spec.name,
                    format!("generated {n} bytes, header says {}", gw.tensor_size(i)),
                ))
            }
        });
        drop(pipe);
        // A writer error is the root cause of a producer error (closed pipe), so report it first.
        let written = writer
            .join()
            .map_err(|_| Error::InvalidArgument("synth writer thread panicked".into()))??;
        produced?;
        Ok(written)
    });
    bar.finish_and_clear();
    let written = written.inspect_err(|_| {
        // Do not leave a truncated GGUF behind that a later run might try to load.
        let _ = std::fs::remove_file(path);
    })?;
    Ok((written, mix_counts, planned.len()))
}

/// The producer's end of the writer thread: hand over a full buffer, get an empty one back.
struct Pipe {
    full: mpsc::SyncSender<Vec<u8>>,
    empty: mpsc::Receiver<Vec<u8>>,
}

impl Pipe {
    fn take(&self) -> Result<Vec<u8>> {
        self.empty.recv().map_err(|_| pipe_closed())
    }
    fn send(&self, buf: Vec<u8>) -> Result<()> {
        self.full.send(buf).map_err(|_| pipe_closed())
    }
}

fn pipe_closed() -> Error {
    Error::InvalidArgument("synth writer thread stopped early".into())
}

/// Generate, quantize and send one tensor, `BATCH_BYTES` of output at a time, followed by its
/// alignment padding; returns the tensor's bytes (without padding).
///
/// `GgufWriter::write_tensor_data` takes a whole tensor at once, but the LM head of the real
/// shapes is up to ~1.3 GB, so synth streams the data section itself with the writer's rule:
/// data, then zeros to the next multiple of the alignment.
fn write_tensor(pipe: &Pipe, t: &Planned) -> Result<u64> {
    let ne0 = t.spec.row_len();
    let n_rows = t.spec.n_rows();
    let row_bytes =
        t.ty.row_size(ne0 as u64)
            .ok_or_else(|| Error::tensor(&t.spec.name, format!("{ne0} is not a multiple of the {} block", t.ty)))?
            as usize;
    let total = (n_rows * row_bytes) as u64;
    let rows_per_batch = (BATCH_BYTES / row_bytes.max(1)).clamp(1, n_rows.max(1));
    let min_rows_per_task = (MIN_VALUES_PER_TASK / ne0.max(1)).max(1);
    let pool = if pool::use_pool(t.ty, ne0, ne0 * n_rows) {
        Some(pool::BlockPool::new(t.ty, t.spec.init, t.seed)?)
    } else {
        None
    };
    let mut row0 = 0usize;
    while row0 < n_rows {
        let rows = rows_per_batch.min(n_rows - row0);
        let mut batch = pipe.take()?;
        // Every byte is overwritten below, so only grow (zero-filling) when needed.
        let need = rows * row_bytes;
        if batch.len() < need {
            batch.resize(need, 0);
        }
        batch.truncate(need);
        let rows_out = batch
            .par_chunks_mut(row_bytes)
            .with_min_len(min_rows_per_task)
            .enumerate();
        match &pool {
            Some(pool) => rows_out.for_each(|(j, out)| pool.fill_row(t.seed, (row0 + j) as u64, out)),
            None => rows_out.try_for_each_init(
                || vec![0f32; ne0],
                |vals, (j, out)| {
                    weights::fill_row(t.seed, (row0 + j) as u64, t.spec.init, vals);
                    crate::quant::quantize(t.ty, vals, out)
                        .map_err(|e| Error::tensor(&t.spec.name, format!("quantize to {}: {e}", t.ty)))
                },
            )?,
        }
        row0 += rows;
        if row0 == n_rows {
            batch.resize(need + padding(total) as usize, 0);
        }
        pipe.send(batch)?;
    }
    Ok(total)
}

/// Zeros after a tensor of `len` bytes up to the data alignment (synth never sets
/// `general.alignment`, so it is the default).
fn padding(len: u64) -> u64 {
    (DEFAULT_ALIGNMENT - len % DEFAULT_ALIGNMENT) % DEFAULT_ALIGNMENT
}

fn progress_bar(show: bool, total: u64) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Counts bytes on their way to the file, for the report.
struct CountingWriter<W: Write> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
