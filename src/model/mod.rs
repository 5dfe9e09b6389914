//! Model description: hyper-parameters (`config`) and weight binding (`weights`, reading tensor
//! bytes through a `source`) for qwen35 / qwen35moe.

pub mod config;
pub mod limits;
pub mod source;
pub mod weights;

pub use config::{Arch, Config, MoeConfig};
pub use source::TensorSource;
pub use weights::Weights;
