//! # engram-kv — the KV store
//!
//! Keys and values live in fixed-size token blocks ([`Block`]): for every
//! layer, keys and values in separate contiguous arrays laid out
//! `[num_kv_heads][BLOCK_TOKENS][head_dim]`, so attention streams one head's
//! keys without striding. A sequence's cache ([`SeqKv`]) is a table of
//! refcounted blocks; sequences that start the same way share full blocks
//! read-only, and a shared or file-mapped block is copied before it is
//! written (copy-on-write in [`SeqKv::reserve`]). Formats: f32, f16, q8, q4
//! ([`KvFormat`]); q8 and q4 keep the sequence's partial last block in f16 as
//! well (a recent window, `recent_window.rs`), so the newest tokens are attended at
//! full precision.
//!
//! Persistence: [`persist`] writes a sequence as a safetensors entry whose
//! one tensor holds the blocks' bytes as they lie in RAM, validated and
//! checksummed, so restoring maps the file and attention reads it in place;
//! [`disk`] keeps entries under a disk budget with LRU / LFU / weighted
//! eviction and pins.
//!
//! Every byte of block storage is charged to a [`KvPool`] whose budget is
//! hard: reserving room for new tokens fails with [`KvError::OutOfMemory`]
//! instead of exceeding it, and a block returns its bytes when its last
//! owner drops it.
//!
//! Architecture invariant: this crate knows the model only through
//! [`engram_model::KvCache`] and the shape numbers; it knows nothing of
//! requests, HTTP or tokenizers.

mod block;
mod charge;
pub mod disk;
pub mod disk_quota;
pub mod envelope;
mod error;
mod format;
mod pending;
pub mod persist;
mod pool;
mod recent_window;
mod seq;
mod seq_cache;
mod sliding;
mod view;

pub use block::{Block, BLOCK_TOKENS};
pub use charge::PoolCharge;
pub use disk::{DiskError, DiskStore, EntryStats, EvictionPolicy, GcReport, IndexWrite, StagedPut};
pub use disk_quota::GroupQuota;
pub use error::KvError;
pub use format::KvFormat;
pub use pending::PendingRows;
pub use persist::{
    cache_fingerprint, cache_key, check_in_background, open_entry, open_entry_unchecked, read_entry, read_meta, write_entry, ChecksumCheck,
    EntryInfo, EntryKind, EntryMeta, PersistError, UncheckedEntry,
};
pub use pool::{KvLayout, KvPool};
pub use seq::{SeqKv, MAX_RESUME_POINTS, RESUME_SLACK};
pub use seq_cache::SeqCache;
pub use sliding::{SlidingLayers, SPACING_WINDOWS};
pub use view::{KvView, Span};
