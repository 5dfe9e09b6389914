//! Where the weight loader reads tensor bytes from: the memory-mapped GGUF file itself (native),
//! or a file read piece by piece (the browser, which can neither map a file nor hold a model
//! larger than wasm's 4 GiB memory; src/web.rs streams a `Blob`).

use crate::backend::ReadFuture;
use crate::error::Error;
use crate::gguf::{GgufFile, TensorBytes};

/// Random access to the bytes of a GGUF file, possibly asynchronous.
pub trait TensorSource {
    /// Bytes `[start, start + len)` of the file (absolute offsets).
    fn read(&self, start: u64, len: usize) -> ReadFuture<'_, TensorBytes>;
    /// The largest read the loader should ask for at once. A source that hands out views of
    /// memory it already holds (a mapped file) reads whole tensors; one that copies the bytes in
    /// reads in pieces of this size, so its memory stays bounded by a piece, not a tensor.
    fn max_read(&self) -> usize {
        usize::MAX
    }
}

/// A parsed file reads its own bytes: zero-copy views of the memory map or buffer.
impl TensorSource for GgufFile {
    fn read(&self, start: u64, len: usize) -> ReadFuture<'_, TensorBytes> {
        let view = usize::try_from(start)
            .ok()
            .and_then(|s| TensorBytes::new(self.source().clone(), s, len))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "bytes {start}..+{len} are not in memory (the GGUF was parsed from a prefix of {} bytes; \
                     read its tensors through the file's own TensorSource)",
                    self.source().as_slice().len()
                ))
            });
        Box::pin(std::future::ready(view))
    }
}
