//! GGUF container: reader (zero-copy over memmap2, every size checked) and writer (for `rill synth`).

mod bytes;
pub mod types;

pub use bytes::{Source, TensorBytes};
pub use types::GgmlType;
