//! The model layer's error type. Every error names the file and the field or
//! tensor it is about, so a user with a broken download knows what to fix.

use std::path::PathBuf;

/// Errors raised while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The GGUF container itself is malformed.
    #[error(transparent)]
    Gguf(#[from] engram_gguf::GgufError),
    /// The tokenizer or chat template could not be loaded or run.
    #[error(transparent)]
    Tokenizer(#[from] engram_tokenizer::TokenizerError),
    /// A weight matrix is inconsistent with its declared format.
    #[error(transparent)]
    Kernel(#[from] engram_kernels::KernelError),
    /// A configuration field is missing or has an unusable value.
    #[error("{file}: field \"{field}\": {reason}")]
    Config { file: String, field: String, reason: String },
    /// A tensor is missing, has the wrong shape, or an unsupported type.
    #[error("{file}: tensor \"{tensor}\": {reason}")]
    Tensor { file: String, tensor: String, reason: String },
    /// The architecture is not one Engram runs.
    #[error("{file}: unsupported architecture \"{arch}\" (supported: {})", crate::config::Arch::supported_list())]
    UnsupportedArch { file: String, arch: String },
    /// The path is neither a GGUF file nor a Hugging Face model folder.
    #[error("{0}: not a model (expected a .gguf file or a folder with config.json)")]
    NotAModel(PathBuf),
    /// A forward call was malformed (token id out of range, positions, ...).
    #[error("invalid forward input: {0}")]
    BadInput(String),
    /// The KV store refused to hold the step's keys and values.
    #[error("kv cache: {0}")]
    Kv(String),
}

/// Result alias for the model layer.
pub type Result<T> = std::result::Result<T, ModelError>;

pub(crate) fn config_err(file: &str, field: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Config { file: file.to_string(), field: field.to_string(), reason: reason.into() }
}

pub(crate) fn tensor_err(file: &str, tensor: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Tensor { file: file.to_string(), tensor: tensor.to_string(), reason: reason.into() }
}
