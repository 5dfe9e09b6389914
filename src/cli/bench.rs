//! `rill bench`: llama-bench-style speed measurement. Tests `pp<N>` (prompt processing of N
//! random tokens in a fresh session) and `tg<N>` (generating N tokens one at a time from a fresh
//! session, greedy on the device), and with `--batch` `tg<N> x<B>` (B sequences generating N
//! tokens each in one batched step per token, as llama-batched-bench's S_TG: tokens/s of all
//! sequences together); tokens/s as mean ± standard deviation over repetitions after a warm-up run.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::common;
use super::info::{human_bytes, type_mix};
use crate::error::{Error, Result};
use crate::exec::{Logits, Model};
use crate::gguf::GgufFile;

#[derive(Args)]
pub struct BenchArgs {
    /// GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    #[command(flatten)]
    device: common::BackendArgs,
    /// Prompt lengths to test (comma-separated; empty to skip).
    #[arg(short = 'p', long, default_value = "512")]
    prompts: String,
    /// Tokens to generate per tg test (comma-separated; 0 or empty to skip).
    #[arg(short = 'n', long, default_value = "128")]
    gens: String,
    /// Batch sizes of batched generation (comma-separated; empty to skip): B sequences
    /// generate the tg tests' N tokens each, one step of all B per token.
    #[arg(short = 'b', long, default_value = "")]
    batch: String,
    /// Repetitions per test.
    #[arg(short = 'r', long, default_value_t = 3)]
    reps: usize,
    /// Skip the warm-up run.
    #[arg(long)]
    no_warmup: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The commit this binary was built from (set by build.rs).
pub const COMMIT: &str = env!("RILL_GIT_COMMIT");

struct Row {
    test: String,
    n: usize,
    /// Sequences generating together (1 for pp and plain tg).
    batch: usize,
    samples: Vec<f64>,
}

impl Row {
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len().max(1) as f64
    }
    fn std(&self) -> f64 {
        let n = self.samples.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.samples.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

fn parse_list(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<usize>()
                .map_err(|_| Error::InvalidArgument(format!("'{p}' is not a count")))
        })
        .filter(|r| !matches!(r, Ok(0)))
        .collect()
}

/// Deterministic pseudo-random token ids (as llama-bench, content does not matter for speed).
/// `n` comes from the command line, so the buffer is allocated fallibly.
fn random_tokens(n: usize, vocab: usize, seed: u64) -> Result<Vec<u32>> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = crate::alloc::vec_with_capacity(n, "the benchmark prompt")?;
    out.extend((0..n).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % vocab as u64) as u32
    }));
    Ok(out)
}

/// B sequences, each from one random token, generating `n` tokens greedily in batched steps:
/// the tokens/s of all of them together.
fn time_batched(model: &Model, b: usize, n: usize, seed: u64) -> Result<f64> {
    let ctx = n
        .checked_add(1)
        .ok_or_else(|| Error::InvalidArgument(format!("tg{n}: too many tokens")))?;
    let mut pool = model.new_pool(b, ctx)?;
    let firsts = random_tokens(b, model.config.n_vocab, seed)?;
    let mut feed: Vec<(usize, u32)> = firsts.into_iter().enumerate().collect();
    let t0 = Instant::now();
    for _ in 0..n {
        let next = model.decode_rows_greedy(&mut pool, &feed)?;
        for ((_, tok), id) in feed.iter_mut().zip(next) {
            *tok = id.ok_or(Error::NonFiniteLogits)?;
        }
    }
    Ok((b * n) as f64 / t0.elapsed().as_secs_f64().max(1e-12))
}

fn time_pp(model: &Model, n: usize, seed: u64) -> Result<f64> {
    let toks = random_tokens(n, model.config.n_vocab, seed)?;
    let mut s = model.new_session(n)?;
    let t0 = Instant::now();
    model.prefill(&mut s, &toks, Logits::Last, &mut |_, _| {})?;
    Ok(n as f64 / t0.elapsed().as_secs_f64().max(1e-12))
}

fn time_tg(model: &Model, n: usize, seed: u64) -> Result<f64> {
    let ctx = n
        .checked_add(1)
        .ok_or_else(|| Error::InvalidArgument(format!("tg{n}: too many tokens")))?;
    let mut s = model.new_session(ctx)?;
    let first = random_tokens(1, model.config.n_vocab, seed)?[0];
    let t0 = Instant::now();
    // As `rill run` generates greedily: the host one step ahead of the device.
    let toks = model.generate_greedy(&mut s, first, n, &mut |_| Ok(true))?;
    if toks.len() != n {
        return Err(Error::Backend(format!("tg{n}: generated {} tokens", toks.len())));
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64().max(1e-12))
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.reps == 0 {
        return Err(Error::InvalidArgument("--reps must be at least 1".into()));
    }
    let pps = parse_list(&a.prompts)?;
    let tgs = parse_list(&a.gens)?;
    let batches = parse_list(&a.batch)?;
    let file = GgufFile::open(&a.model)?;
    let mix = type_mix(&file);
    let size: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let params: u64 = file.tensors.iter().map(|t| t.n_elements).sum();
    drop(file);
    let loaded = common::load(&a.model, &a.device)?;
    let model = &loaded.model;
    let be = model.backend();

    let mut rows = Vec::new();
    for &n in &pps {
        rows.push(measure(&a, format!("pp{n}"), n, 1, |seed| time_pp(model, n, seed))?);
    }
    for &n in &tgs {
        rows.push(measure(&a, format!("tg{n}"), n, 1, |seed| time_tg(model, n, seed))?);
    }
    for &b in &batches {
        for &n in &tgs {
            rows.push(measure(&a, format!("tg{n} x{b}"), n, b, |seed| {
                time_batched(model, b, n, seed)
            })?);
        }
    }

    let mix_s: Vec<String> = mix
        .iter()
        .map(|(t, c, b)| format!("{t}:{c} ({})", human_bytes(*b)))
        .collect();
    let cfg = &model.config;
    let model_desc = format!(
        "{} {} layers, d {}, vocab {}",
        cfg.arch.gguf_name(),
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_vocab
    );
    let mut o = String::new();
    if a.json {
        let tests: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "test": r.test, "n_tokens": r.n, "batch": r.batch, "tokens_per_s_mean": r.mean(),
                    "tokens_per_s_std": r.std(), "samples": r.samples,
                })
            })
            .collect();
        let v = serde_json::json!({
            "model": a.model.display().to_string(), "model_desc": model_desc, "size_bytes": size,
            "params": params, "type_mix": mix_s, "backend": be.name(), "precision": be.precision().name(), "device": be.device_name(),
            "driver": be.driver_info(), "commit": COMMIT, "reps": a.reps, "tests": tests,
        });
        writeln!(
            o,
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Error::InvalidArgument(e.to_string()))?
        )?;
        return common::emit(&o);
    }
    writeln!(o, "model:   {} ({model_desc})", a.model.display())?;
    writeln!(o, "size:    {} , {} params", human_bytes(size), params)?;
    writeln!(o, "types:   {}", mix_s.join(", "))?;
    writeln!(
        o,
        "backend: {} | precision: {} | device: {} | driver: {}",
        be.name(),
        be.precision().name(),
        be.device_name(),
        be.driver_info()
    )?;
    writeln!(
        o,
        "commit:  {COMMIT} | reps: {}{}",
        a.reps,
        if a.no_warmup { "" } else { " (after warm-up)" }
    )?;
    writeln!(o)?;
    writeln!(o, "| test | t/s | t/s per sequence |")?;
    writeln!(o, "|---|---|---|")?;
    for r in &rows {
        let per_seq = r.mean() / r.batch as f64;
        writeln!(o, "| {} | {:.2} ± {:.2} | {per_seq:.2} |", r.test, r.mean(), r.std())?;
    }
    common::emit(&o)
}

fn measure(a: &BenchArgs, test: String, n: usize, batch: usize, mut f: impl FnMut(u64) -> Result<f64>) -> Result<Row> {
    if !a.no_warmup {
        f(0)?;
    }
    let (cpu0, t0) = (thread_cpu_seconds(), Instant::now());
    let samples = (0..a.reps).map(|i| f(i as u64 + 1)).collect::<Result<Vec<_>>>()?;
    // How busy the host thread was (recording, submitting, waiting by spinning): near 100% means
    // the host, not the device, limits the test.
    let busy = match (cpu0, thread_cpu_seconds()) {
        (Some(c0), Some(c1)) => format!(
            " (host thread busy {:.0}% of the time)",
            100.0 * (c1 - c0) / t0.elapsed().as_secs_f64().max(1e-9)
        ),
        _ => String::new(),
    };
    let row = Row {
        test,
        n,
        batch,
        samples,
    };
    eprintln!("{}: {:.2} ± {:.2} tokens/s{busy}", row.test, row.mean(), row.std());
    Ok(row)
}

/// CPU time this thread has run, in seconds (Linux: /proc/thread-self/schedstat, nanoseconds);
/// `None` elsewhere.
fn thread_cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns * 1e-9)
}
