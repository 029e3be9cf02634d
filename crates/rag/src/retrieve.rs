//! Hybrid retrieval: two rankings of chunks — BM25 (tantivy) and cosine similarity of
//! sentence-encoder vectors — fused by reciprocal rank (Cormack, Clarke & Büttcher, SIGIR 2009):
//!
//! ```text
//!  score(c) = Σ over rankings r that hold c   1 / (RRF_K + rank_r(c))      (ranks from 1)
//! ```
//! with `RRF_K = 60` (the paper's constant, which damps the weight of the very top ranks) and
//! both rankings weighted equally, each cut at [`candidate_depth`]`(k)` = max(4k, 20).
//!
//! Invariant: the result is a pure function of the two rankings: at most `k` distinct chunks,
//! best fused score first, ties broken by chunk id (so the same query over the same bank
//! always retrieves the same chunks in the same order — what the chunk KV tree keys on).

use crate::bank::ChunkId;

/// Reciprocal-rank-fusion constant.
pub const RRF_K: f64 = 60.0;

/// How deep each ranking is read for a top-`k` answer.
pub fn candidate_depth(k: usize) -> usize {
    (4 * k).max(20)
}

/// A retrieved chunk.
#[derive(Clone, Debug, PartialEq)]
pub struct Retrieved {
    pub chunk: ChunkId,
    /// Its document (filled by the bank).
    pub doc: String,
    /// The fused score.
    pub score: f64,
    /// Its rank (from 1) in the BM25 and in the cosine ranking, if it was in them.
    pub bm25_rank: Option<usize>,
    pub dense_rank: Option<usize>,
}

/// Fuses two rankings (best first) into the top `k`. See the module doc.
pub fn fuse(lexical: &[ChunkId], dense: &[ChunkId], k: usize) -> Vec<Retrieved> {
    let mut all: std::collections::BTreeMap<&ChunkId, Retrieved> = std::collections::BTreeMap::new();
    for (list, is_lexical) in [(lexical, true), (dense, false)] {
        for (i, id) in list.iter().enumerate() {
            let r = all.entry(id).or_insert_with(|| Retrieved {
                chunk: id.clone(),
                doc: String::new(),
                score: 0.0,
                bm25_rank: None,
                dense_rank: None,
            });
            // A ranking that names a chunk twice counts its first place only.
            let slot = if is_lexical { &mut r.bm25_rank } else { &mut r.dense_rank };
            if slot.is_none() {
                *slot = Some(i + 1);
                r.score += 1.0 / (RRF_K + (i + 1) as f64);
            }
        }
    }
    let mut out: Vec<Retrieved> = all.into_values().collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.chunk.cmp(&b.chunk)));
    out.truncate(k);
    out
}
