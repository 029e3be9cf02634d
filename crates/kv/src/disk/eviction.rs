//! Which disk entries go first when the store needs room: the eviction policies' priorities
//! and the order they give. Pinned entries are never in that order.

use std::str::FromStr;

use super::EntryStats;

/// Weighted policy: recency halves every this many seconds of disuse.
pub const RECENCY_HALF_LIFE_SECS: f64 = 24.0 * 3600.0;

/// Which entries go first when room is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Least recently used first.
    Lru,
    /// Fewest hits first (ties: least recently used).
    Lfu,
    /// The prefix-caching design's weighted score, with a recency that decays (see `priority`).
    #[default]
    Weighted,
}

impl EvictionPolicy {
    /// All policies.
    pub const ALL: [EvictionPolicy; 3] = [EvictionPolicy::Lru, EvictionPolicy::Lfu, EvictionPolicy::Weighted];

    /// Canonical name.
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Weighted => "weighted",
        }
    }

    /// The entry's priority at time `now`: the lowest is evicted first.
    ///
    /// * `Lru`: `last_used_unix`.
    /// * `Lfu`: `hits`.
    /// * `Weighted`: `0.6 * hits / (hits + 1) + 0.4 * 0.5^(age / 1 day)`,
    ///   `age = now - last_used_unix`.
    ///
    /// NOTE: the prefix-caching design scores `access_count * 0.6 + recency * 0.4` with a
    /// recency that grows with age, which keeps stale entries and evicts
    /// fresh ones. Here both terms lie in `[0, 1]`: frequency saturates (0,
    /// .5, .67, .75, ...) so hits alone cannot keep an entry forever, and
    /// recency halves with every day of disuse.
    pub fn priority(self, s: &EntryStats, now: u64) -> f64 {
        match self {
            EvictionPolicy::Lru => s.last_used_unix as f64,
            EvictionPolicy::Lfu => s.hits as f64,
            EvictionPolicy::Weighted => {
                let freq = s.hits as f64 / (s.hits as f64 + 1.0);
                let age = now.saturating_sub(s.last_used_unix) as f64;
                0.6 * freq + 0.4 * 0.5f64.powf(age / RECENCY_HALF_LIFE_SECS)
            }
        }
    }

    /// Ids of unpinned entries in eviction order (ties: least recently used,
    /// then id).
    pub fn eviction_order(self, entries: &[EntryStats], now: u64) -> Vec<String> {
        let mut v: Vec<(f64, u64, &str)> =
            entries.iter().filter(|s| !s.pinned).map(|s| (self.priority(s, now), s.last_used_unix, s.id.as_str())).collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(b.2)));
        v.into_iter().map(|(_, _, id)| id.to_string()).collect()
    }
}

impl std::fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EvictionPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        EvictionPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown eviction policy {s:?} (expected lru, lfu or weighted)"))
    }
}
