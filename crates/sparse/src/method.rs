//! The selection methods: one [`HeadIndex`] per (layer, KV head), made by a [`Method`], so
//! DynaKV and every baseline run in the same cache and harness.
//!
//! Invariant (every implementation): [`HeadIndex::select`] pushes only tokens of the
//! `eligible` range, each at most once, at most `budget` of them, and given a budget of at
//! least `eligible.len()` it pushes every eligible token (so a full budget is exact attention).

use std::ops::Range;

use crate::clusters::{ClusterIndex, Update};
use crate::keys::{dot, HeadKeys};
use crate::kmeans::SEGMENT;
use crate::persist::codec::{Dec, Enc, Short};

/// Per-head retrieval state of one method.
///
/// `Sync`: a pending save reads the index on its writer thread while the cache holds it
/// (shared copy on write, `crate::shared`).
pub trait HeadIndex: Send + Sync {
    /// A copy of this index's whole state (for forking a cache with its index).
    fn clone_box(&self) -> Box<dyn HeadIndex>;

    /// Appends this index's whole state to `out` (a saved sequence, `crate::persist`);
    /// [`Method::load_index`] reads it back into an index that selects exactly as this one.
    fn save(&self, out: &mut Vec<u8>);

    /// The bytes [`HeadIndex::save`] appends, without writing them (the index's size as the
    /// KV pool charges it). The default saves into a scratch buffer; an index whose state
    /// grows with the history computes it instead.
    fn saved_len(&self) -> usize {
        let mut out = Vec::new();
        self.save(&mut out);
        out.len()
    }

    /// Indexes the prefill's tokens `range` (their keys readable in `keys`): called for
    /// consecutive ranges from token 0, each [`SEGMENT`] tokens from a multiple of it but the
    /// last, before any `append`; [`HeadIndex::finish_build`] ends the prefill. So a prefill
    /// streamed to disk builds the index a segment at a time, exactly as [`HeadIndex::build`].
    fn build_part(&mut self, keys: HeadKeys<'_>, range: Range<usize>);

    /// The end of the prefill's indexing (after its last [`HeadIndex::build_part`]).
    fn finish_build(&mut self) {}

    /// Indexes tokens `0..keys.len()` (the prefill) at once: every segment, then the end.
    /// Called once, before any `append`.
    fn build(&mut self, keys: HeadKeys<'_>) {
        let n = keys.len();
        for s in (0..n).step_by(SEGMENT) {
            self.build_part(keys, s..(s + SEGMENT).min(n));
        }
        self.finish_build();
    }

    /// Token `keys.len() - 1` was just stored (a decode step).
    fn append(&mut self, keys: HeadKeys<'_>);

    /// Pushes to `out` the tokens of `eligible` these queries attend, at most `budget`.
    /// `queries` is `[group × dim]`, rotated and pre-scaled.
    fn select(&mut self, keys: HeadKeys<'_>, queries: &[f32], eligible: Range<usize>, budget: usize, out: &mut Vec<u32>);

    /// What the index did so far.
    fn stats(&self) -> IndexStats {
        IndexStats::default()
    }

    /// Calls `f(cluster, members)` for each cluster the last `select` fetched whole (both
    /// halves of one it split); nothing for token-level methods. An offloaded cache reads and
    /// caches these units.
    fn for_each_fetched(&self, _f: &mut dyn FnMut(u32, &[u32])) {}

    /// Moves to `out` the clusters whose members changed since the last call (joins, splits,
    /// new clusters): the "recently updated" clusters a cache retains.
    fn drain_touched(&mut self, _out: &mut Vec<u32>) {}

    /// End of the prefill: `queries` (`[tokens × group, dim]`, the prefill's last query
    /// tokens, oldest first) are scored as `select` would score them, and which units each
    /// would retrieve together is recorded for [`HeadIndex::placement`] (replacing an earlier
    /// calibration). Changes no retrieval.
    fn calibrate(&mut self, _queries: &[f32], _group: usize, _eligible: Range<usize>, _budget: usize) {}

    /// Every indexed token once, as (cluster, members) in the on-disk order that makes a
    /// cluster one contiguous read: with `co_retrieval`, clusters retrieved together at
    /// calibration lie next to each other ([`crate::placement`]), else in index order;
    /// `None`: position order.
    fn placement(&self, co_retrieval: bool) -> Option<Vec<(u32, Vec<u32>)>> {
        self.placement_of(co_retrieval, 0..u32::MAX)
    }

    /// [`HeadIndex::placement`] of the units in `units` only (those one prefill segment made:
    /// its tokens' clusters), in the same relative order.
    fn placement_of(&self, _co_retrieval: bool, _units: Range<u32>) -> Option<Vec<(u32, Vec<u32>)>> {
        None
    }

    /// Pushes `(unit, token)` for every indexed token `>= from` (the tokens a flush writes,
    /// to place each next to its cluster); tokens in no unit are left out.
    fn units_since(&self, _from: u32, _out: &mut Vec<(u32, u32)>) {}
}

/// Counters of an index (sums; [`IndexStats::add`] adds two heads'). `*_tokens` are rows a
/// disk-resident cache would read: a cluster fetched for retrieval, or fetched only to split.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IndexStats {
    /// Clusters (or pages) the index holds now.
    pub units: usize,
    /// Retrieval units chosen, and the tokens they held.
    pub fetched_units: usize,
    pub fetched_tokens: usize,
    /// Clusters split, and the tokens read from disk only to split (not for retrieval).
    pub splits: usize,
    pub split_fetch_tokens: usize,
    /// Entries that waited in a delayed-split buffer.
    pub buffered: usize,
}

impl IndexStats {
    /// The sum of two heads' counters.
    pub fn add(self, o: IndexStats) -> IndexStats {
        IndexStats {
            units: self.units + o.units,
            fetched_units: self.fetched_units + o.fetched_units,
            fetched_tokens: self.fetched_tokens + o.fetched_tokens,
            splits: self.splits + o.splits,
            split_fetch_tokens: self.split_fetch_tokens + o.split_fetch_tokens,
            buffered: self.buffered + o.buffered,
        }
    }
}

/// Which tokens a sparse step retrieves (besides the sinks and the recent window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// DynaKV (the paper's Algorithm 1): prefill k-means, then nearest-cluster assignment with
    /// variance-triggered 2-means splits, delayed for clusters not in RAM until they are next
    /// fetched or the buffers pass `b_max`; `eager` splits on every flag instead (fetching the
    /// cluster just to split it), the comparison for the I/O the delay saves.
    DynaKv { b_max: usize, eager: bool },
    /// Token-level oracle: the tokens holding the most exact softmax mass of the group's query
    /// heads (the upper bound of a per-KV-head token set).
    Oracle,
    /// No clusters: tokens ranked by their score against the group's summed query (a
    /// token-level index; the DynaKV paper's per-token retrieval baseline).
    Tokens,
    /// Static update (PQCache-like): prefill k-means; each new key joins its nearest cluster.
    Static,
    /// Local update (ClusterKV-like): prefill k-means; new keys re-clustered in windows of
    /// `window` tokens into `k` clusters (the window being filled is always attended).
    Local { window: usize, k: usize },
    /// Quest: pages of `page` tokens with per-dimension min/max; pages ranked by the upper
    /// bound of `q·k` over the page.
    Quest { page: usize },
    /// StreamingLLM: the sinks and the recent window only.
    Streaming,
}

impl Method {
    /// DynaKV's buffer budget `B_max` (buffered entries per head before a forced split).
    pub const B_MAX: usize = 64;
    /// DynaKV with delayed splits and the paper's `B_max`: the method served for long conversations.
    pub const DYNAKV: Method = Method::DynaKv { b_max: Method::B_MAX, eager: false };

    /// Every method with its default parameters, DynaKV first.
    pub fn all() -> Vec<Method> {
        vec![
            Method::DynaKv { b_max: Method::B_MAX, eager: false },
            Method::Oracle,
            Method::Tokens,
            Method::Static,
            Method::Local { window: 320, k: 8 },
            Method::Quest { page: 16 },
            Method::Streaming,
        ]
    }

    /// Parses a name: `dynakv`, `dynakv-eager`, `oracle`, `tokens`, `static`, `local`,
    /// `quest`, `streaming`.
    pub fn parse(s: &str) -> Result<Method, String> {
        Ok(match s {
            "dynakv" => Method::DynaKv { b_max: Method::B_MAX, eager: false },
            "dynakv-eager" => Method::DynaKv { b_max: Method::B_MAX, eager: true },
            "oracle" => Method::Oracle,
            "tokens" => Method::Tokens,
            "static" => Method::Static,
            "local" => Method::Local { window: 320, k: 8 },
            "quest" => Method::Quest { page: 16 },
            "streaming" => Method::Streaming,
            _ => {
                return Err(format!("unknown sparse method {s:?} (dynakv, dynakv-eager, oracle, tokens, static, local, quest, streaming)"))
            }
        })
    }

    /// The method's name, as [`Method::parse`] reads it.
    pub fn name(&self) -> &'static str {
        match self {
            Method::DynaKv { eager: false, .. } => "dynakv",
            Method::DynaKv { eager: true, .. } => "dynakv-eager",
            Method::Oracle => "oracle",
            Method::Tokens => "tokens",
            Method::Static => "static",
            Method::Local { .. } => "local",
            Method::Quest { .. } => "quest",
            Method::Streaming => "streaming",
        }
    }

    /// Reads back an index this method made and [`HeadIndex::save`] wrote, over a history of
    /// `n` tokens of `dim` elements (every length and token checked).
    pub(crate) fn load_index(&self, dim: usize, n: usize, d: &mut Dec<'_>) -> Result<Box<dyn HeadIndex>, Short> {
        Ok(match *self {
            Method::DynaKv { b_max, eager } => Box::new(ClusterIndex::load(dim, Update::Adaptive { b_max, eager }, n, d)?),
            Method::Static => Box::new(ClusterIndex::load(dim, Update::Static, n, d)?),
            Method::Local { window, k } => Box::new(ClusterIndex::load(dim, Update::Local { window, k }, n, d)?),
            Method::Quest { page } => {
                let (min, max, len) = (d.f32s("quest minima")?, d.f32s("quest maxima")?, d.len("quest tokens")?);
                let pages = len.div_ceil(page.max(1));
                if len > n || min.len() != pages * dim || max.len() != pages * dim {
                    return Err(Short("quest index: pages do not match the history".into()));
                }
                Box::new(QuestIndex { page, dim, min, max, len })
            }
            Method::Oracle | Method::Tokens | Method::Streaming => self.index(dim),
        })
    }

    /// A fresh index for one (layer, KV head) of keys of `dim` elements.
    pub fn index(&self, dim: usize) -> Box<dyn HeadIndex> {
        match *self {
            Method::DynaKv { b_max, eager } => Box::new(ClusterIndex::new(dim, Update::Adaptive { b_max, eager })),
            Method::Static => Box::new(ClusterIndex::new(dim, Update::Static)),
            Method::Local { window, k } => Box::new(ClusterIndex::new(dim, Update::Local { window, k })),
            Method::Oracle => Box::new(TokenIndex { summed: false }),
            Method::Tokens => Box::new(TokenIndex { summed: true }),
            Method::Quest { page } => Box::new(QuestIndex { page, dim, min: Vec::new(), max: Vec::new(), len: 0 }),
            Method::Streaming => Box::new(Streaming),
        }
    }
}

/// No index: selects every eligible token, fetches no clusters (reads that are not a
/// retrieval, such as an offloaded cache's full reads).
#[derive(Clone)]
pub(crate) struct NoIndex;

impl HeadIndex for NoIndex {
    fn clone_box(&self) -> Box<dyn HeadIndex> {
        Box::new(self.clone())
    }
    fn save(&self, _out: &mut Vec<u8>) {} // no state beyond the method
    fn build_part(&mut self, _keys: HeadKeys<'_>, _range: Range<usize>) {}
    fn append(&mut self, _keys: HeadKeys<'_>) {}
    fn select(&mut self, _keys: HeadKeys<'_>, _q: &[f32], eligible: Range<usize>, _budget: usize, out: &mut Vec<u32>) {
        out.extend(eligible.map(|t| t as u32));
    }
}

/// Token-level retrieval: every eligible token scored (no index beyond the keys).
#[derive(Clone)]
struct TokenIndex {
    /// Rank by the summed query's score (a token index) rather than the exact group mass.
    summed: bool,
}

impl HeadIndex for TokenIndex {
    fn clone_box(&self) -> Box<dyn HeadIndex> {
        Box::new(self.clone())
    }
    fn save(&self, _out: &mut Vec<u8>) {} // no state beyond the method
    fn build_part(&mut self, _keys: HeadKeys<'_>, _range: Range<usize>) {}
    fn append(&mut self, _keys: HeadKeys<'_>) {}

    fn select(&mut self, keys: HeadKeys<'_>, queries: &[f32], eligible: Range<usize>, budget: usize, out: &mut Vec<u32>) {
        if budget >= eligible.len() {
            out.extend(eligible.map(|t| t as u32));
            return;
        }
        let d = keys.dim();
        let group = queries.len() / d;
        let mut k = vec![0f32; eligible.len() * d];
        keys.rows(eligible.clone(), &mut k);
        let mut score: Vec<(f32, u32)> = Vec::with_capacity(eligible.len());
        if self.summed {
            let mut q = vec![0f32; d];
            for row in queries.chunks_exact(d) {
                q.iter_mut().zip(row).for_each(|(a, b)| *a += b);
            }
            score.extend(k.chunks_exact(d).zip(eligible.clone()).map(|(x, t)| (dot(&q, x), t as u32)));
        } else {
            // Per query head: softmax over the eligible tokens; a token's score is its mass
            // summed over the group.
            score.extend(eligible.clone().map(|t| (0f32, t as u32)));
            let mut s = vec![0f32; eligible.len()];
            for q in queries.chunks_exact(d).take(group) {
                for (v, x) in s.iter_mut().zip(k.chunks_exact(d)) {
                    *v = dot(q, x);
                }
                let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let z: f64 = s.iter().map(|&v| ((v - m) as f64).exp()).sum();
                for (acc, &v) in score.iter_mut().zip(&s) {
                    acc.0 += (((v - m) as f64).exp() / z) as f32;
                }
            }
        }
        score.select_nth_unstable_by(budget, |a, b| b.0.total_cmp(&a.0));
        out.extend(score[..budget].iter().map(|&(_, t)| t));
    }
}

/// Quest: per page of `page` tokens, the per-dimension min and max of its keys.
#[derive(Clone)]
struct QuestIndex {
    page: usize,
    dim: usize,
    min: Vec<f32>,
    max: Vec<f32>,
    len: usize,
}

impl QuestIndex {
    fn add(&mut self, x: &[f32]) {
        if self.len % self.page == 0 {
            self.min.extend_from_slice(x);
            self.max.extend_from_slice(x);
        } else {
            let p = self.len / self.page;
            let (lo, hi) = (&mut self.min[p * self.dim..(p + 1) * self.dim], &mut self.max[p * self.dim..(p + 1) * self.dim]);
            for ((l, h), &v) in lo.iter_mut().zip(hi.iter_mut()).zip(x) {
                *l = l.min(v);
                *h = h.max(v);
            }
        }
        self.len += 1;
    }
}

impl HeadIndex for QuestIndex {
    fn clone_box(&self) -> Box<dyn HeadIndex> {
        Box::new(self.clone())
    }
    fn save(&self, out: &mut Vec<u8>) {
        let mut e = Enc(out);
        e.f32s(&self.min);
        e.f32s(&self.max);
        e.len(self.len);
    }
    fn build_part(&mut self, keys: HeadKeys<'_>, range: Range<usize>) {
        let mut x = vec![0f32; self.dim];
        for t in range {
            keys.row(t, &mut x);
            self.add(&x);
        }
    }

    fn append(&mut self, keys: HeadKeys<'_>) {
        let mut x = vec![0f32; self.dim];
        keys.row(keys.len() - 1, &mut x);
        self.add(&x);
    }

    fn select(&mut self, _keys: HeadKeys<'_>, queries: &[f32], eligible: Range<usize>, budget: usize, out: &mut Vec<u32>) {
        let d = self.dim;
        // Pages overlapping the eligible range, ranked by the best upper bound over the
        // group's query heads; taken whole while they fit.
        let pages = eligible.start / self.page..eligible.end.div_ceil(self.page).min(self.len.div_ceil(self.page));
        let mut ranked: Vec<(f32, usize)> = pages
            .map(|p| {
                let (lo, hi) = (&self.min[p * d..(p + 1) * d], &self.max[p * d..(p + 1) * d]);
                let bound = queries
                    .chunks_exact(d)
                    .map(|q| q.iter().zip(lo.iter().zip(hi)).map(|(&q, (&l, &h))| (q * l).max(q * h)).sum::<f32>())
                    .fold(f32::NEG_INFINITY, f32::max);
                (bound, p)
            })
            .collect();
        ranked.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut left = budget;
        for (_, p) in ranked {
            let toks = (p * self.page).max(eligible.start)..((p + 1) * self.page).min(eligible.end);
            if toks.len() <= left {
                left -= toks.len();
                out.extend(toks.map(|t| t as u32));
            }
        }
    }

    fn stats(&self) -> IndexStats {
        IndexStats { units: self.len.div_ceil(self.page), ..IndexStats::default() }
    }
}

/// StreamingLLM: nothing beyond the sinks and the recent window, unless the budget covers
/// every eligible token (then all, as for every method).
#[derive(Clone)]
struct Streaming;

impl HeadIndex for Streaming {
    fn clone_box(&self) -> Box<dyn HeadIndex> {
        Box::new(self.clone())
    }
    fn save(&self, _out: &mut Vec<u8>) {} // no state beyond the method
    fn build_part(&mut self, _keys: HeadKeys<'_>, _range: Range<usize>) {}
    fn append(&mut self, _keys: HeadKeys<'_>) {}
    fn select(&mut self, _keys: HeadKeys<'_>, _q: &[f32], eligible: Range<usize>, budget: usize, out: &mut Vec<u32>) {
        if budget >= eligible.len() {
            out.extend(eligible.map(|t| t as u32));
        }
    }
}
