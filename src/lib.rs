//! rill: an inference engine for Qwen3.5 hybrid models (Gated DeltaNet + gated attention) from GGUF files.

pub mod alloc;
pub mod backend;
#[cfg(not(target_arch = "wasm32"))]
pub mod cache;
#[cfg(not(target_arch = "wasm32"))]
pub mod cli;
pub mod error;
pub mod exec;
pub mod fsutil;
pub mod gguf;
pub mod model;
pub mod quant;
pub mod sample;
#[cfg(not(target_arch = "wasm32"))]
pub mod server;
#[cfg(not(target_arch = "wasm32"))]
pub mod synth;
pub mod tokenizer;
#[cfg(all(feature = "web", target_arch = "wasm32"))]
pub mod web;

pub use error::{Error, Result};
