//! [`TextEncoder`]: the seam between whatever turns texts into vectors and
//! the code that serves or measures them (`/v1/embeddings`, `engram bench
//! relevance`). [`Encoder`] (a sentence-transformers folder) implements it
//! here; other crates may implement it over other models — `engram-engine`'s
//! `PooledEncoder` pools the loaded LLM's hidden states — without this crate
//! knowing about them.
//!
//! Invariant: an implementation is immutable once built (`&self`), shareable
//! across threads (`Send + Sync`, served behind an `Arc`), and gives each
//! text a vector that depends on that text only.

use std::fmt;

use crate::encoder::{Embeddings, Encoder};
use crate::error::Result;

/// Something that turns texts into fixed-size vectors.
pub trait TextEncoder: Send + Sync + fmt::Debug {
    /// The id responses report and requests may name.
    fn id(&self) -> &str;
    /// Floats per vector.
    fn dim(&self) -> usize;
    /// One line for logs: what it is and where it came from.
    fn describe(&self) -> String;
    /// Vectors and token counts of `texts`, in input order.
    fn encode(&self, texts: &[String]) -> Result<Embeddings>;
    /// The longest text it encodes whole, in tokens (`None`: it states no limit). What
    /// `/v1/models` and `/api/show` report as the encoder's context length.
    fn max_tokens(&self) -> Option<usize> {
        None
    }
    /// Whether its cosine similarities rank texts by meaning well enough to mask turns out of
    /// attention by (dual-stream relevance masks): a trained sentence encoder does; the LLM's
    /// pooled hidden states do not (ROC AUC 0.41 on the labelled pairs, docs/embeddings.md),
    /// so a policy given one that does not leaves every turn attended.
    fn ranks_relevance(&self) -> bool {
        true
    }
}

impl TextEncoder for Encoder {
    fn id(&self) -> &str {
        Encoder::id(self)
    }
    fn dim(&self) -> usize {
        Encoder::dim(self)
    }
    fn describe(&self) -> String {
        Encoder::describe(self)
    }
    fn encode(&self, texts: &[String]) -> Result<Embeddings> {
        Encoder::encode(self, texts)
    }
    fn max_tokens(&self) -> Option<usize> {
        Some(Encoder::max_tokens(self))
    }
}
