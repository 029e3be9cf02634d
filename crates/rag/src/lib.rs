//! # engram-rag — personal retrieval-augmented generation (after PerCache)
//!
//! A user's own documents, searchable and answerable on the device, with caches at two
//! stages of the pipeline:
//!
//! ```text
//!  query ─► embed ─► QA bank hit (cosine ≥ threshold)? ──yes──► stored answer   cache_level=qa
//!                        │ no
//!                        ▼
//!            knowledge bank: BM25 + cosine, fused (RRF) ─► top-k chunks
//!                        ▼
//!            prompt = system + chunk₁ + … + chunkₖ + question   (token boundaries by construction)
//!                        ▼
//!            chunk KV tree: longest cached prefix of (system, chunk₁, …) ─► prefill the rest
//!                        ▼                                           cache_level=kv (or none)
//!            decode ─► answer; path into the KV tree, answer into the QA bank
//! ```
//!
//! Main types: [`KnowledgeBank`] (parsers → chunks → vectors + tantivy, on disk), [`QaBank`]
//! (answers by query similarity, LFU under a byte cap, invalidated by refresh), [`KvTree`]
//! (KV of chunk sequences keyed by chunk ids and the model's fingerprint), [`Rag`] (the
//! pipeline over a model), [`synth`] (a seeded synthetic personal corpus with query sets),
//! [`Library`] (the banks and the pipeline's front half for a caller that generates elsewhere:
//! the server) and [`TreePolicy`] (the chunk KV tree behind the engine's context-policy seam,
//! so the scheduler's RAG jobs start from it). The tree persists as `engram-kv` entry files
//! ([`KvTree::save`], [`KvTree::load`]). [`idle`] is the idle-time half ([`PerCache`]):
//! knowledge abstracts, query prediction, and the layer choice that spends idle compute on
//! the QA bank or the KV tree one small unit at a time — over a [`Rag`], or in the server over
//! [`Stores`] borrowed from a [`Library`] and the engine thread's tree, for the tenants in
//! [`IdleTenants`]. [`ChunkStore`] (position-independent chunk KV for blend reuse) persists
//! like the tree ([`ChunkStore::save`], [`ChunkStore::load`]).
//!
//! Architecture invariant: this crate builds KV only through `engram-kv` and runs the model
//! for generation only through `engram-engine`'s step — a job alone on the caller's thread
//! ([`engram_engine::run_alone`]: the pipeline, idle units driven by hand) or a low-priority
//! background job of the engine thread ([`TreePolicy`]'s idle units) — never a loop of its
//! own (`run.rs`); it knows no HTTP. Every store
//! file is written whole (temp + fsync + rename) and checked (magic, version, length, blake3)
//! before use.

mod bank;
mod bm25;
pub mod chunk;
pub mod chunk_store;
mod entry_files;
mod envelope;
mod error;
mod front;
pub mod idle;
mod idle_tenants;
pub mod kv_tree;
mod library;
pub mod parse;
mod pipeline;
mod policy;
pub mod qa;
pub mod retrieve;
mod run;
mod stores;
pub mod synth;

pub use bank::{BankStats, ChunkEntry, ChunkId, DocEntry, IngestReport, KnowledgeBank, MANIFEST_FILE};
pub use chunk_store::{Assembled, ChunkStore, ChunkStoreStats, Missing, Piece};
pub use error::{RagError, Result};
pub use idle::{IdleConfig, IdleStats, PerCache, UnitKind, UnitReport};
pub use idle_tenants::{IdleCounters, IdleTenants, Waiting, UNIT_KINDS};
pub use kv_tree::{tree_dir, KvTree, LoadReport, SegKey, TreeStats};
pub use library::{Library, Pending, Plan};
pub use parse::{DocKind, ParsedDoc};
pub use pipeline::{
    build_prompt, Answer, AnswerTimings, BlendStats, CacheLevel, ChunkReuse, Prompt, QueryOptions, Rag, RagConfig, DEFAULT_SYSTEM_PROMPT,
};
pub use policy::{BlendOutcome, ForgetChunks, PromptSegments, SegmentRegistry, TreeCounters, TreePolicy};
pub use qa::{QaBank, QaEntry, QaHit, QaStats, DEFAULT_QA_CAP_BYTES, DEFAULT_THRESHOLD};
pub use retrieve::Retrieved;
pub use stores::Stores;
