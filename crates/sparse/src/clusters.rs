//! Clustered keys of one (layer, KV head): prefill k-means (per [`crate::kmeans::SEGMENT`] of the history),
//! one representative (centroid)
//! per cluster with its size and variance, retrieval of whole clusters under a token budget,
//! and the three ways new keys join: static, local and adaptive (DynaKV, the paper's
//! Algorithm 1).
//!
//! Adaptive update: a new key joins its nearest cluster (centroid and variance updated
//! incrementally, Welford); when the cluster's variance passes its head's threshold `τ`
//! (calibrated at prefill: the 90th percentile of the prefill clusters' variances) the cluster
//! is flagged. A flagged cluster that is in RAM (fetched by the last retrieval) is split at
//! once by 2-means; otherwise its new entries wait in a buffer (delayed split) until a
//! retrieval fetches it, which splits it for free; when the head's buffers hold `B_max`
//! entries the cluster with the most buffered entries is fetched only to be split (counted in
//! [`IndexStats::split_fetch_tokens`]). `eager` fetches on every flag instead.
//!
//! Invariant: every token indexed is in exactly one cluster (or, for local update, in the
//! window being filled), so choosing every cluster chooses every token.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::keys::{dist2, dot, HeadKeys};
use crate::kmeans::{cluster_count, kmeans, nearest};
use crate::method::{HeadIndex, IndexStats};
use crate::persist::codec::{Dec, Enc, Short};

/// Lloyd iterations at prefill and for splits (4: the assignment changes little after, and
/// prefill clustering is the index's main cost).
const ITERS: usize = 4;

/// Process-wide: retrieval chooses clusters the way it was first written (every cluster
/// sorted and walked, `ClusterIndex::choose_walking`) instead of the default scan. Both choose
/// the same clusters; the switch exists to time them on one cache, step by step.
static REFERENCE_SELECTION: AtomicBool = AtomicBool::new(false);

/// Switches every cluster index of the process to the reference selection (`true`) or back
/// to the default (`false`). The clusters chosen are the same either way (tested); only the
/// time differs.
pub fn set_reference_selection(on: bool) {
    REFERENCE_SELECTION.store(on, Ordering::Relaxed);
}

/// How new keys join the clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update {
    Static,
    Local { window: usize, k: usize },
    Adaptive { b_max: usize, eager: bool },
}

/// What a retrieval scan reads of one cluster without touching its member list: its size,
/// `ln(size)` (the score's size prior) and its first and last member (members are in position
/// order, so a cluster lies wholly inside an eligible range when both ends do).
#[derive(Clone, Copy, Debug, Default)]
struct Shape {
    size: u32,
    first: u32,
    last: u32,
    ln_size: f32,
}

impl Shape {
    fn of(members: &[u32]) -> Shape {
        Shape {
            size: members.len() as u32,
            first: members.first().copied().unwrap_or(0),
            last: members.last().copied().unwrap_or(0),
            ln_size: (members.len().max(1) as f32).ln(),
        }
    }
}

/// The clusters of one head.
#[derive(Clone)]
pub struct ClusterIndex {
    dim: usize,
    update: Update,
    /// Centroids `[k × dim]` and `|c|²/2` per cluster.
    cent: Vec<f32>,
    half_norm: Vec<f32>,
    members: Vec<Vec<u32>>,
    /// Per cluster, kept equal to `Shape::of(&members[c])`: a step's scan over every cluster
    /// reads these contiguous entries, never the member lists (one heap block per cluster).
    shape: Vec<Shape>,
    /// Sum of squared distances of the members to the centroid.
    m2: Vec<f64>,
    /// Variance threshold (mean squared distance) past which a cluster is flagged.
    tau: f64,
    flagged: Vec<bool>,
    buffered: Vec<usize>,
    total_buffered: usize,
    /// Fetched by the last retrieval (in RAM).
    resident: Vec<bool>,
    /// Local update: the window being filled.
    pending: Vec<u32>,
    /// Clusters the last retrieval fetched (after its delayed splits: both halves).
    last_chosen: Vec<u32>,
    /// Clusters whose members changed since [`HeadIndex::drain_touched`] last ran.
    touched: Vec<u32>,
    /// Per cluster: bit `j` set when calibration query token `j` (the prefill's last query
    /// tokens, oldest first) would retrieve it; a split's new half inherits its parent's.
    coret: Vec<u64>,
    stats: IndexStats,
}

impl ClusterIndex {
    /// An empty index for keys of `dim` elements.
    pub fn new(dim: usize, update: Update) -> ClusterIndex {
        ClusterIndex {
            dim,
            update,
            cent: Vec::new(),
            half_norm: Vec::new(),
            members: Vec::new(),
            shape: Vec::new(),
            m2: Vec::new(),
            tau: f64::INFINITY,
            flagged: Vec::new(),
            buffered: Vec::new(),
            total_buffered: 0,
            resident: Vec::new(),
            pending: Vec::new(),
            last_chosen: Vec::new(),
            touched: Vec::new(),
            coret: Vec::new(),
            stats: IndexStats::default(),
        }
    }

    /// Clusters held.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True before the first cluster.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members of cluster `c`.
    pub fn members(&self, c: usize) -> &[u32] {
        &self.members[c]
    }

    /// The variance threshold calibrated at prefill.
    pub fn threshold(&self) -> f64 {
        self.tau
    }

    /// Mean squared distance of cluster `c`'s members to its centroid.
    pub fn variance(&self, c: usize) -> f64 {
        self.m2[c] / self.members[c].len().max(1) as f64
    }

    /// Adds clusters of `tokens` by k-means into `k`.
    fn add_clusters(&mut self, keys: HeadKeys<'_>, tokens: &[u32], k: usize) {
        let d = self.dim;
        let (cent, assign) = kmeans(keys, tokens, k, ITERS);
        let first = self.members.len();
        let kk = cent.len() / d;
        self.touched.extend(first as u32..(first + kk) as u32);
        for c in 0..kk {
            self.push_cluster(&cent[c * d..(c + 1) * d], Vec::new());
        }
        for (&t, &a) in tokens.iter().zip(&assign) {
            self.members[first + a as usize].push(t);
        }
        let mut x = vec![0f32; d];
        for c in first..first + kk {
            self.shape[c] = Shape::of(&self.members[c]);
            self.m2[c] = self.members[c]
                .iter()
                .map(|&t| {
                    keys.row(t as usize, &mut x);
                    dist2(&x, &self.cent[c * d..(c + 1) * d]) as f64
                })
                .sum();
        }
    }

    fn push_cluster(&mut self, centroid: &[f32], members: Vec<u32>) {
        self.cent.extend_from_slice(centroid);
        self.half_norm.push(0.5 * dot(centroid, centroid));
        self.shape.push(Shape::of(&members));
        self.members.push(members);
        self.m2.push(0.0);
        self.flagged.push(false);
        self.buffered.push(0);
        self.resident.push(false);
        self.coret.push(0);
    }

    /// Welford: adds token `t` (key `x`) to cluster `c`.
    fn join(&mut self, c: usize, t: u32, x: &[f32]) {
        let d = self.dim;
        self.touched.push(c as u32);
        self.members[c].push(t);
        self.shape[c] = Shape::of(&self.members[c]);
        let n = self.members[c].len() as f32;
        let cent = &mut self.cent[c * d..(c + 1) * d];
        let mut m2 = 0f64;
        for (m, &v) in cent.iter_mut().zip(x) {
            let delta = v - *m;
            *m += delta / n;
            m2 += (delta * (v - *m)) as f64;
        }
        self.m2[c] += m2;
        self.half_norm[c] = 0.5 * dot(cent, cent);
    }

    /// Each cluster's estimated attention mass. Per query head: softmax over clusters of
    /// q·c + ln(size) (the estimated share of the head's attention mass each cluster holds); a
    /// cluster's score is its summed share. One pass over the centroids scores every query
    /// head of the group (each centroid row read once), one `exp` per cluster and head.
    fn scores(&self, queries: &[f32]) -> Vec<f32> {
        let (d, k) = (self.dim, self.len());
        let group = queries.len() / d;
        let mut s = vec![0f32; group * k];
        for (c, (row, sh)) in self.cent.chunks_exact(d).zip(&self.shape).enumerate() {
            for (j, q) in queries.chunks_exact(d).enumerate() {
                s[j * k + c] = dot(q, row) + sh.ln_size;
            }
        }
        let mut score = vec![0f32; k];
        for s in s.chunks_exact_mut(k.max(1)).take(group) {
            let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            s.iter_mut().for_each(|v| *v = (*v - m).exp());
            let z: f32 = s.iter().sum();
            for (acc, &e) in score.iter_mut().zip(s.iter()) {
                *acc += e / z;
            }
        }
        score
    }

    /// Clusters by [`ClusterIndex::scores`], highest first; ties go to the lower index.
    fn rank(&self, queries: &[f32]) -> Vec<usize> {
        let score = self.scores(queries);
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_unstable_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
        order
    }

    /// Members of cluster `c` inside `eligible`: from its shape when the cluster lies wholly
    /// inside or outside (all but the few clusters holding sinks or recent tokens), else by
    /// binary search of its members (position order).
    fn eligible_count(&self, c: usize, eligible: &Range<usize>) -> usize {
        let sh = self.shape[c];
        if sh.size == 0 || sh.first as usize >= eligible.end || (sh.last as usize) < eligible.start {
            return 0;
        }
        if sh.first as usize >= eligible.start && (sh.last as usize) < eligible.end {
            return sh.size as usize;
        }
        let m = &self.members[c];
        m.partition_point(|&t| (t as usize) < eligible.end) - m.partition_point(|&t| (t as usize) < eligible.start)
    }

    /// Splits cluster `c` in two by 2-means over its members (`c` keeps one half).
    fn split(&mut self, keys: HeadKeys<'_>, c: usize) {
        self.total_buffered -= self.buffered[c];
        self.buffered[c] = 0;
        self.flagged[c] = false;
        let d = self.dim;
        let members = std::mem::take(&mut self.members[c]);
        keys.prefetch(c as u32, &members);
        let (cent, assign) = kmeans(keys, &members, 2, ITERS);
        if cent.len() < 2 * d {
            self.members[c] = members; // all members coincide: nothing to split
            return;
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (&t, &g) in members.iter().zip(&assign) {
            if g == 0 {
                a.push(t)
            } else {
                b.push(t)
            }
        }
        self.cent[c * d..(c + 1) * d].copy_from_slice(&cent[..d]);
        self.half_norm[c] = 0.5 * dot(&cent[..d], &cent[..d]);
        self.shape[c] = Shape::of(&a);
        self.members[c] = a;
        let resident = self.resident[c];
        self.push_cluster(&cent[d..], b);
        let nc = self.members.len() - 1;
        self.resident[nc] = resident;
        self.coret[nc] = self.coret[c];
        self.touched.extend([c as u32, nc as u32]);
        let mut x = vec![0f32; d];
        for cc in [c, nc] {
            self.m2[cc] = self.members[cc]
                .iter()
                .map(|&t| {
                    keys.row(t as usize, &mut x);
                    dist2(&x, &self.cent[cc * d..(cc + 1) * d]) as f64
                })
                .sum();
        }
        self.stats.splits += 1;
    }

    /// The clusters a step takes, pushing their eligible members to `out` (`left`: the budget
    /// still open), in order.
    fn choose(&self, queries: &[f32], eligible: &Range<usize>, mut left: usize, out: &mut Vec<u32>) -> Vec<usize> {
        // Clusters in score order (ties: lower index first), each taken whole while its
        // eligible members fit what is left of the budget, skipped otherwise. Only the best
        // `head` are sorted; if budget is left after them, only the rest that could still fit
        // (eligible members <= what is left, which only shrinks) are — the same choice as
        // walking the whole order, without sorting or touching every cluster's members.
        let score = self.scores(queries);
        let k = self.len();
        let by_score = |a: &u32, b: &u32| score[*b as usize].total_cmp(&score[*a as usize]).then(a.cmp(b));
        let mean = (self.shape.iter().map(|s| s.size as usize).sum::<usize>() / k.max(1)).max(1);
        let head = (2 * left / mean + 16).min(k);
        let mut ids: Vec<u32> = (0..k as u32).collect();
        if head < k {
            ids.select_nth_unstable_by(head, by_score);
        }
        ids[..head].sort_unstable_by(by_score);
        let mut chosen = Vec::new();
        let mut take = |list: &[u32], left: &mut usize| {
            for &c in list {
                if *left == 0 {
                    break;
                }
                let c = c as usize;
                let got = self.eligible_count(c, eligible);
                if got > *left {
                    continue;
                }
                out.extend(self.members[c].iter().copied().filter(|&t| eligible.contains(&(t as usize))));
                *left -= got;
                chosen.push(c);
            }
        };
        take(&ids[..head], &mut left);
        if left > 0 && head < k {
            let mut rest: Vec<u32> = ids[head..].iter().copied().filter(|&c| self.eligible_count(c as usize, eligible) <= left).collect();
            rest.sort_unstable_by(by_score);
            take(&rest, &mut left);
        }
        chosen
    }

    /// The choice as first written, the reference [`ClusterIndex::choose`] must equal: per
    /// query head `ln(size)` and two `exp` per cluster, every cluster sorted, and the whole
    /// order walked, each cluster's eligible members copied out before its fit is known.
    /// Kept for the exactness test and for timing both on one cache
    /// ([`set_reference_selection`]).
    fn choose_walking(&self, queries: &[f32], eligible: &Range<usize>, mut left: usize, out: &mut Vec<u32>) -> Vec<usize> {
        let (d, k) = (self.dim, self.len());
        let mut score = vec![0f32; k];
        let mut s = vec![0f32; k];
        for q in queries.chunks_exact(d) {
            for (c, v) in s.iter_mut().enumerate() {
                *v = dot(q, &self.cent[c * d..(c + 1) * d]) + (self.members[c].len().max(1) as f32).ln();
            }
            let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let z: f32 = s.iter().map(|&v| (v - m).exp()).sum();
            for (acc, &v) in score.iter_mut().zip(&s) {
                *acc += (v - m).exp() / z;
            }
        }
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_unstable_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
        let mut chosen = Vec::new();
        for c in order {
            if left == 0 {
                break;
            }
            let before = out.len();
            out.extend(self.members[c].iter().copied().filter(|&t| eligible.contains(&(t as usize))));
            let got = out.len() - before;
            if got > left {
                out.truncate(before);
                continue;
            }
            left -= got;
            chosen.push(c);
        }
        chosen
    }
}

impl ClusterIndex {
    /// Reads back what [`HeadIndex::save`] wrote for an index of keys of `dim` elements made
    /// with `update`, over a history of `n` tokens; every length and token checked (a
    /// cluster's shape is recomputed from its members).
    pub(crate) fn load(dim: usize, update: Update, n: usize, d: &mut Dec<'_>) -> Result<ClusterIndex, Short> {
        let bad = |what: &str| Short(format!("cluster index: {what}"));
        let mut idx = ClusterIndex::new(dim, update);
        idx.cent = d.f32s("centroids")?;
        idx.half_norm = d.f32s("centroid norms")?;
        let k = d.len("clusters")?;
        if idx.cent.len() != k.checked_mul(dim).ok_or_else(|| bad("cluster count"))? || idx.half_norm.len() != k {
            return Err(bad("centroids do not match the cluster count"));
        }
        for _ in 0..k {
            let m = d.u32s("members")?;
            if m.windows(2).any(|w| w[0] >= w[1]) || m.last().is_some_and(|&t| t as usize >= n) {
                return Err(bad("members out of order or past the history"));
            }
            idx.shape.push(Shape::of(&m));
            idx.members.push(m);
        }
        idx.m2 = d.f64s("variances")?;
        idx.tau = d.f64("threshold")?;
        idx.flagged = d.bools("flags")?;
        idx.buffered = d.lens("buffered")?;
        idx.total_buffered = d.len("total buffered")?;
        idx.resident = d.bools("resident")?;
        idx.pending = d.u32s("pending")?;
        idx.last_chosen = d.u32s("last chosen")?;
        idx.touched = d.u32s("touched")?;
        idx.coret = d.u64s("co-retrieval signatures")?;
        let lens = [idx.m2.len(), idx.flagged.len(), idx.buffered.len(), idx.resident.len(), idx.coret.len()];
        if lens.iter().any(|&l| l != k) {
            return Err(bad("per-cluster fields do not match the cluster count"));
        }
        if idx.pending.iter().any(|&t| t as usize >= n) || idx.last_chosen.iter().chain(&idx.touched).any(|&c| c as usize >= k) {
            return Err(bad("a pending token or a cluster id out of range"));
        }
        let s = &mut idx.stats;
        for v in [&mut s.units, &mut s.fetched_units, &mut s.fetched_tokens, &mut s.splits, &mut s.split_fetch_tokens, &mut s.buffered] {
            *v = d.len("counters")?;
        }
        Ok(idx)
    }
}

impl HeadIndex for ClusterIndex {
    fn clone_box(&self) -> Box<dyn HeadIndex> {
        Box::new(self.clone())
    }

    fn save(&self, out: &mut Vec<u8>) {
        let mut e = Enc(out);
        e.f32s(&self.cent);
        e.f32s(&self.half_norm);
        e.len(self.members.len());
        self.members.iter().for_each(|m| e.u32s(m));
        e.f64s(&self.m2);
        e.f64(self.tau);
        e.bools(&self.flagged);
        e.lens(&self.buffered);
        e.len(self.total_buffered);
        e.bools(&self.resident);
        e.u32s(&self.pending);
        e.u32s(&self.last_chosen);
        e.u32s(&self.touched);
        e.u64s(&self.coret);
        let s = &self.stats;
        for v in [s.units, s.fetched_units, s.fetched_tokens, s.splits, s.split_fetch_tokens, s.buffered] {
            e.len(v);
        }
    }

    fn saved_len(&self) -> usize {
        // `save`'s fields: each list is its 8-byte length and its elements, then the counters.
        let list = |n: usize, size: usize| 8 + n * size;
        list(self.cent.len(), 4)
            + list(self.half_norm.len(), 4)
            + 8
            + self.members.iter().map(|m| list(m.len(), 4)).sum::<usize>()
            + list(self.m2.len(), 8)
            + 8
            + list(self.flagged.len(), 1)
            + list(self.buffered.len(), 8)
            + 8
            + list(self.resident.len(), 1)
            + list(self.pending.len(), 4)
            + list(self.last_chosen.len(), 4)
            + list(self.touched.len(), 4)
            + list(self.coret.len(), 8)
            + 6 * 8
    }

    fn build_part(&mut self, keys: HeadKeys<'_>, range: Range<usize>) {
        // Segment by segment (k-means cost linear in the history, peak memory one segment's).
        if !range.is_empty() {
            let tokens: Vec<u32> = (range.start as u32..range.end as u32).collect();
            self.add_clusters(keys, &tokens, cluster_count(tokens.len()));
        }
    }

    fn finish_build(&mut self) {
        // τ: the 90th percentile of the prefill clusters' variances (clusters of >= 2).
        let mut vars: Vec<f64> = (0..self.len()).filter(|&c| self.members[c].len() >= 2).map(|c| self.variance(c)).collect();
        vars.sort_by(f64::total_cmp);
        self.tau = vars.get(vars.len() * 9 / 10).copied().unwrap_or(f64::INFINITY);
    }

    fn append(&mut self, keys: HeadKeys<'_>) {
        let t = keys.len() - 1;
        let mut x = vec![0f32; self.dim];
        keys.row(t, &mut x);
        if let Update::Local { window, k } = self.update {
            self.pending.push(t as u32);
            if self.pending.len() >= window {
                let pending = std::mem::take(&mut self.pending);
                self.add_clusters(keys, &pending, k);
            }
            return;
        }
        if self.is_empty() {
            self.push_cluster(&x, Vec::new());
        }
        let c = nearest(&x, &self.cent, &self.half_norm);
        self.join(c, t as u32, &x);
        let Update::Adaptive { b_max, eager } = self.update else { return };
        if self.flagged[c] || (self.members[c].len() >= 4 && self.variance(c) > self.tau) {
            if self.resident[c] || eager {
                if !self.resident[c] {
                    self.stats.split_fetch_tokens += self.members[c].len();
                }
                self.split(keys, c);
            } else {
                self.flagged[c] = true;
                self.buffered[c] += 1;
                self.total_buffered += 1;
                self.stats.buffered += 1;
                if self.total_buffered >= b_max {
                    let worst = (0..self.len()).max_by_key(|&i| self.buffered[i]).expect("a cluster");
                    self.stats.split_fetch_tokens += self.members[worst].len();
                    self.split(keys, worst);
                }
            }
        }
    }

    fn select(&mut self, keys: HeadKeys<'_>, queries: &[f32], eligible: Range<usize>, budget: usize, out: &mut Vec<u32>) {
        let mut left = budget;
        // The local window being filled is in RAM and always attended.
        for &t in &self.pending {
            if eligible.contains(&(t as usize)) && left > 0 {
                out.push(t);
                left -= 1;
            }
        }
        let chosen = if REFERENCE_SELECTION.load(Ordering::Relaxed) {
            self.choose_walking(queries, &eligible, left, out)
        } else {
            self.choose(queries, &eligible, left, out)
        };
        self.resident.iter_mut().for_each(|r| *r = false);
        self.last_chosen.clear();
        self.last_chosen.extend(chosen.iter().map(|&c| c as u32));
        for &c in &chosen {
            self.resident[c] = true;
            self.stats.fetched_units += 1;
            self.stats.fetched_tokens += self.members[c].len();
        }
        // Delayed splits: a flagged cluster just fetched splits with no extra read.
        for c in chosen {
            if self.flagged[c] {
                let before = self.len();
                self.split(keys, c);
                if self.len() > before {
                    self.last_chosen.push((self.len() - 1) as u32);
                }
            }
        }
    }

    fn for_each_fetched(&self, f: &mut dyn FnMut(u32, &[u32])) {
        for &c in &self.last_chosen {
            f(c, &self.members[c as usize]);
        }
    }

    fn drain_touched(&mut self, out: &mut Vec<u32>) {
        out.append(&mut self.touched);
    }

    fn calibrate(&mut self, queries: &[f32], group: usize, eligible: Range<usize>, budget: usize) {
        self.coret.iter_mut().for_each(|c| *c = 0);
        let per = group * self.dim;
        if per == 0 {
            return;
        }
        let tokens = queries.len() / per;
        let first = tokens.saturating_sub(crate::placement::CALIB);
        for (j, q) in queries.chunks_exact(per).skip(first).enumerate() {
            // The clusters `select` would fetch for this query token (nothing else changes).
            let mut left = budget;
            for c in self.rank(q) {
                if left == 0 {
                    break;
                }
                let got = self.eligible_count(c, &eligible);
                if got <= left {
                    left -= got;
                    self.coret[c] |= 1 << j;
                }
            }
        }
    }

    fn placement_of(&self, co_retrieval: bool, units: Range<u32>) -> Option<Vec<(u32, Vec<u32>)>> {
        let units = units.start.min(self.len() as u32)..units.end.min(self.len() as u32);
        let order: Vec<u32> = if co_retrieval {
            crate::placement::co_retrieval_order(&self.coret[units.start as usize..units.end as usize])
                .into_iter()
                .map(|c| c + units.start)
                .collect()
        } else {
            units.collect()
        };
        Some(order.into_iter().map(|c| (c, self.members[c as usize].clone())).collect())
    }

    fn units_since(&self, from: u32, out: &mut Vec<(u32, u32)>) {
        // Members are in position order (prefill segments in order, joins at the end, splits
        // keep the order), so each cluster's tokens `>= from` are its last ones.
        for (c, m) in self.members.iter().enumerate() {
            out.extend(m.iter().rev().take_while(|&&t| t >= from).map(|&t| (c as u32, t)));
        }
    }

    fn stats(&self) -> IndexStats {
        IndexStats { units: self.len(), ..self.stats }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// The selection as first written: walk every cluster in rank order, taking each whose
    /// eligible members fit what is left.
    fn walk(idx: &ClusterIndex, queries: &[f32], eligible: Range<usize>, budget: usize) -> (Vec<u32>, Vec<usize>) {
        let mut out = Vec::new();
        let chosen = idx.choose_walking(queries, &eligible, budget, &mut out);
        (out, chosen)
    }

    #[test]
    fn select_chooses_exactly_what_walking_the_whole_rank_order_chooses() {
        let (d, n) = (8, 3000);
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let rows: Vec<f16> = (0..n * d).map(|i| f16::from_f32(rnd() + if (i / d) % 7 == 0 { 2.0 } else { 0.0 })).collect();
        let mut idx = ClusterIndex::new(d, Update::Adaptive { b_max: 16, eager: false });
        idx.build(HeadKeys::new(&rows[..2000 * d], d));
        for t in 2000..n {
            idx.append(HeadKeys::new(&rows[..(t + 1) * d], d));
        }
        let keys = HeadKeys::new(&rows, d);
        for trial in 0..40 {
            let q: Vec<f32> = (0..3 * d).map(|_| 3.0 * rnd()).collect();
            let budget = [1, 7, 50, 200, 640, 2999, 5000][trial % 7];
            let eligible = [4..n - 64, 0..n, 100..2500, 4..n - 1][trial % 4].clone();
            let (want, want_chosen) = walk(&idx, &q, eligible.clone(), budget);
            let mut got = Vec::new();
            assert_eq!(idx.choose(&q, &eligible, budget, &mut got), want_chosen, "trial {trial}, budget {budget}");
            assert_eq!(got, want, "trial {trial}, budget {budget}");
            got.clear();
            idx.clone().select(keys, &q, eligible, budget, &mut got);
            assert_eq!(got, want, "trial {trial}, budget {budget}");
        }
    }
}
