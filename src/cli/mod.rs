//! The `rill` command line: one file per subcommand.

mod bench;
mod bench_serve;
mod chat;
mod common;
mod info;
mod logits;
mod output;
mod run;
mod saved_chat;
mod serve;
mod synth;
mod tokenize;

use clap::{Parser, Subcommand};

use crate::error::Result;

#[derive(Parser)]
#[command(
    name = "rill",
    version,
    about = "Qwen3.5 (Gated DeltaNet + gated attention) inference from GGUF files"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Run(run::RunArgs),
    /// Write the logits of every prompt position to a safetensors file.
    Logits(logits::LogitsArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::TokenizeArgs),
    /// Print a model's architecture, hyper-parameters and tensor type mix.
    Info(info::InfoArgs),
    /// Write a real-shaped GGUF with random weights (for benchmarks without downloads).
    Synth(synth::SynthArgs),
    /// Measure prompt-processing and generation speed (like llama-bench).
    Bench(bench::BenchArgs),
    /// Drive a running OpenAI-compatible server at a sweep of concurrencies: throughput, time to
    /// first token, inter-token latency (like vLLM's benchmark_serving).
    BenchServe(bench_serve::BenchServeArgs),
    /// Chat in the terminal (multi-turn, streaming; each turn runs only its new tokens).
    Chat(chat::ChatArgs),
    /// Serve an OpenAI-compatible HTTP API (chat, completions, tools, streaming).
    Serve(serve::ServeArgs),
}

/// Parse the command line and run it. Errors are returned for `main` to print as one line.
pub fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Info(a) => info::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Bench(a) => bench::run(a),
        Command::BenchServe(a) => bench_serve::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Serve(a) => serve::run(a),
    }
}
