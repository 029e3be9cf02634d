//! Sparse attention over clustered KV (DynaKV): the mechanism, and ([`long`]) the policy
//! layer that serves long conversations with it through the `engram-policy` seam.
//!
//! - [`kmeans`]: chunked k-means (bounded peak memory), the cluster count from the length.
//! - [`method`]: the [`HeadIndex`] trait, one per (layer, KV head), and [`Method`], which makes
//!   DynaKV's index and every baseline's (token oracle, token scores, static update, local
//!   update, Quest, StreamingLLM), so they share one cache and one harness.
//! - [`clusters`]: the clustered index (prefill k-means, representatives, sizes, variances;
//!   static, local and adaptive updates with delayed splits).
//! - [`cache`]: [`SparseKv`], a `KvCache` that answers each one-token step with exactly the
//!   keys its method chose, gathered into one chunk whose positions are named key by key (the
//!   view contract).
//! - [`offload`]: past a RAM budget, the older KV in a file per sequence in cluster-contiguous
//!   order, read back through a reader thread and a cluster cache (lossless); after the
//!   prefill ([`SparseKv::offload`]) or while the prompt is written (bounded prefill,
//!   [`SparseKv::offload_streaming`]: the KV in RAM never holds the whole prompt).
//! - [`placement`]: co-retrieval placement — clusters the prefill's last queries retrieve
//!   together are written next to each other in the offload file.
//! - [`persist`]: a sequence's sparse state (RAM tail, sinks, index, the offload file) saved to a
//!   folder and resumed by a later process without re-prefilling ([`SparseKv::save_state`],
//!   [`SparseKv::resume_state`]).
//! - [`long`]: the long-context policy — a layer over the context policy that serves a
//!   conversation past a threshold from a [`LongKv`] (this crate's cache as the scheduler's
//!   `engram_kv::SeqCache`, charged to the KV pool) and keeps it between turns.
//! - [`probe`]: what a selection loses (attention mass, attention output error), measured in
//!   f64 on the read itself.
//!
//! Invariant: with a budget covering the history every method attends every key, and
//! attention over a sparse cache equals attention over exactly the keys it chose.

pub mod cache;
pub mod clusters;
pub mod keys;
pub mod kmeans;
pub mod long;
pub mod method;
pub mod offload;
pub mod persist;
pub mod placement;
pub mod probe;
mod shared;

pub use cache::{SparseConfig, SparseKv};
pub use keys::HeadKeys;
pub use long::{LongContext, LongContextConfig, LongKv, SaveCounters, SaveHold, SaveMonitor};
pub use method::{HeadIndex, IndexStats, Method};
pub use offload::{Backend, Layout, OffloadConfig, OffloadStats, Policy};
pub use persist::{StateError, StateMeta};
pub use probe::Probe;
