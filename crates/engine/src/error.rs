//! Errors of the engine.

/// Errors raised while generating.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] engram_model::ModelError),
    #[error(transparent)]
    Kv(#[from] engram_kv::KvError),
    #[error(transparent)]
    Tokenizer(#[from] engram_tokenizer::TokenizerError),
    /// The request itself is unusable (empty prompt, too long, bad parameter).
    #[error("{0}")]
    BadRequest(String),
    /// A grammar failed to compile or its matcher failed mid-generation.
    #[error("grammar: {0}")]
    Grammar(String),
    /// The engine could not run the sequence: no room in the KV budget, a model error, an
    /// engine fault (the message says which).
    #[error("{0}")]
    Failed(String),
}
