//! Loading a model from disk: a GGUF file (`gguf.rs`) or a Hugging Face
//! folder (`hf.rs`, its `config.json` in `hf_config.rs`). Both produce the same `ModelConfig` + `ModelWeights` +
//! `Tokenizer`, so nothing above this module knows which format a model came
//! from.

mod experts;
pub mod gguf;
pub mod hf;
mod hf_config;

use std::path::Path;

use engram_tokenizer::Tokenizer;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::weights::ModelWeights;

/// Everything a loader produces.
pub struct Loaded {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    /// Where it came from and in which format ("gguf" or "hf"), for display.
    pub source: String,
    /// Bytes hashed into the fingerprint: format-specific metadata.
    pub identity: Vec<u8>,
}

/// Loads a GGUF file or a Hugging Face folder, deciding by what `path` is.
pub fn load(path: &Path) -> Result<Loaded> {
    if path.is_dir() {
        hf::load_hf(path)
    } else if path.is_file() {
        gguf::load_gguf(path)
    } else if !path.exists() {
        Err(ModelError::Io { path: path.to_path_buf(), source: std::io::Error::from(std::io::ErrorKind::NotFound) })
    } else {
        Err(ModelError::NotAModel(path.to_path_buf()))
    }
}
