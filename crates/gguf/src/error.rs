//! The crate's error type.
//!
//! Owns [`GgufError`] and the [`Result`] alias.  Errors produced while parsing
//! a byte slice carry no path; [`crate::GgufFile`] wraps them in
//! [`GgufError::InFile`] so that every message it returns starts with the file
//! name (`model.gguf: ...`).  Messages are sentence fragments that
//! name the offending field, key or tensor; the `Display` output of a variant
//! already includes any wrapped error, so no `source()` chain is exposed
//! (printing a chain would repeat the text).

use std::path::{Path, PathBuf};

/// Everything that can go wrong reading or writing GGUF.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// Another error, attributed to a file.
    #[error("{}: {error}", path.display())]
    InFile {
        /// The file the error is about.
        path: PathBuf,
        /// The underlying error (never itself `InFile`).
        error: Box<GgufError>,
    },
    /// An operating-system I/O failure.
    #[error("{op}: {error}")]
    Io {
        /// What was being done, e.g. `"cannot open"`.
        op: &'static str,
        /// The OS error.
        error: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file (magic {found:#010x}, expected \"GGUF\")")]
    BadMagic {
        /// The first four bytes, read as a little-endian u32.
        found: u32,
    },
    /// A GGUF version other than 2 or 3.
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// A big-endian GGUF file (only little-endian is supported).
    #[error("big-endian GGUF files are not supported (version field reads {0:#010x} little-endian)")]
    BigEndian(u32),
    /// The data ended in the middle of a field.
    #[error("truncated while reading {what}")]
    Truncated {
        /// The field being read, e.g. `tensor info #12 (name)`.
        what: String,
    },
    /// A structurally invalid header (bad length, unknown value type, bad
    /// UTF-8, duplicate key, bad alignment, ...).
    #[error("{0}")]
    Malformed(String),
    /// A metadata value has a different type than the caller asked for.
    #[error("metadata key \"{key}\" has type {found}, expected {expected}")]
    MetadataType {
        /// The metadata key.
        key: String,
        /// The type found, e.g. `string` or `array of u32`.
        found: String,
        /// The type wanted, e.g. `an integer`.
        expected: &'static str,
    },
    /// A required metadata key is absent.
    #[error("metadata key \"{key}\" is missing")]
    MissingKey {
        /// The metadata key.
        key: String,
    },
    /// A metadata value has the right type but an unusable value.
    #[error("metadata key \"{key}\": {reason}")]
    InvalidValue {
        /// The metadata key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor uses a ggml type this crate cannot size.
    #[error("tensor \"{tensor}\" has unknown ggml type {id}")]
    UnknownGgmlType {
        /// The tensor name.
        tensor: String,
        /// The ggml type id.
        id: u32,
    },
    /// A tensor's data extends past the end of the file.
    #[error("tensor \"{tensor}\" data [offset {offset}, {n_bytes} bytes] lies past the end of the file (size {file_size})")]
    TensorOutOfBounds {
        /// The tensor name.
        tensor: String,
        /// Absolute file offset of the tensor's first byte.
        offset: u64,
        /// The tensor's size in bytes.
        n_bytes: u64,
        /// The file size.
        file_size: u64,
    },
    /// A tensor that is otherwise invalid (shape, alignment, overlap,
    /// duplicate name, data length).
    #[error("tensor \"{tensor}\": {reason}")]
    InvalidTensor {
        /// The tensor name.
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// `Result` with [`GgufError`].
pub type Result<T> = std::result::Result<T, GgufError>;

impl GgufError {
    /// Attributes this error to `path` (no-op if it already names a file).
    pub fn in_file(self, path: &Path) -> GgufError {
        match self {
            e @ GgufError::InFile { .. } => e,
            e => GgufError::InFile { path: path.to_path_buf(), error: Box::new(e) },
        }
    }

    /// The file this error is attributed to, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            GgufError::InFile { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The error without its file attribution (for matching on the variant).
    pub fn kind(&self) -> &GgufError {
        match self {
            GgufError::InFile { error, .. } => error,
            e => e,
        }
    }

    pub(crate) fn io(op: &'static str, error: std::io::Error) -> GgufError {
        GgufError::Io { op, error }
    }
}
