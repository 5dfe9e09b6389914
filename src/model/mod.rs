//! Model description: hyper-parameters (`config`) and weight binding (`weights`) for qwen35 / qwen35moe.

pub mod config;
pub mod weights;

pub use config::{Arch, Config, MoeConfig};
pub use weights::Weights;
