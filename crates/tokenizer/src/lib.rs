//! `engram-tokenizer`: tokenizers for Llama-family models.
//!
//! Owner: the tokenizer crate of Engram. What it provides:
//! * [`Tokenizer`] — a `tokenizers::Tokenizer` plus BOS/EOS/stop ids and the chat
//!   template, loaded from a Hugging Face folder ([`Tokenizer::from_hf_dir`]) or
//!   built from a GGUF vocabulary ([`Tokenizer::from_gguf_vocab`], [`GgufVocab`]);
//! * [`StreamDecoder`] — UTF-8-safe incremental detokenization whose outputs
//!   concatenate to exactly what a full decode gives;
//! * [`pre_tokenizer`] — llama.cpp's pre-tokenizers by `tokenizer.ggml.pre` name
//!   ([`PreType`]: split regexes; [`PreFlags`]: per-name flags);
//! * [`ChatTemplate`] — Jinja chat templates rendered as `transformers` does;
//! * [`train_bpe`] — the deterministic byte-level BPE of the fixture models, trained
//!   on [`FIXTURE_CORPUS`].
//!
//! Invariants kept across the crate: offsets are byte offsets into the input;
//! errors about files name the file; nothing here touches the network.

#![warn(missing_docs)]

mod chat_template;
mod error;
mod gguf_vocab;
mod hf;
mod pre_tokenizers;
mod stream;
mod token_bytes;
mod tokenizer;
mod train;

pub use chat_template::{ChatMessage, ChatTemplate};
pub use error::{Result, TokenizerError};
pub use gguf_vocab::{gguf_merges, GgufVocab};
pub use pre_tokenizers::{lookup as pre_tokenizer, names as pre_tokenizer_names, PreFlags, PreType};
pub use stream::StreamDecoder;
pub use tokenizer::{Encoding, Tokenizer};
pub use train::{train_bpe, FIXTURE_CORPUS, FIXTURE_SPECIAL_TOKENS};

/// Re-export of the underlying `tokenizers` crate (for `Tokenizer::inner`).
pub use tokenizers;
