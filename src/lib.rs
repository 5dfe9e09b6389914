//! rill: an inference engine for Qwen3.5 hybrid models (Gated DeltaNet + gated attention) from GGUF files.

pub mod alloc;
pub mod backend;
pub mod cache;
pub mod cli;
pub mod error;
pub mod exec;
pub mod fsutil;
pub mod gguf;
pub mod model;
pub mod quant;
pub mod sample;
pub mod server;
pub mod synth;
pub mod tokenizer;

pub use error::{Error, Result};
