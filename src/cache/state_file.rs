//! Session state files (`rill chat`'s `/save` and `/load`): a snapshot read back to the host and
//! written with a header that ties it to one model.
//!
//! Layout (little-endian): magic `RILLSTAT`, u32 version, u64 model fingerprint, u64 position,
//! u64 metadata length + that many bytes of JSON (the caller's: conversation, tokens), u32 layer
//! count, then per layer a kind byte (0 = Gated DeltaNet: conv state, delta state; 1 = attention:
//! `pos` key rows, `pos` value rows) with every tensor as raw f32, and last a u64 FNV-1a checksum of
//! everything before it. Sizes are derived from the model's config and checked against the file
//! length before anything large is allocated.
//!
//! Writing replaces the file atomically (`fsutil::write_atomically`): a save that fails half-way
//! keeps the previous file. Reading checks the checksum and then what a checksum cannot vouch for
//! (a file edited with its checksum recomputed): every state value must be finite.

use std::io::{BufWriter, Read, Write};
use std::path::Path;

use crate::backend::{Backend, Tensor};
use crate::error::{Error, Result, StateFileError};
use crate::exec::{Session, Snapshot, SnapshotLayer};
use crate::fsutil;
use crate::gguf::GgufFile;
use crate::model::Config;

const MAGIC: &[u8; 8] = b"RILLSTAT";
const VERSION: u32 = 1;
/// Largest metadata block accepted (a conversation of a million-token context fits easily).
const MAX_META: u64 = 256 << 20;

/// FNV-1a, 64-bit: a small, dependency-free hash; good enough to tell models and corrupt files
/// apart (this is an integrity check, not a security boundary).
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A fingerprint of a model file: its header (every metadata key and value and the tensor table)
/// plus the first 4 KiB of every tensor's data, so two random-weight files of one shape differ too.
pub fn model_fingerprint(file: &GgufFile) -> u64 {
    let bytes = file.source().as_slice();
    let header_end = (file.data_start as usize).min(bytes.len());
    let mut h = Fnv::new();
    h.update(&bytes[..header_end]);
    for t in &file.tensors {
        let data = file.tensor_data(t);
        h.update(&data[..data.len().min(4096)]);
    }
    h.0
}

/// What `read_state` returns.
pub struct SavedState {
    /// The caller's metadata, as written.
    pub meta: serde_json::Value,
    pub snap: Snapshot,
}

/// Write `snap` (read back from `backend`) and `meta` to `path`, replacing it atomically: on any
/// error the previous file at `path` is left as it was. `path` must not be a symbolic link, FIFO,
/// device or directory.
pub fn write_state(
    path: &Path,
    fingerprint: u64,
    meta: &serde_json::Value,
    snap: &Snapshot,
    backend: &dyn Backend,
) -> Result<()> {
    fsutil::write_atomically(path, "a state file", |file| {
        write_contents(file, path, fingerprint, meta, snap, backend)
    })
}

/// The whole file, checksum last, to `file` (`path` is for errors).
fn write_contents(
    file: &mut std::fs::File,
    path: &Path,
    fingerprint: u64,
    meta: &serde_json::Value,
    snap: &Snapshot,
    backend: &dyn Backend,
) -> Result<()> {
    let io = |e| Error::io(path, e);
    let mut w = Hashing {
        inner: BufWriter::new(file),
        hash: Fnv::new(),
    };
    let meta = serde_json::to_vec(meta).map_err(|e| Error::InvalidArgument(format!("state metadata: {e}")))?;
    w.put(MAGIC).map_err(io)?;
    w.put(&VERSION.to_le_bytes()).map_err(io)?;
    w.put(&fingerprint.to_le_bytes()).map_err(io)?;
    w.put(&(snap.pos as u64).to_le_bytes()).map_err(io)?;
    w.put(&(meta.len() as u64).to_le_bytes()).map_err(io)?;
    w.put(&meta).map_err(io)?;
    w.put(&(snap.layers.len() as u32).to_le_bytes()).map_err(io)?;
    for l in &snap.layers {
        let tensors: Vec<&Tensor> = match l {
            SnapshotLayer::Gdn { conv, delta } => {
                w.put(&[0]).map_err(io)?;
                vec![conv, delta]
            }
            SnapshotLayer::Attn { kv } => {
                w.put(&[1]).map_err(io)?;
                kv.iter().flat_map(|(k, v)| [k, v]).collect()
            }
        };
        for t in tensors {
            let data = backend.read_f32(t)?;
            w.put(bytemuck::cast_slice(&data)).map_err(io)?;
        }
    }
    let sum = w.hash.0;
    w.inner.write_all(&sum.to_le_bytes()).map_err(io)?;
    w.inner.flush().map_err(io)?;
    Ok(())
}

struct Hashing<W: Write> {
    inner: W,
    hash: Fnv,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hash.update(bytes);
        self.inner.write_all(bytes)
    }
}

/// Read a state file written for the model with `fingerprint` and `cfg`, uploading it to `backend`.
/// Every mismatch (another model, another format, a truncated or corrupt file, a position beyond
/// `n_ctx`, a non-finite state value) is an `Error::StateFile` that names it. The metadata is the
/// caller's to check.
pub fn read_state(
    path: &Path,
    fingerprint: u64,
    cfg: &Config,
    n_ctx: usize,
    backend: &dyn Backend,
) -> Result<SavedState> {
    let bad = |problem: StateFileError| Error::state_file(path, problem);
    // Check the type before opening: opening a FIFO for reading would block (and `open_regular`
    // checks again on the open file).
    let md = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !md.is_file() {
        return Err(bad(StateFileError::NotRegular(fsutil::file_kind(md.file_type()))));
    }
    let mut f = fsutil::open_regular(path, "a state file")?;
    let file_len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut r = Reader {
        inner: &mut f,
        hash: Fnv::new(),
        path,
    };
    let magic: [u8; 8] = r.array()?;
    if &magic != MAGIC {
        return Err(bad(StateFileError::BadMagic));
    }
    let version = u32::from_le_bytes(r.array()?);
    if version != VERSION {
        return Err(bad(StateFileError::Version {
            found: version,
            supported: VERSION,
        }));
    }
    let fp = u64::from_le_bytes(r.array()?);
    if fp != fingerprint {
        return Err(bad(StateFileError::OtherModel {
            saved: fp,
            model: fingerprint,
        }));
    }
    let pos = u64::from_le_bytes(r.array()?);
    if pos > n_ctx as u64 {
        return Err(bad(StateFileError::ContextTooSmall { pos, n_ctx }));
    }
    let pos = pos as usize;
    let meta_len = u64::from_le_bytes(r.array()?);
    // Everything after the metadata, in bytes: layer count, kinds, tensors, checksum.
    let tensors = Session::bytes_needed(cfg, pos) as u128;
    let expected = 8 + 4 + 8 + 8 + 8 + meta_len as u128 + 4 + cfg.is_linear.len() as u128 + tensors + 8;
    if meta_len > MAX_META || expected != file_len as u128 {
        return Err(bad(StateFileError::Size {
            file_len,
            expected,
            pos: pos as u64,
        }));
    }
    let meta_bytes = r.bytes(meta_len as usize)?;
    // Parsed after the checksum is known good (damage is reported as damage).
    let meta = serde_json::from_slice::<serde_json::Value>(&meta_bytes);
    let n_layers = u32::from_le_bytes(r.array()?) as usize;
    if n_layers != cfg.is_linear.len() {
        return Err(bad(StateFileError::LayerCount {
            found: n_layers,
            model: cfg.is_linear.len(),
        }));
    }
    let g = cfg.gdn;
    let kv_width = cfg.attn.n_head_kv * cfg.attn.head_dim;
    let mut layers = Vec::with_capacity(n_layers);
    // The first non-finite value met, reported once the checksum has passed.
    let mut non_finite: Option<StateFileError> = None;
    for (i, &linear) in cfg.is_linear.iter().enumerate() {
        let [kind] = r.array()?;
        if kind != if linear { 0 } else { 1 } {
            return Err(bad(StateFileError::LayerKind(i)));
        }
        let mut tensor = |name: &'static str, shape: &[usize]| -> Result<Tensor> {
            let n: usize = shape.iter().product();
            let bytes = r.bytes(n * 4)?;
            let data: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            if non_finite.is_none() {
                if let Some(index) = data.iter().position(|v| !v.is_finite()) {
                    non_finite = Some(StateFileError::NonFinite {
                        layer: i,
                        tensor: name,
                        index,
                    });
                }
            }
            backend.upload_f32(&data, shape)
        };
        layers.push(if linear {
            SnapshotLayer::Gdn {
                conv: tensor("conv state", &[cfg.conv_kernel - 1, g.conv_dim()])?,
                delta: tensor("delta state", &[g.hv, g.dv, g.dk])?,
            }
        } else if pos == 0 {
            SnapshotLayer::Attn { kv: None }
        } else {
            SnapshotLayer::Attn {
                kv: Some((tensor("keys", &[pos, kv_width])?, tensor("values", &[pos, kv_width])?)),
            }
        });
    }
    let computed = r.hash.0;
    let mut sum = [0u8; 8];
    r.inner.read_exact(&mut sum).map_err(|e| Error::io(path, e))?;
    if u64::from_le_bytes(sum) != computed {
        return Err(bad(StateFileError::Checksum));
    }
    // Intact as written: now what a recomputed checksum would let through.
    if let Some(problem) = non_finite {
        return Err(bad(problem));
    }
    let meta = meta.map_err(|e| bad(StateFileError::MetaNotJson(e.to_string())))?;
    Ok(SavedState {
        meta,
        snap: Snapshot::from_parts(layers, pos),
    })
}

struct Reader<'a, R: Read> {
    inner: &'a mut R,
    hash: Fnv,
    path: &'a Path,
}

impl<R: Read> Reader<'_, R> {
    fn bytes(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; n];
        self.inner.read_exact(&mut buf).map_err(|e| Error::io(self.path, e))?;
        self.hash.update(&buf);
        Ok(buf)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf).map_err(|e| Error::io(self.path, e))?;
        self.hash.update(&buf);
        Ok(buf)
    }
}
