//! Error type of `engram-tokenizer`.
//!
//! Every error that comes from a file names the file (full path) so a user
//! can tell which of the several files of a model folder is at fault.

use std::path::PathBuf;

/// Everything that can go wrong while loading, running or training a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required file is absent; `hint` says why it is needed.
    #[error("{}: missing ({hint})", path.display())]
    MissingFile {
        /// The path that was looked for.
        path: PathBuf,
        /// Why the file is needed.
        hint: &'static str,
    },
    /// A file exists but could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A file was read but its content is invalid.
    #[error("{}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// An error reported by the `tokenizers` library while encoding/decoding/building.
    #[error("tokenizer: {0}")]
    Tokenizers(String),
    /// A GGUF vocabulary that cannot be turned into a tokenizer.
    #[error("GGUF vocabulary: {0}")]
    GgufVocab(String),
    /// A chat template failed to compile or to render (includes `raise_exception`).
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// Invalid arguments (e.g. to `train_bpe`).
    #[error("{0}")]
    Invalid(String),
}

impl TokenizerError {
    /// Wrap an error from the `tokenizers` crate.
    pub(crate) fn tk(e: impl std::fmt::Display) -> Self {
        TokenizerError::Tokenizers(e.to_string())
    }
}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, TokenizerError>;
