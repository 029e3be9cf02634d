//! [`QaBank`] (MeanCache's idea, PerCache's first cache level): answers kept by the meaning of
//! their query. A new query whose best cosine similarity to a stored query reaches the
//! threshold (default [`DEFAULT_THRESHOLD`], per request) gets the stored answer at once.
//!
//! ```text
//!  entry = (query vector, query, answer, source chunk ids, hits, created, generation)
//!  lookup:     best cosine over valid entries ≥ threshold → hit (hits += 1)
//!  insert:     then evict least-frequently-used (fewest hits, then least recent) past the byte cap
//!  refresh:    a source chunk removed, or an added chunk entering the query's top-k → entry dropped,
//!              its query queued in `stale` for regeneration
//! ```
//! Invariant: no entry survives a change to the knowledge bank that would change its retrieval:
//! after [`QaBank::refresh`] every entry's sources are still stored and no newly added chunk
//! is in its query's top-k (`tests/it/qa.rs`); the bank's bytes stay under its cap after every
//! insert; the file is written whole and checked when read (`envelope`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bank::{ChunkId, KnowledgeBank};
use crate::envelope;
use crate::error::{RagError, Result};

/// PerCache's similarity threshold.
pub const DEFAULT_THRESHOLD: f32 = 0.85;
/// Default storage cap of the QA bank (bytes of entries as counted by [`QaEntry::bytes`]).
pub const DEFAULT_QA_CAP_BYTES: usize = 4 << 20;

const MAGIC: &str = "engram-rag-qa";
const VERSION: u32 = 1;

/// One stored answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct QaEntry {
    pub id: u64,
    pub query: String,
    pub vector: Vec<f32>,
    pub answer: String,
    /// The answer's tokens (to compare with a generation token for token).
    pub answer_tokens: Vec<u32>,
    /// The chunks the answer was generated from, in prompt order, and their documents.
    pub sources: Vec<ChunkId>,
    pub docs: Vec<String>,
    pub hits: u64,
    /// Seconds since the Unix epoch when stored.
    pub created: u64,
    /// Logical time of the last use (insert or hit), for LFU ties.
    pub last_used: u64,
    /// The knowledge bank's generation it was answered at.
    pub generation: u64,
}

impl QaEntry {
    /// The bytes the entry is charged: its texts, vector, tokens and ids, plus 64 of overhead.
    pub fn bytes(&self) -> usize {
        64 + self.query.len()
            + self.answer.len()
            + 4 * (self.vector.len() + self.answer_tokens.len())
            + self.sources.iter().map(|c| c.0.len()).sum::<usize>()
            + self.docs.iter().map(|d| d.len()).sum::<usize>()
    }
}

/// A hit: the entry (after counting the hit) and its similarity.
#[derive(Clone, Debug)]
pub struct QaHit {
    pub entry: QaEntry,
    pub similarity: f32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct QaFile {
    entries: Vec<QaEntry>,
    next_id: u64,
    clock: u64,
    /// Queries whose answers were invalidated, oldest first, for regeneration.
    stale: Vec<String>,
    evicted: u64,
    invalidated: u64,
}

/// Counts for stats.
#[derive(Clone, Debug, Default, Serialize)]
pub struct QaStats {
    pub entries: usize,
    pub bytes: usize,
    pub cap_bytes: usize,
    pub evicted: u64,
    pub invalidated: u64,
    pub stale_queued: usize,
}

/// The QA bank. See the module doc.
pub struct QaBank {
    path: Option<PathBuf>,
    cap_bytes: usize,
    f: QaFile,
}

impl QaBank {
    /// A bank kept in RAM only.
    pub fn in_memory(cap_bytes: usize) -> QaBank {
        QaBank { path: None, cap_bytes, f: QaFile::default() }
    }

    /// Opens (or starts) the bank saved at `path`. A damaged, truncated or foreign file is an
    /// error and is left as it is.
    pub fn open(path: &Path, cap_bytes: usize) -> Result<QaBank> {
        let f = match envelope::read_checked(path, MAGIC, VERSION)? {
            Some(body) => serde_json::from_slice(&body).map_err(|e| RagError::bad_store(path, format!("QA bank: {e}")))?,
            None => QaFile::default(),
        };
        let mut b = QaBank { path: Some(path.to_path_buf()), cap_bytes, f };
        b.evict_to_cap();
        Ok(b)
    }

    /// Writes the bank (atomically) if it has a file.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        let body = serde_json::to_vec(&self.f).map_err(|e| RagError::bad_store(path, e.to_string()))?;
        envelope::write_atomic(path, MAGIC, VERSION, &body)
    }

    /// The entries.
    pub fn entries(&self) -> &[QaEntry] {
        &self.f.entries
    }

    /// The best entry for query vector `qv` if its similarity is at least `threshold`
    /// (counted as a hit), else `None`. Ties go to the older entry.
    pub fn lookup(&mut self, qv: &[f32], threshold: f32) -> Option<QaHit> {
        let (i, sim) = self.f.entries.iter().enumerate().map(|(i, e)| (i, engram_embed::cosine(qv, &e.vector))).fold(
            None::<(usize, f32)>,
            |best, (i, s)| match best {
                Some((_, b)) if b >= s => best,
                _ => Some((i, s)),
            },
        )?;
        if sim < threshold {
            return None;
        }
        self.f.clock += 1;
        let e = &mut self.f.entries[i];
        e.hits += 1;
        e.last_used = self.f.clock;
        Some(QaHit { entry: e.clone(), similarity: sim })
    }

    /// The best entry's id and similarity for `qv`, without counting a hit (`None` if empty).
    /// Idle-time population asks this to skip a predicted query the bank already answers.
    pub fn best(&self, qv: &[f32]) -> Option<(u64, f32)> {
        self.f.entries.iter().map(|e| (e.id, engram_embed::cosine(qv, &e.vector))).fold(None, |best, (id, s)| match best {
            Some((_, b)) if b >= s => best,
            _ => Some((id, s)),
        })
    }

    /// The entry with `id`, if stored.
    pub fn entry(&self, id: u64) -> Option<&QaEntry> {
        self.f.entries.iter().find(|e| e.id == id)
    }

    /// Takes entry `id` out of the bank (the layer choice's QA → KV conversion); `None` if
    /// it is not stored. Not counted as an eviction or an invalidation.
    pub fn remove(&mut self, id: u64) -> Option<QaEntry> {
        let i = self.f.entries.iter().position(|e| e.id == id)?;
        Some(self.f.entries.remove(i))
    }

    /// Stores an answer; then evicts LFU entries until the bank fits its cap (the new entry
    /// too, if it alone is over the cap). Returns the new entry's id.
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &mut self,
        query: &str,
        vector: Vec<f32>,
        answer: &str,
        answer_tokens: Vec<u32>,
        sources: Vec<ChunkId>,
        docs: Vec<String>,
        generation: u64,
    ) -> u64 {
        self.f.clock += 1;
        let id = self.f.next_id;
        self.f.next_id += 1;
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        self.f.stale.retain(|q| q != query);
        self.f.entries.push(QaEntry {
            id,
            query: query.to_string(),
            vector,
            answer: answer.to_string(),
            answer_tokens,
            sources,
            docs,
            hits: 0,
            created,
            last_used: self.f.clock,
            generation,
        });
        self.evict_to_cap();
        id
    }

    fn bytes(&self) -> usize {
        self.f.entries.iter().map(QaEntry::bytes).sum()
    }

    fn evict_to_cap(&mut self) {
        while self.bytes() > self.cap_bytes && !self.f.entries.is_empty() {
            let victim =
                (0..self.f.entries.len()).min_by_key(|&i| (self.f.entries[i].hits, self.f.entries[i].last_used)).expect("non-empty");
            self.f.entries.remove(victim);
            self.f.evicted += 1;
        }
    }

    /// Drops the entries whose retrieval the bank's last change altered: a source chunk no
    /// longer stored, a chunk of `added` in its query's top-`k` now, or sources that are no
    /// longer the first chunks of that top-`k` in order (BM25's statistics move with every
    /// document, so old chunks can change places without a new one entering). Sources are
    /// the prompt's chunks, a prefix of the top-`k` in rank order; a shorter prompt now only
    /// invalidates more. Their queries are queued as stale. Returns the dropped ids.
    pub fn refresh(&mut self, bank: &KnowledgeBank, added: &[ChunkId], k: usize) -> Result<Vec<u64>> {
        let added: std::collections::HashSet<&ChunkId> = added.iter().collect();
        let mut dropped = Vec::new();
        let mut keep = Vec::with_capacity(self.f.entries.len());
        for e in std::mem::take(&mut self.f.entries) {
            let gone = e.sources.iter().any(|c| !bank.has_chunk(c));
            let moved = !gone && {
                let now = bank.search(&e.query, &e.vector, k)?;
                now.iter().any(|r| added.contains(&r.chunk)) || !now.iter().map(|r| &r.chunk).take(e.sources.len()).eq(e.sources.iter())
            };
            if gone || moved {
                dropped.push(e.id);
                self.f.invalidated += 1;
                if !self.f.stale.contains(&e.query) {
                    self.f.stale.push(e.query.clone());
                }
            } else {
                keep.push(e);
            }
        }
        self.f.entries = keep;
        Ok(dropped)
    }

    /// Queries whose answers were invalidated and not answered again since.
    pub fn stale(&self) -> &[String] {
        &self.f.stale
    }

    /// Takes the oldest stale query off the queue (to answer it again).
    pub fn pop_stale(&mut self) -> Option<String> {
        (!self.f.stale.is_empty()).then(|| self.f.stale.remove(0))
    }

    /// Puts `query` back at the head of the stale queue (an interrupted regeneration: it runs
    /// again first).
    pub fn push_stale_front(&mut self, query: String) {
        self.f.stale.insert(0, query);
    }

    /// Drops every entry (not the stale queue).
    pub fn clear(&mut self) {
        self.f.entries.clear();
    }

    /// Counts.
    pub fn stats(&self) -> QaStats {
        QaStats {
            entries: self.f.entries.len(),
            bytes: self.bytes(),
            cap_bytes: self.cap_bytes,
            evicted: self.f.evicted,
            invalidated: self.f.invalidated,
            stale_queued: self.f.stale.len(),
        }
    }
}
