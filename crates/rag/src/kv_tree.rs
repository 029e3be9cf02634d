//! [`KvTree`] (RAGCache's knowledge tree): the KV of prompt prefixes made of whole segments —
//! the system prompt, then retrieved chunks in order — keyed by the segments' ids and the
//! model's fingerprint and KV format.
//!
//! ```text
//!  root ─ sys:ab12 ─ c:9f0e ─ c:11d3        path (sys, c₁, c₂) holds the KV of tokens(sys)+tokens(c₁)+tokens(c₂)
//!                  │        └ c:77aa        a sibling shares the parent's blocks (copy-on-write forks)
//!                  └ c:5b60 ─ …
//! ```
//! A prompt is tokenized segment by segment and the token lists concatenated, so a segment
//! boundary is a token boundary by construction (no BPE merge across chunks, the tokenization
//! problem PerCache's appendix B.2 works around). A later prompt whose first segments are a
//! stored path starts from that path's KV; the rest is prefilled. Keys and values only: a
//! causal decoder never needs cached queries (PerCache's "QKV").
//!
//! Invariant: a path's entry holds exactly the KV the model computes for its tokens at
//! positions `0..len` (it is a fork of a sequence that computed them), so a generation that
//! starts from it equals a cold prefill of the whole prompt, token for token
//! (`tests/it/pipeline.rs`); the bytes charged stay under the cap after every insert (leaves
//! evicted least recently used first).

use std::collections::{HashMap, HashSet};

mod files;
pub use files::LoadReport;

use engram_kv::{KvFormat, SeqKv};
use engram_model::Fingerprint;

/// A segment's key: `sys:<blake3 of its tokens>` or a chunk id.
pub type SegKey = String;

struct Entry {
    kv: SeqKv,
    tokens: Vec<u32>,
    /// Tokens this entry adds to its parent's (what it is charged for).
    own_tokens: usize,
    children: usize,
    last_used: u64,
}

/// A lookup's result: the longest stored prefix of the asked path.
pub struct TreeMatch {
    /// Segments matched (0: nothing).
    pub segments: usize,
    /// A fork of the KV of those segments and its tokens.
    pub kv: Option<SeqKv>,
    pub tokens: Vec<u32>,
}

/// Counts for stats.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct TreeStats {
    pub entries: usize,
    pub bytes: usize,
    pub cap_bytes: usize,
    pub evicted: u64,
}

/// Where a tree for `fingerprint` and `format` keeps its files under `base`: one folder per
/// model and KV format, so another model's files are never even opened.
pub fn tree_dir(base: &std::path::Path, fingerprint: Fingerprint, format: KvFormat) -> std::path::PathBuf {
    let fp = engram_kv::cache_fingerprint(fingerprint, format);
    base.join(&blake3::hash(fp.as_bytes()).to_hex()[..16])
}

/// The chunk KV tree. See the module doc.
pub struct KvTree {
    fingerprint: Fingerprint,
    format: KvFormat,
    bytes_per_token: usize,
    cap_bytes: usize,
    entries: HashMap<Vec<SegKey>, Entry>,
    clock: u64,
    evicted: u64,
    /// Leaf files this tree wrote or loaded (`files.rs`).
    on_disk: HashSet<String>,
}

impl KvTree {
    /// An empty tree for one model (`fingerprint`) and KV format, charging `bytes_per_token`
    /// per token held, within `cap_bytes`.
    pub fn new(fingerprint: Fingerprint, format: KvFormat, bytes_per_token: usize, cap_bytes: usize) -> KvTree {
        KvTree { fingerprint, format, bytes_per_token, cap_bytes, entries: HashMap::new(), clock: 0, evicted: 0, on_disk: HashSet::new() }
    }

    /// The longest stored prefix of `path` for this model and format (a miss for another).
    pub fn lookup(&mut self, fingerprint: Fingerprint, format: KvFormat, path: &[SegKey]) -> TreeMatch {
        if fingerprint != self.fingerprint || format != self.format {
            return TreeMatch { segments: 0, kv: None, tokens: Vec::new() };
        }
        self.clock += 1;
        for d in (1..=path.len()).rev() {
            if let Some(e) = self.entries.get_mut(&path[..d]) {
                e.last_used = self.clock;
                let kv = e.kv.fork(e.tokens.len());
                let tokens = e.tokens.clone();
                // Ancestors are used too (their blocks are this entry's).
                for a in 1..d {
                    if let Some(p) = self.entries.get_mut(&path[..a]) {
                        p.last_used = self.clock;
                    }
                }
                return TreeMatch { segments: d, kv: Some(kv), tokens };
            }
        }
        TreeMatch { segments: 0, kv: None, tokens: Vec::new() }
    }

    /// Tokens held by the longest stored prefix of `path` (0: none), without touching the
    /// recency order or forking anything: what a lookup would reuse.
    pub fn cached_tokens(&self, path: &[SegKey]) -> usize {
        (1..=path.len()).rev().find_map(|d| self.entries.get(&path[..d])).map_or(0, |e| e.tokens.len())
    }

    /// Stores every prefix of `path` that is not stored yet: `ends[d]` is where segment `d`
    /// ends in `tokens`, and `kv` holds at least `tokens` (it is forked, never written).
    pub fn insert(&mut self, path: &[SegKey], ends: &[usize], tokens: &[u32], kv: &SeqKv) {
        assert_eq!(path.len(), ends.len(), "KvTree::insert: one end per segment");
        assert!(ends.last().is_none_or(|&e| e <= kv.len() && e <= tokens.len()), "KvTree::insert: the KV must hold the path's tokens");
        self.clock += 1;
        for d in 1..=path.len() {
            if self.entries.contains_key(&path[..d]) {
                continue;
            }
            let end = ends[d - 1];
            let own_tokens = end - if d > 1 { ends[d - 2] } else { 0 };
            if d > 1 {
                if let Some(p) = self.entries.get_mut(&path[..d - 1]) {
                    p.children += 1;
                }
            }
            self.entries.insert(
                path[..d].to_vec(),
                Entry { kv: kv.fork(end), tokens: tokens[..end].to_vec(), own_tokens, children: 0, last_used: self.clock },
            );
        }
        self.evict_to_cap();
    }

    /// Bytes charged: each entry's own tokens × bytes per token.
    pub fn bytes(&self) -> usize {
        self.entries.values().map(|e| e.own_tokens * self.bytes_per_token).sum()
    }

    fn remove(&mut self, key: &[SegKey]) {
        if self.entries.remove(key).is_some() && key.len() > 1 {
            if let Some(p) = self.entries.get_mut(&key[..key.len() - 1]) {
                p.children -= 1;
            }
        }
    }

    fn evict_to_cap(&mut self) {
        while self.bytes() > self.cap_bytes {
            if !self.evict_lru_leaf() {
                break;
            }
        }
    }

    /// Drops the least recently used leaf (its blocks go back to the pool unless shared);
    /// whether there was one. The engine's `make_room` calls this when RAM is short.
    pub fn evict_lru_leaf(&mut self) -> bool {
        let victim =
            self.entries.iter().filter(|(_, e)| e.children == 0).min_by_key(|(k, e)| (e.last_used, k.len())).map(|(k, _)| k.clone());
        match victim {
            Some(v) => {
                self.remove(&v);
                self.evicted += 1;
                true
            }
            None => false,
        }
    }

    /// Drops every entry whose path holds one of `chunks` (removed or replaced chunks), and
    /// the entries below them.
    pub fn forget_chunks(&mut self, chunks: &[SegKey]) {
        let mut doomed: Vec<Vec<SegKey>> = self.entries.keys().filter(|k| k.iter().any(|s| chunks.contains(s))).cloned().collect();
        // Deepest first, so parents' child counts stay right.
        doomed.sort_by_key(|k| std::cmp::Reverse(k.len()));
        for k in doomed {
            self.remove(&k);
        }
    }

    /// Every stored path and the tokens its entry holds, sorted by path (what the tree
    /// holds, without its recency order).
    pub fn entries(&self) -> Vec<(Vec<SegKey>, Vec<u32>)> {
        let mut v: Vec<_> = self.entries.iter().map(|(k, e)| (k.clone(), e.tokens.clone())).collect();
        v.sort();
        v
    }

    /// Counts.
    pub fn stats(&self) -> TreeStats {
        TreeStats { entries: self.entries.len(), bytes: self.bytes(), cap_bytes: self.cap_bytes, evicted: self.evicted }
    }
}
