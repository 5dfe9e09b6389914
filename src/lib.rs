//! rill: an inference engine for Qwen3.5 hybrid models (Gated DeltaNet + gated attention) from GGUF files.

pub mod backend;
pub mod error;
pub mod gguf;
pub mod quant;
pub mod synth;

pub use error::{Error, Result};
