//! The crate's one error type. Every user-data path returns `Result<T>`; nothing panics on bad input.

use std::path::PathBuf;

/// Errors from reading files, building models and running them.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("I/O error: {0}")]
    IoPlain(#[from] std::io::Error),

    /// The GGUF file is malformed. `what` names the problem precisely.
    #[error("malformed GGUF: {0}")]
    Gguf(#[from] GgufError),

    /// A tensor has a ggml type rill cannot (de)quantize.
    #[error("tensor '{tensor}': unsupported ggml type {type_name} (id {type_id})")]
    UnsupportedType {
        tensor: String,
        type_name: String,
        type_id: u32,
    },

    #[error("unsupported model architecture '{0}' (rill runs qwen35 and qwen35moe)")]
    UnsupportedArch(String),

    /// A metadata key is missing or has the wrong type/value.
    #[error("model metadata: {0}")]
    Metadata(String),

    /// A tensor the architecture needs is missing or has the wrong shape.
    #[error("tensor '{name}': {problem}")]
    Tensor { name: String, problem: String },

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// `prompt`: tokens already in the sequence (the prompt, or the position reached while
    /// generating); `generate`: the tokens that were to follow.
    #[error("{prompt} tokens in the sequence plus {generate} more would exceed the context of {ctx} tokens")]
    ContextOverflow { prompt: usize, generate: usize, ctx: usize },

    #[error("backend '{0}' is not available in this build (available: {1})")]
    UnknownBackend(String, String),

    /// An error from a compute backend (device lost, shape mismatch in an op).
    #[error("backend: {0}")]
    Backend(String),

    /// Not enough memory (host or device) for a buffer.
    #[error("out of memory: {what} needs {needed} bytes, {available} are available")]
    OutOfMemory { what: String, needed: u64, available: u64 },

    /// Every logit of the position to sample was NaN or -inf (a broken model or input).
    #[error("no token has a finite logit (all NaN or -inf): the model produced non-finite output")]
    NonFiniteLogits,

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("formatting output failed")]
    Fmt(#[from] std::fmt::Error),

    #[error("safetensors: {0}")]
    SafeTensors(String),

    // Hostile input (issue 12): sizes from files and the command line, and path arguments.
    /// A host allocation whose size came from a file or the command line failed.
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    Alloc { what: String, bytes: u128 },

    /// A GGUF file given by path is malformed.
    #[error("{path}: malformed GGUF: {source}")]
    GgufFile {
        path: PathBuf,
        #[source]
        source: GgufError,
    },

    /// A model file given by path is not a usable model (its metadata, tensors or tokenizer).
    #[error("{path}: {source}")]
    InModel {
        path: PathBuf,
        #[source]
        source: Box<Error>,
    },

    /// A path argument names something rill cannot use (a directory, a FIFO, a device...).
    #[error("{path}: {problem}")]
    BadPath { path: PathBuf, problem: String },

    /// A session state file (`rill chat`'s `/load`) that cannot be used: damaged, another
    /// model's, or well-formed but with content that would break the next turn.
    #[error("state file {path}: {problem}")]
    StateFile {
        path: PathBuf,
        #[source]
        problem: StateFileError,
    },
}

/// Precise reasons a state file is refused. The checksum only tells damage apart: a file edited
/// with its checksum recomputed passes it, so everything semantic is checked too.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateFileError {
    #[error("not a regular file (it is {0})")]
    NotRegular(&'static str),
    #[error("not a rill state file (bad magic)")]
    BadMagic,
    #[error("format version {found}, this build reads {supported}")]
    Version { found: u32, supported: u32 },
    #[error("saved for another model (fingerprint {saved:016x}, this model is {model:016x})")]
    OtherModel { saved: u64, model: u64 },
    #[error("{pos} positions do not fit the context of {n_ctx} tokens")]
    ContextTooSmall { pos: u64, n_ctx: usize },
    #[error("{file_len} bytes, expected {expected} for {pos} positions of this model (truncated or corrupt)")]
    Size { file_len: u64, expected: u128, pos: u64 },
    #[error("metadata is not JSON: {0}")]
    MetaNotJson(String),
    #[error("{found} layers, the model has {model}")]
    LayerCount { found: usize, model: usize },
    #[error("layer {0} has the wrong kind")]
    LayerKind(usize),
    #[error("checksum mismatch (the file is corrupt)")]
    Checksum,
    #[error("layer {layer}'s {tensor} holds a non-finite value (NaN or infinity) at index {index}")]
    NonFinite {
        layer: usize,
        tensor: &'static str,
        index: usize,
    },
    #[error("metadata is not a rill chat: {0}")]
    NotAChat(String),
    #[error("message {index} has the unknown role '{role}'")]
    UnknownRole { index: usize, role: String },
    #[error("message {index} is from '{role}' where the conversation needs {expected}")]
    RoleOrder {
        index: usize,
        role: String,
        expected: &'static str,
    },
    #[error("token {index} is id {id}, outside the model's vocabulary of {n_vocab}")]
    TokenOutOfVocab { index: usize, id: u64, n_vocab: usize },
    #[error("the state covers {pos} positions but the file lists {tokens} tokens")]
    TokenCount { pos: usize, tokens: usize },
}

/// Precise reasons a GGUF file is rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufError {
    #[error("bad magic {0:#010x} (not a GGUF file)")]
    BadMagic(u32),
    #[error("unsupported GGUF version {0} (rill reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: needed {needed} bytes at offset {offset} for {what}, file has {file_len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error(
        "{what} count {count} does not fit in the {remaining} bytes left of the file's {file_len} \
         (a corrupt count or a truncated file)"
    )]
    CountTooLarge {
        what: String,
        count: u64,
        remaining: u64,
        file_len: u64,
    },
    #[error("{what} at offset {offset} claims a length of {len} bytes, more than the whole file ({file_len} bytes)")]
    ImpossibleLength {
        what: String,
        offset: u64,
        len: u64,
        file_len: u64,
    },
    #[error("{what} count {count} is more than rill accepts ({max})")]
    TooMany { what: String, count: u64, max: u64 },
    #[error("string at offset {offset} is not valid UTF-8")]
    BadUtf8 { offset: u64 },
    #[error("unknown metadata value type {type_id} for key '{key}'")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata arrays nested deeper than {0} levels")]
    NestingTooDeep(usize),
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
    #[error("tensor '{name}': {n_dims} dimensions (GGUF allows 1..=4)")]
    BadDims { name: String, n_dims: u32 },
    #[error("tensor '{name}': dimension {dim} is zero or its element count overflows")]
    BadShape { name: String, dim: usize },
    #[error("tensor '{name}': unknown ggml type id {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },
    #[error("tensor '{name}': row length {ne0} is not a multiple of the {type_name} block size {block}")]
    RowNotBlockMultiple {
        name: String,
        ne0: u64,
        type_name: String,
        block: u64,
    },
    #[error("tensor '{name}': offset {offset} is not a multiple of the alignment {align}")]
    Misaligned { name: String, offset: u64, align: u64 },
    #[error("tensor '{name}': data [{start}, {end}) runs past the end of the file ({file_len} bytes)")]
    DataOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("tensor '{name}': byte size overflows")]
    SizeOverflow { name: String },
    #[error("general.alignment = {0} is not a non-zero power of two")]
    BadAlignment(u64),
    #[error("general.alignment has type {0}, expected u32")]
    BadAlignmentType(String),
    #[error("tensors '{a}' and '{b}' overlap in the data section")]
    Overlap { a: String, b: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn tensor(name: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::Tensor {
            name: name.into(),
            problem: problem.into(),
        }
    }
    /// Attach the model file's path to an error about its contents (errors that already name a
    /// path, and errors of the device or the arguments, are returned as they are).
    pub fn in_model(self, path: impl Into<PathBuf>) -> Self {
        match self {
            Error::Metadata(_)
            | Error::Tensor { .. }
            | Error::Tokenizer(_)
            | Error::UnsupportedArch(_)
            | Error::UnsupportedType { .. } => Error::InModel {
                path: path.into(),
                source: Box::new(self),
            },
            other => other,
        }
    }
    pub fn state_file(path: impl Into<PathBuf>, problem: StateFileError) -> Self {
        Error::StateFile {
            path: path.into(),
            problem,
        }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
