//! A bounds-checked little-endian reader over GGUF bytes: every read checks the bytes present
//! before touching them, and every length is checked before anything is allocated.

use crate::error::GgufError;

pub(crate) type Parse<T> = std::result::Result<T, GgufError>;

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Offset of the next byte to read.
    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn file_len(&self) -> u64 {
        self.buf.len() as u64
    }

    pub fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// The next `n` bytes, or `Truncated` if the file ends first.
    pub fn take(&mut self, n: u64, what: &str) -> Parse<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what.to_owned(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.file_len(),
            });
        }
        // n <= remaining <= usize::MAX, so the cast and the slice are in bounds.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Parse<[u8; N]> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub fn u8(&mut self, what: &str) -> Parse<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u16(&mut self, what: &str) -> Parse<u16> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub fn u32(&mut self, what: &str) -> Parse<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, what: &str) -> Parse<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed UTF-8 string, borrowed from the buffer. A length larger than the whole
    /// file is reported as a corrupt length, a merely missing tail as truncation.
    pub fn str(&mut self, what: &str) -> Parse<&'a str> {
        let len_at = self.pos as u64;
        let len = self.u64(what)?;
        if len > self.file_len() {
            return Err(GgufError::ImpossibleLength {
                what: what.to_owned(),
                offset: len_at,
                len,
                file_len: self.file_len(),
            });
        }
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::BadUtf8 { offset })
    }

    /// Reject `count` items of at least `min_size` bytes each that cannot fit in the rest of the file.
    pub fn check_count(&self, what: &str, count: u64, min_size: u64) -> Parse<()> {
        match count.checked_mul(min_size) {
            Some(need) if need <= self.remaining() => Ok(()),
            _ => Err(GgufError::CountTooLarge {
                what: what.to_owned(),
                count,
                remaining: self.remaining(),
                file_len: self.file_len(),
            }),
        }
    }
}
