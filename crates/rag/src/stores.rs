//! [`Stores`]: the pipeline's stores borrowed together — model, KV pool, knowledge bank, QA
//! bank, chunk KV tree and configuration — so idle-time population ([`crate::PerCache`]) runs
//! the same way over a [`crate::Rag`] (which owns them all) and inside the server, where the
//! banks live in a [`crate::Library`] and the tree in the engine thread's [`crate::TreePolicy`].
//!
//! Invariant: a `Stores` adds no state of its own; what a unit stores through it is exactly
//! what the same unit stores through the [`crate::Rag`] that lends it.

use std::sync::Arc;

use engram_kv::KvPool;
use engram_model::Model;

use crate::bank::{ChunkId, KnowledgeBank};
use crate::error::Result;
use crate::kv_tree::KvTree;
use crate::pipeline::{build_prompt, Prompt, RagConfig};
use crate::qa::QaBank;

/// One user's stores, borrowed for one unit of work. See the module doc.
pub struct Stores<'a> {
    pub model: &'a Arc<Model>,
    /// Where generated KV is charged (the engine's pool in the server).
    pub pool: &'a KvPool,
    pub bank: &'a KnowledgeBank,
    pub qa: &'a mut QaBank,
    pub tree: &'a mut KvTree,
    pub config: &'a RagConfig,
}

impl Stores<'_> {
    /// The prompt for `question` over `chunks` (in order): see [`build_prompt`].
    pub fn build_prompt(&self, question: &str, chunks: &[ChunkId]) -> Result<Prompt> {
        build_prompt(self.model, self.config, self.bank, question, chunks)
    }
}
