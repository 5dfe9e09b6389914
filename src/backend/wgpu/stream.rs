//! Weights whose bytes arrive in pieces (`Backend::begin_weight`): the browser streams each tensor
//! from a `File` it cannot map, so no whole tensor ever sits in wasm memory.

use super::buffer::{self, WgpuBuffer};
use super::{gpu_err, WgpuBackend};
use crate::backend::{DType, Tensor, WeightUpload};
use crate::error::Result;
use crate::gguf::GgmlType;

/// Each piece is queued straight into the weight's device buffer, so the host holds one piece at
/// a time.
pub(crate) struct StreamedWeight<'a> {
    be: &'a WgpuBackend,
    buffer: WgpuBuffer,
    name: String,
    ggml_type: GgmlType,
    shape: Vec<usize>,
    /// Bytes the weight has.
    len: u64,
    /// Bytes written so far.
    written: u64,
}

impl<'a> StreamedWeight<'a> {
    pub(crate) fn new(be: &'a WgpuBackend, name: &str, ggml_type: GgmlType, shape: &[usize]) -> Result<Self> {
        let cols = shape.last().copied().unwrap_or(0) as u64;
        let rows = (buffer::elements(shape)? as u64) / cols.max(1);
        let len = ggml_type
            .row_size(cols)
            .and_then(|r| r.checked_mul(rows))
            .ok_or_else(|| {
                gpu_err(format!(
                    "weight '{name}': shape {shape:?} is not whole {ggml_type} blocks"
                ))
            })?;
        // The same limits as a whole upload (`buffer::upload_weight`).
        be.check_weight(name, ggml_type, shape, len)?;
        let buffer = buffer::create(be, name, len, false)?;
        Ok(StreamedWeight {
            be,
            buffer,
            name: name.to_string(),
            ggml_type,
            shape: shape.to_vec(),
            len,
            written: 0,
        })
    }
}

impl WeightUpload for StreamedWeight<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let end = self.written + bytes.len() as u64;
        if end > self.len {
            return Err(gpu_err(format!(
                "weight '{}': {end} bytes written, the tensor has {}",
                self.name, self.len
            )));
        }
        // Device copies go by whole words: only the final piece may end mid-word (the buffer
        // is padded), and it is copied with its padding.
        if !self.written.is_multiple_of(4) {
            return Err(gpu_err(format!(
                "weight '{}': a piece of {} bytes follows one that was not a multiple of 4",
                self.name,
                bytes.len()
            )));
        }
        if bytes.len().is_multiple_of(4) {
            self.be.queue.write_buffer(&self.buffer.buffer, self.written, bytes);
        } else {
            let mut padded_piece = bytes.to_vec();
            padded_piece.resize(buffer::words(bytes.len() as u64) as usize, 0);
            self.be
                .queue
                .write_buffer(&self.buffer.buffer, self.written, &padded_piece);
        }
        self.written = end;
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<Tensor> {
        if self.written != self.len {
            return Err(gpu_err(format!(
                "weight '{}': {} of its {} bytes were written",
                self.name, self.written, self.len
            )));
        }
        Ok(buffer::tensor(self.buffer, DType::Ggml(self.ggml_type), &self.shape))
    }
}
