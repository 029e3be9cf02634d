//! # engram-model — model execution
//!
//! Loads Llama-family models and GPT-OSS (GGUF files and Hugging Face folders) and runs
//! their forward pass on the CPU over caches owned by someone else.
//!
//! Main types: [`Model`] (immutable weights + tokenizer + fingerprint),
//! [`SeqStep`] (one sequence's tokens in a batched step), [`KvCache`] (the
//! interface the KV store implements for attention).
//!
//! Architecture invariant: this crate knows nothing about sessions, files of
//! cached KV, HTTP or scheduling. It reads model files and computes.

pub mod attention;
pub mod config;
pub mod error;
pub mod forward;
pub mod kv;
pub mod load;
pub mod model;
pub mod moe;
pub mod ops;
pub mod rope;
pub mod view;
pub mod weights;

pub use config::{Arch, FfnActivation, LayerAttention, ModelConfig, MoeConfig, MoeGating, NoRope, RopeConfig, RopeStyle};
pub use error::{ModelError, Result};
pub use forward::{Logits, SeqStep};
pub use kv::{KvCache, KvChunk, KvData, KvElem};
pub use model::{AttentionPrecision, Fingerprint, Model};
pub use rope::YarnScaling;
pub use view::{KeyMask, KvRead};
pub use weights::{FeedForward, GatedMlp, MlpBias, ModelWeights, MoeWeights, Weight};
