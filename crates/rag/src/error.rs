//! [`RagError`]: every way a knowledge-bank, QA-bank or KV-tree operation can fail, each
//! naming what was refused and why. Invariant: an operation that returns an error has changed
//! nothing stored (the manifest, the BM25 index and the QA bank are replaced only whole).

use std::path::PathBuf;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum RagError {
    /// An input file or text was refused (binary, oversized, empty, unknown kind, unparsable).
    #[error("{what}: {why}")]
    BadInput { what: String, why: String },
    /// A document or QA entry id that is not stored.
    #[error("no document {0:?} in the knowledge bank")]
    UnknownId(String),
    /// A store file that is truncated, damaged or not ours.
    #[error("{}: {why}", path.display())]
    BadStore { path: PathBuf, why: String },
    /// The query (with the system prompt, without any chunk) does not fit the model's context.
    #[error("the query needs {needed} tokens with the system prompt but the model's context is {context}")]
    QueryTooLong { needed: usize, context: usize },
    /// Reading or writing the store.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The BM25 index.
    #[error("BM25 index: {0}")]
    Index(String),
    /// The sentence encoder.
    #[error("encoder: {0}")]
    Embed(#[from] engram_embed::EmbedError),
    /// Generation.
    #[error("generation: {0}")]
    Engine(#[from] engram_engine::EngineError),
    /// A job of the engine that failed (a model error, an engine fault, no KV room).
    #[error("generation: {0}")]
    Model(String),
}

impl RagError {
    /// A refused input.
    pub fn bad_input(what: impl Into<String>, why: impl Into<String>) -> RagError {
        RagError::BadInput { what: what.into(), why: why.into() }
    }
    /// A damaged or foreign store file.
    pub fn bad_store(path: impl Into<PathBuf>, why: impl Into<String>) -> RagError {
        RagError::BadStore { path: path.into(), why: why.into() }
    }
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> RagError {
        RagError::Io { path: path.into(), source }
    }
}

impl From<tantivy::TantivyError> for RagError {
    fn from(e: tantivy::TantivyError) -> RagError {
        RagError::Index(e.to_string())
    }
}

/// The crate's result.
pub type Result<T> = std::result::Result<T, RagError>;
