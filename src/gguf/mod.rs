//! GGUF container: reader (zero-copy over memmap2, every size checked) and writer (for `rill synth`).

mod bytes;
pub mod reader;
pub mod types;
pub mod value;
pub mod writer;

pub use bytes::{Source, TensorBytes};
pub use reader::{GgufFile, TensorInfo};
pub use types::GgmlType;
pub use value::Value;
pub use writer::GgufWriter;
