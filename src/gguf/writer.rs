//! GGUF writer (version 3) for `rill synth` and tests: the header is serialized into one buffer
//! and written at once, then tensor data is streamed tensor by tensor, each padded to the alignment.

use std::collections::HashSet;
use std::io::Write;

use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use super::types::GgmlType;
use super::value::{Array, Value, MAX_NESTING};
use crate::error::{Error, GgufError, Result};

const VERSION: u32 = 3;
const MAX_DIMS: usize = 4;
const ZEROS: [u8; 4096] = [0; 4096];

struct PendingTensor {
    name: String,
    ne: Vec<u64>,
    ty: GgmlType,
    n_bytes: u64,
}

/// Builds a GGUF file: add KVs and tensor descriptions, write the header, then each tensor's data
/// in the order the tensors were added.
#[derive(Default)]
pub struct GgufWriter {
    kvs: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
    tensor_names: HashSet<String>,
    /// Index of the next tensor `write_tensor_data` expects.
    next_data: usize,
}

impl GgufWriter {
    /// An empty file; alignment 32 unless a `general.alignment` u32 KV is added.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a metadata pair. Adding an existing key replaces its value in place, so a file can
    /// never be written with duplicate keys.
    pub fn add_kv(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.kvs.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.kvs.push((key, value)),
        }
    }

    /// Describe a tensor (`ne` in ggml order, `ne[0]` contiguous); returns its index for
    /// `write_tensor_data`. Offsets are assigned in index order, each aligned.
    pub fn add_tensor(&mut self, name: impl Into<String>, ne: Vec<u64>, ty: GgmlType) -> Result<usize> {
        let name = name.into();
        let n_bytes = validated_size(&name, &ne, ty)?;
        if self.tensor_names.contains(&name) {
            return Err(GgufError::DuplicateTensor(name).into());
        }
        self.tensor_names.insert(name.clone());
        self.tensors.push(PendingTensor { name, ne, ty, n_bytes });
        Ok(self.tensors.len() - 1)
    }

    /// Bytes of tensor `index`'s data (0 for an index that was never returned by `add_tensor`).
    pub fn tensor_size(&self, index: usize) -> u64 {
        self.tensors.get(index).map_or(0, |t| t.n_bytes)
    }

    /// Write magic, version, counts, KVs, tensor infos and the padding up to the data section.
    pub fn write_header<W: Write>(&self, w: &mut W) -> Result<()> {
        let alignment = self.alignment()?;
        let buf = self.encode_header(alignment)?;
        w.write_all(&buf)?;
        Ok(())
    }

    /// Write tensor `index`'s data followed by zero padding to the next aligned offset.
    /// Tensors must be written in index order and `data` must be exactly `tensor_size(index)` bytes.
    pub fn write_tensor_data<W: Write>(&mut self, w: &mut W, index: usize, data: &[u8]) -> Result<()> {
        if index != self.next_data {
            return Err(Error::InvalidArgument(format!(
                "GGUF writer: tensor {index} written out of order (expected tensor {})",
                self.next_data
            )));
        }
        let Some(t) = self.tensors.get(index) else {
            return Err(Error::InvalidArgument(format!(
                "GGUF writer: no tensor with index {index}"
            )));
        };
        if data.len() as u64 != t.n_bytes {
            return Err(Error::InvalidArgument(format!(
                "GGUF writer: tensor '{}' needs {} bytes, got {}",
                t.name,
                t.n_bytes,
                data.len()
            )));
        }
        let pad = padding(t.n_bytes, self.alignment()?);
        w.write_all(data)?;
        write_zeros(w, pad)?;
        self.next_data += 1;
        Ok(())
    }

    /// The alignment the file will use, validated like the reader does.
    fn alignment(&self) -> Result<u64> {
        let Some((_, value)) = self.kvs.iter().find(|(k, _)| k == ALIGNMENT_KEY) else {
            return Ok(DEFAULT_ALIGNMENT);
        };
        match *value {
            Value::U32(a) if a.is_power_of_two() => Ok(a.into()),
            Value::U32(a) => Err(GgufError::BadAlignment(a.into()).into()),
            _ => Err(GgufError::BadAlignmentType(value.type_name().to_owned()).into()),
        }
    }

    fn encode_header(&self, alignment: u64) -> Result<Vec<u8>> {
        let mut buf = Vec::with_capacity(self.header_size_hint());
        put_u32(&mut buf, GGUF_MAGIC);
        put_u32(&mut buf, VERSION);
        put_u64(&mut buf, self.tensors.len() as u64);
        put_u64(&mut buf, self.kvs.len() as u64);
        for (key, value) in &self.kvs {
            put_str(&mut buf, key);
            put_u32(&mut buf, value.type_id());
            put_value(&mut buf, key, value, 0)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut buf, &t.name);
            put_u32(&mut buf, t.ne.len() as u32);
            for &d in &t.ne {
                put_u64(&mut buf, d);
            }
            put_u32(&mut buf, t.ty.id());
            put_u64(&mut buf, offset);
            offset = offset
                .checked_add(t.n_bytes + padding(t.n_bytes, alignment))
                .ok_or_else(|| GgufError::SizeOverflow { name: t.name.clone() })?;
        }
        let pad = padding(buf.len() as u64, alignment) as usize;
        buf.resize(buf.len() + pad, 0);
        Ok(buf)
    }

    /// A rough header size so the buffer for a 250k-token vocabulary is allocated once.
    fn header_size_hint(&self) -> usize {
        let kv: usize = self.kvs.iter().map(|(k, v)| 12 + k.len() + value_size_hint(v)).sum();
        let tensors: usize = self.tensors.iter().map(|t| 24 + t.name.len() + 8 * t.ne.len()).sum();
        24 + kv + tensors + 64
    }
}

/// Validate a tensor shape the way the reader will and return its byte size.
fn validated_size(name: &str, ne: &[u64], ty: GgmlType) -> Result<u64> {
    if ne.is_empty() || ne.len() > MAX_DIMS {
        return Err(GgufError::BadDims {
            name: name.to_owned(),
            n_dims: ne.len() as u32,
        }
        .into());
    }
    let mut n_elements: u64 = 1;
    for (dim, &d) in ne.iter().enumerate() {
        n_elements = match n_elements.checked_mul(d) {
            Some(n) if d != 0 => n,
            _ => {
                return Err(GgufError::BadShape {
                    name: name.to_owned(),
                    dim,
                }
                .into())
            }
        };
    }
    if !ne[0].is_multiple_of(ty.block_size()) {
        return Err(GgufError::RowNotBlockMultiple {
            name: name.to_owned(),
            ne0: ne[0],
            type_name: ty.name().to_owned(),
            block: ty.block_size(),
        }
        .into());
    }
    let overflow = || GgufError::SizeOverflow { name: name.to_owned() };
    let row = ty.row_size(ne[0]).ok_or_else(overflow)?;
    Ok(ne[1..]
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?)
}

/// Zero bytes needed after `len` bytes to reach a multiple of `alignment` (a power of two).
fn padding(len: u64, alignment: u64) -> u64 {
    (alignment - len % alignment) % alignment
}

fn write_zeros<W: Write>(w: &mut W, mut n: u64) -> Result<()> {
    while n > 0 {
        let chunk = n.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..chunk])?;
        n -= chunk as u64;
    }
    Ok(())
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    put_u64(buf, s.len() as u64);
    buf.extend_from_slice(s.as_bytes());
}

/// Encode a value body (without its type id). `depth` is the number of enclosing arrays.
fn put_value(buf: &mut Vec<u8>, key: &str, value: &Value, depth: usize) -> Result<()> {
    match value {
        Value::U8(v) => buf.push(*v),
        Value::I8(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => buf.push(u8::from(*v)),
        Value::String(s) => put_str(buf, s),
        Value::Array(items) => put_array(buf, key, items, depth + 1)?,
        Value::U64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => buf.extend_from_slice(&v.to_le_bytes()),
    }
    Ok(())
}

/// Encode an array body. Arrays read from a file are copied as they are (they were validated
/// when read); arrays built in memory must be homogeneous.
fn put_array(buf: &mut Vec<u8>, key: &str, a: &Array, depth: usize) -> Result<()> {
    if depth > MAX_NESTING {
        return Err(GgufError::NestingTooDeep(MAX_NESTING).into());
    }
    let elem_ty = a.elem_type_id();
    put_u32(buf, elem_ty);
    put_u64(buf, a.len() as u64);
    if let Some(raw) = a.encoded_flat() {
        buf.extend_from_slice(raw);
        return Ok(());
    }
    let mut put_item = |item: &Value| {
        if item.type_id() != elem_ty {
            return Err(Error::InvalidArgument(format!(
                "GGUF writer: array '{key}' mixes element types"
            )));
        }
        put_value(buf, key, item, depth)
    };
    match a.values() {
        Some(items) => items.iter().try_for_each(&mut put_item),
        // Nested arrays read from a file: re-encoded so their depth is checked here too.
        None => a.iter().try_for_each(|item| put_item(&item)),
    }
}

fn value_size_hint(v: &Value) -> usize {
    match v {
        Value::String(s) => 8 + s.len(),
        Value::Array(a) => {
            12 + match (a.encoded_len(), a.values()) {
                (Some(n), _) => n,
                (None, Some(items)) => items.iter().map(value_size_hint).sum::<usize>(),
                (None, None) => 0,
            }
        }
        _ => 8,
    }
}
