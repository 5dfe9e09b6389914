//! Whether a model's tensors fit a device's per-buffer limits, checked from the header before any
//! byte is uploaded: a browser's adapter may allow as little as 128 MiB per buffer or binding, and
//! a user should learn that before streaming gigabytes.

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// Fails on the largest tensor of `file` that exceeds one of `limits` (`(name, bytes)`, e.g.
/// WebGPU's `("maxStorageBufferBindingSize", 1 << 30)`), naming the tensor and the limit.
/// Sizes count whole u32 words, as device buffers do.
pub fn check_tensor_sizes(file: &GgufFile, limits: &[(&str, u64)]) -> Result<()> {
    let Some(t) = file.tensors.iter().max_by_key(|t| t.n_bytes) else {
        return Ok(());
    };
    let need = t.n_bytes.div_ceil(4) * 4;
    match limits.iter().find(|&&(_, have)| need > have) {
        Some(&(limit, have)) => Err(Error::OutOfMemory {
            what: format!("tensor '{}' in one buffer (this adapter's {limit})", t.name),
            needed: need,
            available: have,
        }),
        None => Ok(()),
    }
}
