//! Offload of a sparse cache's older KV to a file (DynaKV paper §5–6).
//!
//! Past a per-sequence RAM budget, [`crate::SparseKv::offload`] moves every token older than
//! the recent window (the sinks excepted) into one file per sequence, per (layer, KV head), in
//! cluster-contiguous order: cluster after cluster as the index lists them (prefill segments
//! in time order, a segment's clusters in k-means order, members in position order), so one
//! cluster is one contiguous read. RAM keeps the representatives (the index), the sinks, the
//! recent window and the write buffer (the tail of not-yet-flushed tokens).
//!
//! Layout: the **append layout** by default; [`Layout::DualHead`] (`regions.rs`) pairs
//! clusters in regions with slack and writes each flushed row next to its cluster instead.
//! The cluster order is co-retrieval placement by default (`crate::placement`).
//! Append layout: rows are fixed-size (key then
//! value, f16) and never rewritten; new tokens are flushed [`OffloadConfig::flush`] at a time
//! per (layer, KV head) as one contiguous block at the file's end once they leave the recent
//! window; a position's file row is kept in a per-head table (4 bytes a token against 4·dim
//! bytes of KV). So appends and splits move no data (as the dual-head layout promises), at the
//! cost that a cluster's decode-time members lie in later blocks (a second run per block;
//! reads coalesce runs whose gap is at most [`OffloadConfig::gap`] rows).
//!
//! Bounded prefill (`stream.rs`, [`crate::SparseKv::offload_streaming`]): the same file
//! filled while the prompt is written, a segment's region at a time, so the KV in RAM stays
//! within the budget whatever the prompt's length.
//!
//! Reads ([`reader`]): the rows of each cluster a step fetches come from the cluster cache
//! ([`unit_cache`]) or from the file in coalesced runs, each one `pread` on a reader thread or
//! inline, or all at once through `io_uring`; a loader thread prefetches the next layer's
//! predicted clusters into the cache (`prefetch.rs`). A failed read is recorded on the cache
//! and surfaces as the step's error (`KvCache::read_failure`), never a panic. Splits read their cluster's keys through the same path (counted apart:
//! [`OffloadStats::split_bytes`]), so a delayed split of a cluster being fetched reads nothing
//! more.
//!
//! Invariant: offload is lossless — every read yields the f16 bits written for each position
//! it names, so attention (and the logits) equal the in-RAM cache's bit for bit.

mod attach;
pub mod file;
mod prefetch;
pub mod reader;
mod regions;
mod scratch;
mod source;
mod stream;
pub mod unit_cache;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use half::f16;

pub(crate) use attach::{live_path, readers};
pub use file::{FileSpec, OffloadFile};
pub(crate) use prefetch::{Prefetcher, Shared};
pub use reader::{Backend, Reader};
pub use regions::Layout;
pub(crate) use regions::{Regions, SLACK};
pub(crate) use source::{HeadSource, Purpose, Staging};
pub(crate) use stream::Stream;
pub use unit_cache::{CacheStats, ClusterCache, Policy};

/// Where and how a sequence's KV is offloaded. Invariant: `flush >= 1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffloadConfig {
    /// Directory for the sequence's file (created there, removed when the cache is dropped).
    pub dir: PathBuf,
    /// KV bytes (f16 keys and values) a sequence may keep in RAM before it is offloaded.
    pub ram_budget: usize,
    /// Bytes of the cluster cache.
    pub cache_bytes: usize,
    pub policy: Policy,
    pub backend: Backend,
    /// Tokens per (layer, KV head) written at once when they leave the recent window.
    pub flush: usize,
    /// Rows of a gap read through to merge two runs into one read.
    pub gap: usize,
    /// Layer-ahead prefetch: a loader thread reads the next layer's predicted clusters into
    /// the cluster cache while this layer computes (`prefetch.rs`); lossless either way.
    pub prefetch: bool,
    /// Clusters in the file by co-retrieval at calibration ([`crate::placement`]) rather
    /// than in index order; lossless either way.
    pub co_retrieval: bool,
    /// The file layout ([`Layout::Append`] or dual-head regions, `regions.rs`); lossless
    /// either way, and part of the file's fingerprint.
    pub layout: Layout,
    /// The model's fingerprint (hashed with the sparse configuration into the file header).
    pub model_fingerprint: u64,
}

impl OffloadConfig {
    /// Defaults: a 256 MiB RAM budget, a 64 MiB cluster cache with the cluster-aligned
    /// policy, the reader thread, flushes of 256 tokens, gaps of up to 8 rows read through,
    /// layer-ahead prefetch on, co-retrieval placement, the append layout.
    pub fn new(dir: PathBuf, model_fingerprint: u64) -> OffloadConfig {
        OffloadConfig {
            dir,
            ram_budget: 256 << 20,
            cache_bytes: 64 << 20,
            policy: Policy::ClusterAligned,
            backend: Backend::Thread,
            flush: 256,
            gap: 8,
            prefetch: true,
            co_retrieval: true,
            layout: Layout::Append,
            model_fingerprint,
        }
    }
}

/// What the offloaded cache did (sums over heads). Bytes read include gap rows read through.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OffloadStats {
    /// Bytes and positioned reads for retrieval.
    pub read_bytes: u64,
    pub read_ops: u64,
    /// Bytes and reads done only to split a cluster not in RAM.
    pub split_bytes: u64,
    pub split_ops: u64,
    /// Bytes and reads of reads of every key (a prefill's exact attention over a cache
    /// streamed to its file, exact reads of an offloaded cache, a segment's keys to cluster).
    pub full_bytes: u64,
    pub full_ops: u64,
    /// Bytes written (the offload and later flushes).
    pub written_bytes: u64,
    /// Flushes that failed (disk full): their tokens stayed in RAM.
    pub flush_failures: u64,
    /// Flushed rows written next to their cluster's older rows (dual-head: into its
    /// region's slack), and the other flushed rows (new regions, blocks at the end).
    pub flushed_in_place_rows: u64,
    pub flushed_elsewhere_rows: u64,
    /// File bytes reserved as slack and not (yet) used; bytes of rows already written that
    /// an append or split moved (0: neither moves data, in either layout).
    pub slack_bytes: u64,
    pub moved_bytes: u64,
    /// Bytes and reads of the layer-ahead prefetch (also counted in `read_bytes`/`read_ops`:
    /// they are disk reads all the same), and lookups that waited for a prefetch in flight.
    pub prefetch_bytes: u64,
    pub prefetch_ops: u64,
    pub prefetch_waits: u64,
    /// The read backend that ran (the one configured, or the reader thread after a fallback).
    pub backend: Option<Backend>,
    pub cache: CacheStats,
    /// Bytes the cluster cache holds now.
    pub cache_bytes: usize,
}

/// Counters shared by the reading threads.
#[derive(Default)]
pub(crate) struct Counters {
    pub read_bytes: AtomicU64,
    pub read_ops: AtomicU64,
    pub split_bytes: AtomicU64,
    pub split_ops: AtomicU64,
    pub full_bytes: AtomicU64,
    pub full_ops: AtomicU64,
    pub prefetch_bytes: AtomicU64,
    pub prefetch_ops: AtomicU64,
    pub prefetch_waits: AtomicU64,
}

/// The offloaded part of a [`crate::SparseKv`] (module doc).
pub(crate) struct Offloaded {
    pub cfg: OffloadConfig,
    pub file: OffloadFile,
    pub reader: Reader,
    pub row_bytes: usize,
    pub sinks: usize,
    /// Per layer: `[kv_head][sinks][dim]` keys and values of the sinks.
    pub sink_k: Vec<Vec<f16>>,
    pub sink_v: Vec<Vec<f16>>,
    /// Per `layer * heads + head`: file row of each position `sinks..origin[layer]`
    /// (index = position; entries below `sinks` unused). Shared copy on write with pending
    /// saves' snapshots (`Arc::make_mut` before a change), as the index is.
    pub slots: Vec<Arc<Vec<u32>>>,
    /// The cluster cache and the counters, shared with the loader thread.
    pub shared: Arc<Shared>,
    pub staging: Vec<Mutex<Staging>>,
    /// The layer-ahead loader thread (`None`: prefetch off).
    pub prefetcher: Option<Prefetcher>,
    /// Per layer: sparse reads done this step (the last head's triggers the prefetch).
    pub reads_done: Vec<AtomicUsize>,
    pub written: u64,
    pub flush_failures: u64,
    /// Dual-head layout: per `layer * heads + head`, its regions (empty: append layout).
    pub regions: Vec<Regions>,
    pub in_place_rows: u64,
    pub elsewhere_rows: u64,
    pub slack_rows: u64,
    /// The first read that failed (file truncated, removed or unreadable under a running
    /// sequence); once set, the cache answers nothing more ([`Offloaded::failure`]).
    pub failed: AtomicBool,
    pub failure: Mutex<Option<String>>,
    /// A bounded prefill under way (`stream.rs`); `None` once the index is built.
    pub stream: Option<Stream>,
}

impl Offloaded {
    /// The counters now.
    pub fn stats(&self) -> OffloadStats {
        let c = &self.shared.counters;
        let cache = self.shared.cache.lock().expect("cache lock");
        OffloadStats {
            read_bytes: c.read_bytes.load(Ordering::Relaxed),
            read_ops: c.read_ops.load(Ordering::Relaxed),
            split_bytes: c.split_bytes.load(Ordering::Relaxed),
            split_ops: c.split_ops.load(Ordering::Relaxed),
            full_bytes: c.full_bytes.load(Ordering::Relaxed),
            full_ops: c.full_ops.load(Ordering::Relaxed),
            written_bytes: self.written,
            flush_failures: self.flush_failures,
            flushed_in_place_rows: self.in_place_rows,
            flushed_elsewhere_rows: self.elsewhere_rows,
            slack_bytes: self.slack_rows * self.row_bytes as u64,
            moved_bytes: 0,
            prefetch_bytes: c.prefetch_bytes.load(Ordering::Relaxed),
            prefetch_ops: c.prefetch_ops.load(Ordering::Relaxed),
            prefetch_waits: c.prefetch_waits.load(Ordering::Relaxed),
            backend: Some(self.reader.backend()),
            cache: cache.stats(),
            cache_bytes: cache.used(),
        }
    }

    /// Records a failed read (the first one is kept): the sequence cannot be answered exactly
    /// any more, and the forward pass ends the step with it (`KvCache::read_failure`).
    pub fn record_failure(&self, e: &std::io::Error) {
        let mut f = self.failure.lock().expect("failure lock");
        if f.is_none() {
            *f = Some(format!("DynaKV offload read failed: {e}"));
        }
        self.failed.store(true, Ordering::Release);
    }

    /// The recorded failure, if a read failed.
    pub fn failure(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.failure.lock().expect("failure lock").clone()
    }

    /// Reads the rows `rows` (sorted, distinct) from the file in runs merged across gaps of at
    /// most `cfg.gap` rows; returns their bytes in `rows` order. Counted under `purpose`.
    pub fn read(&self, rows: &[u64], purpose: Purpose) -> std::io::Result<Vec<u8>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let runs = coalesce(rows, self.cfg.gap);
        let ops = runs.len() as u64;
        let data = self.reader.read(runs.clone())?;
        let c = &self.shared.counters;
        let (bytes, nops) = match purpose {
            Purpose::Retrieval => (&c.read_bytes, &c.read_ops),
            Purpose::Split => (&c.split_bytes, &c.split_ops),
            Purpose::Full => (&c.full_bytes, &c.full_ops),
        };
        bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        nops.fetch_add(ops, Ordering::Relaxed);
        Ok(pick(rows, &runs, &data, self.row_bytes))
    }
}

/// The runs `(first row, rows)` that cover `rows` (sorted, distinct), two runs merged where
/// at most `gap` rows lie between them (read through).
pub(crate) fn coalesce(rows: &[u64], gap: usize) -> Vec<(u64, u32)> {
    let mut runs: Vec<(u64, u32)> = Vec::new();
    for &r in rows {
        match runs.last_mut() {
            Some((first, n)) if r < *first + *n as u64 + gap as u64 + 1 && r >= *first + *n as u64 => *n = (r - *first + 1) as u32,
            _ => runs.push((r, 1)),
        }
    }
    runs
}

/// The bytes of `rows` (in that order) out of `data`, the concatenated reads of `runs`.
pub(crate) fn pick(rows: &[u64], runs: &[(u64, u32)], data: &[u8], rb: usize) -> Vec<u8> {
    let mut starts = Vec::with_capacity(runs.len());
    let mut at = 0;
    for &(f, n) in runs {
        starts.push((f, at));
        at += n as usize;
    }
    let mut out = Vec::with_capacity(rows.len() * rb);
    let mut k = 0;
    for &r in rows {
        while k + 1 < starts.len() && starts[k + 1].0 <= r {
            k += 1;
        }
        let at = (starts[k].1 + (r - starts[k].0) as usize) * rb;
        out.extend_from_slice(&data[at..at + rb]);
    }
    out
}

impl Drop for Offloaded {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.file.path());
    }
}

/// The 32-byte file fingerprint of a model, sparse configuration and file layout (the
/// append layout hashes as before it had a name, so its files keep their fingerprint).
pub fn fingerprint(model: u64, cfg: &crate::SparseConfig, layers: usize, heads: usize, dim: usize, layout: Layout) -> [u8; 32] {
    let mut text = format!(
        "engram-dynakv model={model:016x} method={:?} budget={} sinks={} recent={} shape={layers}x{heads}x{dim} f16",
        cfg.method, cfg.budget, cfg.sinks, cfg.recent
    );
    if layout != Layout::Append {
        text.push_str(&format!(" layout={}", layout.name()));
    }
    *blake3::hash(text.as_bytes()).as_bytes()
}
