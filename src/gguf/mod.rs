//! GGUF container: reader (zero-copy over memmap2 for tensors and metadata arrays, every size
//! checked) and writer (for `rill synth`).

mod bytes;
mod cursor;
pub mod reader;
pub mod types;
pub mod value;
pub mod writer;

pub use bytes::{Source, TensorBytes};
pub use reader::{GgufFile, TensorInfo};
pub use types::GgmlType;
pub use value::{Array, Value};
pub use writer::GgufWriter;
