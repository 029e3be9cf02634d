//! [`LongKv`]: a [`SparseKv`] as a sequence cache the scheduler drives
//! ([`engram_kv::SeqCache`]): its RAM (the KV slots it holds — sinks, recent window, write
//! buffer —, the index, the position → file row tables and the cluster cache) is charged to
//! the KV pool, its prompt's end builds the index, and drafts are off (a sparse read's chunk
//! numbers its keys from 0, which a draft tree's key mask cannot name).
//!
//! Invariant: before every step the pool charge covers an upper bound of the RAM the cache
//! holds after that step (the slots it may grow to, the index grown by the step's tokens, the
//! whole cluster cache once offloaded); a reservation that does not fit changes nothing.

use std::any::Any;

use engram_kv::{KvError, KvPool, PoolCharge, SeqCache};
use engram_model::{KvCache, KvChunk, KvRead};

use crate::offload::OffloadConfig;
use crate::SparseKv;

/// Bytes an index keeps per token and (layer, KV head) at most besides its clusters' centres
/// (a membership entry and its share of the sizes): the estimate between measurements.
const INDEX_BYTES_PER_TOKEN: usize = 8;

/// One long sequence's sparse cache, charged to the KV pool (module doc).
pub struct LongKv {
    kv: SparseKv,
    charge: PoolCharge,
    /// Where the older KV goes once the RAM tail passes its budget.
    off: OffloadConfig,
    /// The index's bytes as last measured (serialized size), and the tokens it held then.
    index_bytes: usize,
    index_at: usize,
}

impl LongKv {
    /// An empty cache for `kv`'s shape whose KV past `off.ram_budget` streams to a file in
    /// `off.dir` (a bounded prefill, [`SparseKv::offload_streaming`]); nothing charged yet.
    pub fn new(mut kv: SparseKv, off: OffloadConfig, pool: &KvPool) -> std::io::Result<LongKv> {
        kv.offload_streaming(off.clone())?;
        let charge = pool.charge(0).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(LongKv { kv, charge, off, index_bytes: 0, index_at: 0 })
    }

    /// A cache resumed from a saved state (`kv`: index built, its older KV in its own live
    /// file, or all of it in RAM), nothing charged yet: [`LongKv::charge_held`] before it
    /// is used.
    pub fn resumed(kv: SparseKv, off: OffloadConfig, pool: &KvPool) -> Result<LongKv, KvError> {
        let charge = pool.charge(0)?;
        let mut long = LongKv { kv, charge, off, index_bytes: 0, index_at: 0 };
        long.measure_index();
        Ok(long)
    }

    /// Charges the pool for the RAM this cache holds ([`SeqCache::ram_bytes`]); where that does
    /// not fit, the pool's error and the charge unchanged.
    pub fn charge_held(&mut self) -> Result<(), KvError> {
        let want = self.ram_bytes();
        self.charge.resize(want)
    }

    /// The sparse cache.
    pub fn sparse(&self) -> &SparseKv {
        &self.kv
    }

    /// Bytes charged to the pool now.
    pub fn charged_bytes(&self) -> usize {
        self.charge.bytes()
    }

    /// Bytes of one token's keys and values in every (layer, KV head), f16.
    fn token_bytes(&self) -> usize {
        self.kv.layers * self.kv.heads * self.kv.dim * 4
    }

    /// RAM held with `cap` slots per head and `extra` more tokens in the index (module doc).
    fn ram_with(&self, cap: usize, extra: usize) -> usize {
        let kv = &self.kv;
        let heads = kv.layers * kv.heads;
        let slots = cap * self.token_bytes();
        let (sinks, cache) = match kv.off.as_deref() {
            Some(o) => (o.sinks * self.token_bytes(), self.off.cache_bytes),
            None => (0, 0),
        };
        let index = self.index_bytes + (kv.len() + extra).saturating_sub(self.index_at) * heads * INDEX_BYTES_PER_TOKEN;
        slots + sinks + cache + kv.slot_table_bytes() + index
    }

    /// The slots per head [`SparseKv::reserve`] grows to for `n` more tokens.
    fn cap_after(&self, n: usize) -> usize {
        let kv = &self.kv;
        let need = (0..kv.layers).map(|l| kv.lens[l] - kv.origin[l]).max().unwrap_or(0) + n;
        if need <= kv.cap {
            kv.cap
        } else {
            need.max(kv.cap * 2).max(256)
        }
    }

    /// Measures the index's bytes (its serialized size, every head), without serializing it.
    fn measure_index(&mut self) {
        self.index_bytes = self.kv.index_bytes();
        self.index_at = self.kv.len();
    }
}

/// Prompts at least this long end with the process's freed heap handed back to the system
/// ([`release_freed_heap`]): their prefill's transient working memory (step buffers sized by
/// the chunk and the history) is freed by then, but the allocator keeps it resident, and the
/// conversation's next turn would run on top of it. Shorter prompts leave little, and a trim
/// costs a walk of the heap's free lists, so they skip it.
const TRIM_AFTER_TOKENS: usize = 2048;

/// Hands the pages of freed heap memory back to the system (glibc's `malloc_trim`; a no-op
/// elsewhere). Live allocations are untouched.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases memory the allocator holds free; any thread may call it.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl KvCache for LongKv {
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        self.kv.write(layer, first_pos, keys, values, num_tokens)
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.kv.for_each_chunk(layer, f)
    }

    fn for_each_chunk_of(&self, read: &KvRead<'_>, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.kv.for_each_chunk_of(read, f)
    }

    fn read_failure(&self) -> Option<String> {
        self.kv.read_failure()
    }
}

impl SeqCache for LongKv {
    fn len(&self) -> usize {
        self.kv.len()
    }

    fn reserve(&mut self, n: usize) -> Result<(), KvError> {
        let want = self.ram_with(self.cap_after(n), n);
        self.charge.resize(want)?;
        self.kv.reserve(n);
        Ok(())
    }

    /// Only to the length it holds in every layer: a sparse index cannot forget tokens.
    fn truncate(&mut self, n: usize) -> bool {
        self.kv.lens.iter().all(|&l| l == n)
    }

    fn allows_drafts(&self) -> bool {
        false
    }

    fn ram_bytes(&self) -> usize {
        self.ram_with(self.kv.cap, 0)
    }

    fn prefilled(&mut self) {
        let prompt_tokens = self.kv.len().saturating_sub(self.index_at);
        self.kv.build_index();
        // A prompt that fit the RAM budget stayed in RAM (the bounded prefill dropped its
        // file); once the conversation outgrows the budget its older KV goes to a file.
        if !self.kv.is_offloaded() && self.kv.kv_bytes() > self.off.ram_budget {
            if let Err(e) = self.kv.offload(self.off.clone()) {
                tracing::warn!("a long conversation's KV stays in RAM: {e}");
            }
        }
        self.measure_index();
        // Shrinks (or, offloaded now, grows) the charge to what is held; a growth the budget
        // refuses is charged at the next reservation, which makes room or fails the step.
        let _ = self.charge.resize(self.ram_bytes());
        if prompt_tokens >= TRIM_AFTER_TOKENS {
            release_freed_heap();
        }
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }

    fn as_kv_cache(&mut self) -> &mut dyn KvCache {
        self
    }
}
