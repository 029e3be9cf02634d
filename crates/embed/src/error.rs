//! The encoder's error type. Every loading error names the file and the
//! field or tensor it is about, so a broken or foreign folder says what to fix.

use std::path::PathBuf;

/// Errors raised while loading or running a sentence encoder.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// A file could not be read (missing, unreadable). The I/O error is part
    /// of the message, not a separate source, so chains do not repeat it.
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    /// A JSON file is not valid JSON or lacks a required field.
    #[error("{path}: {reason}")]
    Json { path: PathBuf, reason: String },
    /// A configuration value is present but unusable.
    #[error("{path}: field \"{field}\": {reason}")]
    Config { path: PathBuf, field: String, reason: String },
    /// The weights file is not a valid safetensors file (truncated, foreign).
    #[error("{path}: not a valid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    /// A tensor is missing, has the wrong shape or an unsupported type.
    #[error("{path}: tensor \"{tensor}\": {reason}")]
    Tensor { path: PathBuf, tensor: String, reason: String },
    /// `tokenizer.json` could not be loaded, or a text could not be tokenized.
    #[error("{path}: tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    /// The folder asks for something this encoder does not implement.
    #[error("{path}: unsupported: {what}")]
    Unsupported { path: PathBuf, what: String },
    /// A call was malformed (token id out of range, empty sequence).
    #[error("invalid input: {0}")]
    BadInput(String),
    /// A [`crate::TextEncoder`] implemented elsewhere failed while encoding (its own error,
    /// as text, after the encoder's id).
    #[error("{encoder}: {reason}")]
    Backend { encoder: String, reason: String },
}

/// Result alias for the encoder crate.
pub type Result<T> = std::result::Result<T, EmbedError>;

pub(crate) fn io_err(path: &std::path::Path, error: std::io::Error) -> EmbedError {
    EmbedError::Io { path: path.to_path_buf(), error }
}

pub(crate) fn config_err(path: &std::path::Path, field: &str, reason: impl Into<String>) -> EmbedError {
    EmbedError::Config { path: path.to_path_buf(), field: field.to_string(), reason: reason.into() }
}

pub(crate) fn tensor_err(path: &std::path::Path, tensor: &str, reason: impl Into<String>) -> EmbedError {
    EmbedError::Tensor { path: path.to_path_buf(), tensor: tensor.to_string(), reason: reason.into() }
}

pub(crate) fn unsupported(path: &std::path::Path, what: impl Into<String>) -> EmbedError {
    EmbedError::Unsupported { path: path.to_path_buf(), what: what.into() }
}
