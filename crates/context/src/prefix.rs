//! The shared prefix index: chained block hashes → read-only blocks.
//!
//! ```text
//!  tokens:  [ b0: 0..32 ][ b1: 32..64 ][ b2: 64..96 ][ partial ]
//!  root  =  fp                       (salt None: shared by every tenant)
//!           H(fp, "salt", owner)     (salt Some(owner): that tenant's chains only)
//!  hashes:    h0 = H(root, fp, b0)  h1 = H(h0, fp, b1)  h2 = H(h1, fp, b2)   (partial: not indexed)
//! ```
//! Invariant: an entry is returned only if its stored tokens and parent hash
//! equal the query's, so the reused chain is token-for-token the query's
//! prefix — and, since the root is salted (like vLLM's `cache_salt`), a
//! lookup under one salt never returns a block indexed under another: a
//! tenant's `cached_tokens` say nothing about what other tenants sent.
//! Hashes use FNV-1a over little-endian ids: stable across processes and
//! versions, so persisted chains stay findable.

use std::collections::HashMap;
use std::sync::Arc;

use engram_kv::{Block, KvPool, SeqKv, BLOCK_TOKENS};
use engram_model::model::fnv1a64;
use engram_model::Fingerprint;

struct Entry {
    parent: u64,
    tokens: Vec<u32>,
    block: Arc<Block>,
    last_used: u64,
}

/// The parent hash of a chain's first block: the fingerprint alone when
/// unsalted, else bound to `salt` (a tenant), so chains of different salts
/// never meet.
pub fn chain_root(fingerprint: Fingerprint, salt: Option<&str>) -> u64 {
    match salt {
        None => fingerprint.0,
        Some(s) => {
            let mut bytes = Vec::with_capacity(13 + s.len());
            bytes.extend_from_slice(&fingerprint.0.to_le_bytes());
            bytes.extend_from_slice(b"salt\0");
            bytes.extend_from_slice(s.as_bytes());
            fnv1a64(0, &bytes)
        }
    }
}

/// The chained hashes of the full blocks of `tokens` under `salt` (see [`chain_root`]).
pub fn chain_hashes(fingerprint: Fingerprint, salt: Option<&str>, tokens: &[u32]) -> Vec<u64> {
    let mut parent = chain_root(fingerprint, salt);
    tokens
        .chunks_exact(BLOCK_TOKENS)
        .map(|b| {
            let mut bytes = Vec::with_capacity(16 + 4 * b.len());
            bytes.extend_from_slice(&parent.to_le_bytes());
            bytes.extend_from_slice(&fingerprint.0.to_le_bytes());
            for t in b {
                bytes.extend_from_slice(&t.to_le_bytes());
            }
            parent = fnv1a64(0, &bytes);
            parent
        })
        .collect()
}

/// Full blocks of finished sequences, shared read-only by any sequence that starts the same
/// way under the same salt.
pub struct PrefixIndex {
    fingerprint: Fingerprint,
    entries: HashMap<u64, Entry>,
    clock: u64,
    hits: u64,
    misses: u64,
}

impl PrefixIndex {
    /// An empty index for caches of the model with `fingerprint` (which must
    /// already include the KV format).
    pub fn new(fingerprint: Fingerprint) -> PrefixIndex {
        PrefixIndex { fingerprint, entries: HashMap::new(), clock: 0, hits: 0, misses: 0 }
    }

    /// The fingerprint chains are hashed with.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// Number of indexed blocks.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// True when nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// (lookups that reused at least one block, lookups that reused none).
    pub fn hit_counts(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Indexes the full blocks of a sequence holding `tokens` under `salt`
    /// (`None`: findable by every lookup without a salt).
    pub fn insert(&mut self, salt: Option<&str>, tokens: &[u32], kv: &SeqKv) {
        debug_assert_eq!(tokens.len(), kv.len());
        self.clock += 1;
        let hashes = chain_hashes(self.fingerprint, salt, tokens);
        let mut parent = chain_root(self.fingerprint, salt);
        for (i, h) in hashes.iter().enumerate() {
            let block = &kv.blocks()[i];
            let e = self.entries.entry(*h).or_insert_with(|| Entry {
                parent,
                tokens: tokens[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS].to_vec(),
                block: block.clone(),
                last_used: 0,
            });
            // A sequence released this block's sliding layers (`engram_kv::SlidingLayers`) and
            // nothing else holds the whole one: the index keeps the smaller copy (lookups
            // resume only where the window is whole, `SeqKv::resumable`).
            if block.released().is_some() && e.block.released().is_none() && Arc::strong_count(&e.block) == 1 {
                e.block = block.clone();
            }
            e.last_used = self.clock;
            parent = *h;
        }
    }

    /// The longest prefix of `tokens` (whole blocks) indexed under `salt`, as
    /// a new sequence sharing those blocks.
    pub fn lookup(&mut self, pool: &KvPool, salt: Option<&str>, tokens: &[u32]) -> SeqKv {
        self.clock += 1;
        let mut blocks = Vec::new();
        let mut parent = chain_root(self.fingerprint, salt);
        for (i, h) in chain_hashes(self.fingerprint, salt, tokens).into_iter().enumerate() {
            match self.entries.get_mut(&h) {
                Some(e) if e.parent == parent && e.tokens == tokens[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS] => {
                    e.last_used = self.clock;
                    blocks.push(e.block.clone());
                    parent = h;
                }
                _ => break,
            }
        }
        if blocks.is_empty() {
            self.misses += 1;
        } else {
            self.hits += 1;
        }
        let n = blocks.len() * BLOCK_TOKENS;
        SeqKv::from_blocks(pool, blocks, n)
    }

    /// Drops least-recently-used entries that no sequence shares until at
    /// least `bytes` are released or nothing more can be; returns bytes released.
    pub fn evict(&mut self, bytes: usize, block_bytes: usize) -> usize {
        let mut idle: Vec<(u64, u64)> =
            self.entries.iter().filter(|(_, e)| Arc::strong_count(&e.block) == 1).map(|(h, e)| (e.last_used, *h)).collect();
        idle.sort_unstable();
        let mut freed = 0;
        for (_, h) in idle {
            if freed >= bytes {
                break;
            }
            self.entries.remove(&h);
            freed += block_bytes;
        }
        freed
    }
}
