//! Byte sources for GGUF data: a memory-mapped file or an owned buffer, shared by the zero-copy
//! views of tensors and metadata arrays.

use std::sync::Arc;

/// The bytes of a whole GGUF file.
pub enum Source {
    #[cfg(not(target_arch = "wasm32"))]
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Source {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            Source::Mmap(m) => m,
            Source::Owned(v) => v,
        }
    }
}

/// A zero-copy view of one tensor's (or metadata array's) bytes inside a shared `Source`.
#[derive(Clone)]
pub struct TensorBytes {
    src: Arc<Source>,
    start: usize,
    len: usize,
}

impl TensorBytes {
    /// A view of `src[start..start+len]`; `None` if the range is out of bounds.
    pub fn new(src: Arc<Source>, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        if end > src.as_slice().len() {
            return None;
        }
        Some(TensorBytes { src, start, len })
    }
    /// Wrap an owned buffer (tests, synthesized weights).
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        TensorBytes {
            src: Arc::new(Source::Owned(v)),
            start: 0,
            len,
        }
    }
    /// A view of `self[start..start+len]` sharing the same source; `None` if out of bounds.
    pub fn slice(&self, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        Some(TensorBytes {
            src: self.src.clone(),
            start: self.start + start,
            len,
        })
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.src.as_slice()[self.start..self.start + self.len]
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
