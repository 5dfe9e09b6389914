//! GGUF reader: one linear pass over the header, every count, length and offset checked against
//! the bytes actually present before anything is allocated; tensor data and metadata arrays stay
//! in the source (memory map or buffer) and are handed out as zero-copy views, so what the parse
//! materialises is bounded by the file's size and the limits below, never by a count in the file.
//! A file that cannot be mapped (the browser's) is parsed from a prefix that holds its header,
//! and its tensors are read later through a `model::TensorSource`.

use std::collections::HashMap;
#[cfg(not(target_arch = "wasm32"))]
use std::path::Path;
use std::sync::Arc;

use super::bytes::{Source, TensorBytes};
use super::cursor::{Cursor, Parse};
use super::types::GgmlType;
use super::value::read_value;
use super::value::Value;
use crate::error::{Error, GgufError, Result};

/// `GGUF` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Smallest possible encoded KV pair: empty key (u64 len), value type, a 1-byte value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Smallest possible encoded tensor info: empty name, n_dims, one dimension, type, offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 8 + 4 + 8;
const MAX_DIMS: u32 = 4;
/// Each KV and tensor info becomes a few hundred bytes in memory; these bound that however large
/// the file. Real models have tens of KVs and at most a few thousand tensors.
pub const MAX_KVS: u64 = 1 << 16;
pub const MAX_TENSORS: u64 = 1 << 20;

/// One tensor's description from the header, validated against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `ne[0]` is the contiguous (innermost) one.
    pub ne: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
    pub n_bytes: u64,
    pub n_elements: u64,
}

impl TensorInfo {
    /// Row-major shape, outermost dimension first (`ne` reversed).
    pub fn shape(&self) -> Vec<usize> {
        // Every ne fits in usize on 64-bit targets; on 32-bit a validated tensor's ne does too,
        // because its byte size fits in the file, which fits in the address space.
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed, fully validated GGUF file.
pub struct GgufFile {
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the data section (header end rounded up to `alignment`). In a file
    /// without tensors this may lie past the end, as such files may omit the final padding.
    pub data_start: u64,
    /// Tensors in file (header) order.
    pub tensors: Vec<TensorInfo>,
    /// Length of the whole file (more than the source holds when parsed from a prefix).
    file_len: u64,
    metadata: Vec<(String, Value)>,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
    src: Arc<Source>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("file_len", &self.file_len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse a GGUF file. `path` must name a regular file (a FIFO, device or
    /// directory is refused before anything reads from it).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let file = crate::fsutil::open_regular(path, "a model file")?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len == 0 {
            return Err(Error::BadPath {
                path: path.to_path_buf(),
                problem: "has size 0: it is empty, or a pseudo-file (such as those under /proc) \
                          whose contents cannot be memory-mapped"
                    .to_owned(),
            });
        }
        // SAFETY: the map is read-only. Like every mmap-based loader we accept that another
        // process truncating or rewriting the file while it is mapped is undefined behaviour.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::parse(Arc::new(Source::Mmap(map))).map_err(|e| match e {
            Error::Gguf(source) => Error::GgufFile {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    /// Parse a GGUF file held in memory (tests, files built on the fly).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(Arc::new(Source::Owned(bytes)))
    }

    /// Parse the header of a file of `file_len` bytes from its first bytes (`prefix`), for files
    /// that cannot be mapped (the browser's `File`). Every tensor range is checked against
    /// `file_len`; the tensor bytes themselves are read later through a `model::TensorSource`
    /// (`tensor_data` and `tensor_bytes` see only the prefix). `Ok(None)`: the header continues
    /// past the prefix, so call again with a longer one. A prefix as long as the file parses
    /// exactly like `from_bytes`.
    pub fn from_prefix(prefix: Vec<u8>, file_len: u64) -> Result<Option<GgufFile>> {
        let prefix_len = prefix.len() as u64;
        if prefix_len > file_len {
            return Err(Error::InvalidArgument(format!(
                "GGUF prefix of {prefix_len} bytes is longer than the file ({file_len} bytes)"
            )));
        }
        match Self::parse_with_len(Arc::new(Source::Owned(prefix)), file_len) {
            // The cursor ran off the prefix (or a count did not fit in it), not off the file.
            Err(Error::Gguf(GgufError::Truncated { .. } | GgufError::CountTooLarge { .. }))
                if prefix_len < file_len =>
            {
                Ok(None)
            }
            r => r.map(Some),
        }
    }

    fn parse(src: Arc<Source>) -> Result<GgufFile> {
        let len = src.as_slice().len() as u64;
        Self::parse_with_len(src, len)
    }

    fn parse_with_len(src: Arc<Source>, file_len: u64) -> Result<GgufFile> {
        let len = src.as_slice().len();
        let whole = TensorBytes::new(src.clone(), 0, len).ok_or(GgufError::Truncated {
            what: "file".to_owned(),
            offset: 0,
            needed: 0,
            file_len: len as u64,
        })?;
        let parsed = parse_header(&whole, file_len)?;
        Ok(GgufFile {
            version: parsed.version,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
            file_len,
            tensors: parsed.tensors,
            metadata: parsed.metadata,
            kv_index: parsed.kv_index,
            tensor_index: parsed.tensor_index,
            src,
        })
    }

    /// All metadata key/value pairs in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv_index
            .get(key)
            .and_then(|&i| self.metadata.get(i))
            .map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The bytes of a tensor of this file. Ranges were validated at parse time; a `TensorInfo`
    /// from another file that does not fit yields an empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        self.data_range(t)
            .and_then(|(start, end)| self.src.as_slice().get(start..end))
            .unwrap_or(&[])
    }

    /// A zero-copy view of a tensor's bytes that shares (and keeps alive) the file's source.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> TensorBytes {
        self.data_range(t)
            .and_then(|(start, end)| TensorBytes::new(self.src.clone(), start, end - start))
            .unwrap_or_else(|| TensorBytes::from_vec(Vec::new()))
    }

    /// The shared byte source (memory map or buffer) of the whole file.
    pub fn source(&self) -> &Arc<Source> {
        &self.src
    }

    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    fn data_range(&self, t: &TensorInfo) -> Option<(usize, usize)> {
        let start = self.data_start.checked_add(t.offset)?;
        let end = start.checked_add(t.n_bytes)?;
        Some((usize::try_from(start).ok()?, usize::try_from(end).ok()?))
    }
}

/// Everything the header yields, before it is attached to its source.
struct Parsed {
    version: u32,
    alignment: u64,
    data_start: u64,
    tensors: Vec<TensorInfo>,
    metadata: Vec<(String, Value)>,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

/// Parse the header at the start of `whole`, the first bytes of a file of `file_len` bytes.
fn parse_header(whole: &TensorBytes, file_len: u64) -> Result<Parsed> {
    let mut c = Cursor::new(whole.as_slice());
    let magic = c.u32("magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic).into());
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version).into());
    }
    let tensor_count = c.u64("tensor count")?;
    let kv_count = c.u64("metadata kv count")?;
    // Both counts are capped now and bounded by the bytes left before their table is read, so
    // a hostile count fails instead of driving a huge allocation or a long loop. The tensor
    // count is checked against the bytes after the KVs, so that a file cut inside its KVs is
    // reported as truncated there rather than as an impossible tensor count.
    check_limit("metadata kv", kv_count, MAX_KVS)?;
    check_limit("tensor", tensor_count, MAX_TENSORS)?;
    c.check_count("metadata kv", kv_count, MIN_KV_SIZE)?;

    let (metadata, kv_index) = read_metadata(&mut c, kv_count, whole)?;
    let alignment = alignment_of(&metadata, &kv_index)?;
    c.check_count("tensor", tensor_count, MIN_TENSOR_INFO_SIZE)?;
    let (tensors, tensor_index) = read_tensor_infos(&mut c, tensor_count, alignment)?;
    let data_start = data_start(c.pos() as u64, file_len, alignment, !tensors.is_empty())?;
    check_data_ranges(&tensors, data_start, file_len)?;
    check_no_overlap(&tensors)?;
    Ok(Parsed {
        version,
        alignment,
        data_start,
        tensors,
        metadata,
        kv_index,
        tensor_index,
    })
}

fn check_limit(what: &str, count: u64, max: u64) -> Parse<()> {
    if count > max {
        return Err(GgufError::TooMany {
            what: what.to_owned(),
            count,
            max,
        });
    }
    Ok(())
}

type Metadata = (Vec<(String, Value)>, HashMap<String, usize>);

fn read_metadata(c: &mut Cursor<'_>, count: u64, whole: &TensorBytes) -> Result<Metadata> {
    // `count` was capped and bounded by the file length, so these fit in memory.
    let n = count as usize;
    let mut kvs = crate::alloc::vec_with_capacity(n, "GGUF metadata")?;
    let mut index = crate::alloc::map_with_capacity(n, "GGUF metadata index")?;
    for i in 0..n {
        let key = crate::alloc::string(c.str("metadata key")?, "a GGUF metadata key")?;
        let ty = c.u32("metadata value type")?;
        let value = read_value(c, ty, &key, 0, whole)?;
        if index.insert(key.clone(), i).is_some() {
            return Err(GgufError::DuplicateKey(key).into());
        }
        kvs.push((key, value));
    }
    Ok((kvs, index))
}

/// `general.alignment` if present (must be a u32 power of two), else the default.
fn alignment_of(kvs: &[(String, Value)], index: &HashMap<String, usize>) -> Parse<u64> {
    let Some((_, value)) = index.get(ALIGNMENT_KEY).and_then(|&i| kvs.get(i)) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match *value {
        Value::U32(a) if a.is_power_of_two() => Ok(a.into()),
        Value::U32(a) => Err(GgufError::BadAlignment(a.into())),
        _ => Err(GgufError::BadAlignmentType(value.type_name().to_owned())),
    }
}

type Tensors = (Vec<TensorInfo>, HashMap<String, usize>);

fn read_tensor_infos(c: &mut Cursor<'_>, count: u64, alignment: u64) -> Result<Tensors> {
    // Capped and bounded by the file length.
    let n = count as usize;
    let mut tensors = crate::alloc::vec_with_capacity(n, "GGUF tensor infos")?;
    let mut index = crate::alloc::map_with_capacity(n, "GGUF tensor index")?;
    for i in 0..n {
        let t = read_tensor_info(c, alignment)?;
        if index.insert(t.name.clone(), i).is_some() {
            return Err(GgufError::DuplicateTensor(t.name).into());
        }
        tensors.push(t);
    }
    Ok((tensors, index))
}

fn read_tensor_info(c: &mut Cursor<'_>, alignment: u64) -> Result<TensorInfo> {
    let name = crate::alloc::string(c.str("tensor name")?, "a GGUF tensor name")?;
    let n_dims = c.u32("tensor n_dims")?;
    if !(1..=MAX_DIMS).contains(&n_dims) {
        return Err(GgufError::BadDims { name, n_dims }.into());
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        ne.push(c.u64("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let offset = c.u64("tensor offset")?;

    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType { name, type_id }.into());
    };
    let n_elements = element_count(&name, &ne)?;
    let n_bytes = byte_size(&name, &ne, ggml_type)?;
    if !offset.is_multiple_of(alignment) {
        return Err(GgufError::Misaligned {
            name,
            offset,
            align: alignment,
        }
        .into());
    }
    Ok(TensorInfo {
        name,
        ne,
        ggml_type,
        offset,
        n_bytes,
        n_elements,
    })
}

/// Product of the dimensions; each must be non-zero and the product must fit in u64.
fn element_count(name: &str, ne: &[u64]) -> Parse<u64> {
    let mut n: u64 = 1;
    for (dim, &d) in ne.iter().enumerate() {
        n = match n.checked_mul(d) {
            Some(p) if d != 0 => p,
            _ => {
                return Err(GgufError::BadShape {
                    name: name.to_owned(),
                    dim,
                })
            }
        };
    }
    Ok(n)
}

/// Bytes of the tensor: whole blocks per row times the number of rows.
fn byte_size(name: &str, ne: &[u64], ty: GgmlType) -> Parse<u64> {
    let ne0 = ne.first().copied().unwrap_or(1);
    if !ne0.is_multiple_of(ty.block_size()) {
        return Err(GgufError::RowNotBlockMultiple {
            name: name.to_owned(),
            ne0,
            type_name: ty.name().to_owned(),
            block: ty.block_size(),
        });
    }
    let overflow = || GgufError::SizeOverflow { name: name.to_owned() };
    let row = ty.row_size(ne0).ok_or_else(overflow)?;
    ne.iter()
        .skip(1)
        .try_fold(row, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)
}

/// Header end rounded up to the alignment. The padding must be present when tensors follow;
/// vocab-only files (no tensors) written by llama.cpp omit it, and ggml accepts that.
fn data_start(pos: u64, file_len: u64, alignment: u64, has_tensors: bool) -> Parse<u64> {
    // pos <= file length and alignment <= 2^31, so this cannot overflow u64.
    let start = pos.div_ceil(alignment) * alignment;
    if has_tensors && start > file_len {
        return Err(GgufError::Truncated {
            what: "padding before tensor data".to_owned(),
            offset: pos,
            needed: start - pos,
            file_len,
        });
    }
    Ok(start)
}

fn check_data_ranges(tensors: &[TensorInfo], data_start: u64, file_len: u64) -> Parse<()> {
    for t in tensors {
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_len => {}
            _ => {
                return Err(GgufError::DataOutOfBounds {
                    name: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        }
    }
    Ok(())
}

/// Sorted by offset, each tensor must end before the next begins.
fn check_no_overlap(tensors: &[TensorInfo]) -> Parse<()> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_unstable_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // Ranges were checked against the file, so offset + n_bytes cannot overflow.
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::Overlap {
                a: a.name.clone(),
                b: b.name.clone(),
            });
        }
    }
    Ok(())
}
