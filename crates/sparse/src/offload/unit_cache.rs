//! The cluster cache: fetched clusters' rows kept in RAM under a byte budget, keyed by
//! (layer, KV head, cluster), with two replacement policies compared at equal size.
//!
//! - [`Policy::Lru`]: evict the least recently used cluster.
//! - [`Policy::ClusterAligned`] (DynaKV paper §6.2): clusters updated in the last
//!   [`RETAIN_STEPS`] tokens (a join or a split) are retained; among the others the victim
//!   is the one with the largest `rows × steps since last use`, so small clusters stay
//!   (principle 1) and large stale ones go first.
//!
//! A cached entry is a set of (file row, bytes). Rows are immutable once written, so an
//! entry is never wrong, only possibly incomplete (a cluster that gained members on disk
//! since): a lookup hits only if the entry holds every row asked for.
//!
//! Invariant: the bytes held never exceed the budget; a hit returns exactly the bytes that
//! were inserted for those rows.

use std::collections::HashMap;

/// Tokens during which a recently updated cluster is retained by [`Policy::ClusterAligned`].
pub const RETAIN_STEPS: u64 = 8;

/// Which cluster leaves the cache when it is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Lru,
    ClusterAligned,
}

impl Policy {
    /// Parses `lru` or `cluster`.
    pub fn parse(s: &str) -> Result<Policy, String> {
        match s {
            "lru" => Ok(Policy::Lru),
            "cluster" => Ok(Policy::ClusterAligned),
            _ => Err(format!("unknown cache policy {s:?} (cluster, lru)")),
        }
    }

    /// The name [`Policy::parse`] reads.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::ClusterAligned => "cluster",
        }
    }
}

/// (layer, KV head, cluster).
pub type Key = (u32, u32, u32);

struct Entry {
    rows: Vec<u64>,
    bytes: Vec<u8>,
    last_use: u64,
    updated: u64,
    /// Put here by the layer-ahead prefetch and not looked up since.
    prefetched: bool,
}

/// Cache counters: lookups that hit or missed, and the rows each served; entries the
/// layer-ahead prefetch put in, how many of those a lookup then hit, and how many left unused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub hit_rows: u64,
    pub miss_rows: u64,
    pub evictions: u64,
    pub prefetched: u64,
    pub prefetch_hits: u64,
    pub prefetch_unused: u64,
}

/// The cache (module doc).
pub struct ClusterCache {
    cap: usize,
    used: usize,
    row_bytes: usize,
    policy: Policy,
    entries: HashMap<Key, Entry>,
    stats: CacheStats,
}

impl ClusterCache {
    /// An empty cache of `cap` bytes of rows of `row_bytes`.
    pub fn new(cap: usize, row_bytes: usize, policy: Policy) -> ClusterCache {
        ClusterCache { cap, used: 0, row_bytes, policy, entries: HashMap::new(), stats: CacheStats::default() }
    }

    /// Copies rows `rows` (sorted, distinct) of cluster `key` into `out` (in that order) if
    /// the cached entry holds all of them; counts a hit or a miss.
    pub fn get(&mut self, key: Key, rows: &[u64], now: u64, out: &mut Vec<u8>) -> bool {
        let rb = self.row_bytes;
        let hit = match self.entries.get_mut(&key) {
            Some(e) => match positions(&e.rows, rows) {
                Some(idx) => {
                    e.last_use = now;
                    if std::mem::take(&mut e.prefetched) {
                        self.stats.prefetch_hits += 1;
                    }
                    for j in idx {
                        out.extend_from_slice(&e.bytes[j * rb..(j + 1) * rb]);
                    }
                    true
                }
                None => false,
            },
            None => false,
        };
        if hit {
            self.stats.hits += 1;
            self.stats.hit_rows += rows.len() as u64;
        } else {
            self.stats.misses += 1;
            self.stats.miss_rows += rows.len() as u64;
        }
        hit
    }

    /// Whether the entry of `key` holds every row of `rows` (sorted); counts nothing.
    pub fn holds(&self, key: Key, rows: &[u64]) -> bool {
        self.entries.get(&key).is_some_and(|e| positions(&e.rows, rows).is_some())
    }

    /// Keeps `bytes` (the rows `rows`, sorted) for cluster `key`, replacing its entry and
    /// evicting others by the policy; an entry larger than the whole budget is not kept.
    pub fn insert(&mut self, key: Key, rows: Vec<u64>, bytes: Vec<u8>, now: u64) {
        self.put(key, rows, bytes, now, false);
    }

    /// [`ClusterCache::insert`] for the layer-ahead prefetch: counted as prefetched until a
    /// lookup hits it (or it leaves unused).
    pub fn insert_prefetched(&mut self, key: Key, rows: Vec<u64>, bytes: Vec<u8>, now: u64) {
        if self.put(key, rows, bytes, now, true) {
            self.stats.prefetched += 1;
        }
    }

    fn put(&mut self, key: Key, rows: Vec<u64>, bytes: Vec<u8>, now: u64, prefetched: bool) -> bool {
        debug_assert_eq!(rows.len() * self.row_bytes, bytes.len());
        let updated = self.remove(key).map_or(0, |e| e.updated);
        if bytes.len() > self.cap || bytes.is_empty() {
            return false;
        }
        while self.used + bytes.len() > self.cap {
            let Some(victim) = self.victim(now) else { break };
            self.remove(victim);
            self.stats.evictions += 1;
        }
        self.used += bytes.len();
        self.entries.insert(key, Entry { rows, bytes, last_use: now, updated, prefetched });
        true
    }

    /// Marks cluster `key` updated at `now` (a join or a split), if cached.
    pub fn mark_updated(&mut self, key: Key, now: u64) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.updated = now;
        }
    }

    fn remove(&mut self, key: Key) -> Option<Entry> {
        let e = self.entries.remove(&key)?;
        self.used -= e.bytes.len();
        if e.prefetched {
            self.stats.prefetch_unused += 1;
        }
        Some(e)
    }

    fn victim(&self, now: u64) -> Option<Key> {
        let lru = || self.entries.iter().min_by_key(|(k, e)| (e.last_use, **k)).map(|(k, _)| *k);
        match self.policy {
            Policy::Lru => lru(),
            Policy::ClusterAligned => self
                .entries
                .iter()
                .filter(|(_, e)| now.saturating_sub(e.updated) > RETAIN_STEPS)
                .max_by_key(|(k, e)| (e.rows.len() as u64 * (now.saturating_sub(e.last_use) + 1), std::cmp::Reverse(**k)))
                .map(|(k, _)| *k)
                .or_else(lru),
        }
    }

    /// Bytes held.
    pub fn used(&self) -> usize {
        self.used
    }

    /// The counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

/// Where each of `want` (sorted) lies in `have` (sorted), if every one is there.
fn positions(have: &[u64], want: &[u64]) -> Option<Vec<usize>> {
    let mut idx = Vec::with_capacity(want.len());
    let mut j = 0;
    for &r in want {
        while j < have.len() && have[j] < r {
            j += 1;
        }
        if j == have.len() || have[j] != r {
            return None;
        }
        idx.push(j);
    }
    Some(idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(r: std::ops::Range<u64>) -> (Vec<u64>, Vec<u8>) {
        (r.clone().collect(), r.flat_map(|x| [x as u8, (x >> 8) as u8]).collect())
    }

    #[test]
    fn a_hit_returns_the_inserted_bytes_and_a_partial_entry_misses() {
        let mut c = ClusterCache::new(1 << 10, 2, Policy::Lru);
        let (r, b) = rows(10..20);
        c.insert((0, 0, 1), r, b, 1);
        let mut out = Vec::new();
        assert!(c.get((0, 0, 1), &[11, 15], 2, &mut out));
        assert_eq!(out, vec![11, 0, 15, 0]);
        out.clear();
        assert!(!c.get((0, 0, 1), &[11, 25], 3, &mut out));
        assert!(out.is_empty());
        assert_eq!(c.stats().hits, 1);
        assert_eq!(c.stats().misses, 1);
    }

    #[test]
    fn the_budget_holds_and_each_policy_picks_its_victim() {
        // Budget 40 bytes = 20 rows of 2 bytes. A big stale cluster (12 rows), a small one (4).
        for (policy, evicted) in [(Policy::Lru, (0, 0, 2)), (Policy::ClusterAligned, (0, 0, 1))] {
            let mut c = ClusterCache::new(40, 2, policy);
            let (r, b) = rows(0..12);
            c.insert((0, 0, 1), r, b, 100);
            let (r, b) = rows(100..104);
            c.insert((0, 0, 2), r, b, 90);
            let (r, b) = rows(200..206);
            c.insert((0, 0, 3), r, b, 120);
            assert!(c.used() <= 40, "{policy:?}");
            assert!(!c.entries.contains_key(&evicted), "{policy:?} should evict {evicted:?}");
        }
    }

    #[test]
    fn prefetched_entries_count_their_first_hit_or_their_eviction_unused() {
        let mut c = ClusterCache::new(24, 2, Policy::Lru);
        let (r, b) = rows(0..6);
        c.insert_prefetched((0, 1, 1), r.clone(), b.clone(), 5);
        assert!(c.holds((0, 1, 1), &[1, 4]) && !c.holds((0, 1, 1), &[1, 9]));
        let mut out = Vec::new();
        assert!(c.get((0, 1, 1), &[2], 6, &mut out));
        assert!(c.get((0, 1, 1), &[3], 6, &mut out));
        assert_eq!(out, vec![2, 0, 3, 0]);
        let (r2, b2) = rows(10..16);
        c.insert_prefetched((0, 1, 2), r2, b2, 7);
        let (r3, b3) = rows(20..32);
        c.insert((0, 1, 3), r3, b3, 8); // fills the cache: evicts (0,1,1), then (0,1,2), never looked up
        let s = c.stats();
        assert_eq!((s.prefetched, s.prefetch_hits, s.prefetch_unused), (2, 1, 1), "{s:?}");
    }

    #[test]
    fn recently_updated_clusters_are_retained_by_the_cluster_policy() {
        let mut c = ClusterCache::new(40, 2, Policy::ClusterAligned);
        let (r, b) = rows(0..12);
        c.insert((0, 0, 1), r, b, 100);
        c.mark_updated((0, 0, 1), 118);
        let (r, b) = rows(100..104);
        c.insert((0, 0, 2), r, b, 90);
        let (r, b) = rows(200..206);
        c.insert((0, 0, 3), r, b, 120);
        assert!(c.entries.contains_key(&(0, 0, 1)), "updated 2 tokens ago: retained");
        assert!(!c.entries.contains_key(&(0, 0, 2)));
    }
}
