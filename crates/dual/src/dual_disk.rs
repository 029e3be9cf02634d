//! The disk budget of dual-stream files: every user's stream file, every thread's ring
//! (manifest and turn files) and every masked turn's file charged to its owner's account, against the server's disk
//! budget and each account's share of it (`--disk-budget-mib`, the tenant share), as the
//! session store charges its entries.
//!
//! ```text
//!  charge(key, account, bytes)   a ring saved (its files' bytes), a stream or a masked turn written
//!  over_budget(protect)          the rings to drop, least recently used first, until the total
//!                                fits the budget and every account its share
//! ```
//! Invariant: `used` is the sum of the charged bytes; [`DualDiskLedger::over_budget`] names
//! only evictable entries (rings, masked turns' files and, when their user is idle, stream files: the caller says
//! which by `evictable` and `protect`) that `protect` does not keep, and once they
//! are removed the total and each account fit as far as evictable entries allow
//! (this file's tests; through the policy, `crates/dual/tests/it/dual_files.rs`).

use std::collections::HashMap;

/// One charged file group.
#[derive(Clone, Debug)]
struct Charged {
    account: String,
    bytes: u64,
    last_used: u64,
    /// Whether it may be evicted at all (`protect` decides per call).
    evictable: bool,
}

/// Bytes on disk per ring and stream, by account. See the module doc.
#[derive(Debug)]
pub struct DualDiskLedger {
    budget: u64,
    share: Option<u64>,
    clock: u64,
    charged: HashMap<String, Charged>,
}

impl DualDiskLedger {
    /// A ledger for `budget` bytes in all, at most `share` bytes per account (`None`: the
    /// whole budget).
    pub fn new(budget: u64, share: Option<u64>) -> DualDiskLedger {
        DualDiskLedger { budget, share, clock: 0, charged: HashMap::new() }
    }

    /// Charges `key` (a ring's key or a stream's file name) `bytes` for `account`, replacing
    /// what it was charged, and marks it used now. `evictable`: whether it may ever be evicted.
    pub fn charge(&mut self, key: &str, account: &str, bytes: u64, evictable: bool) {
        self.clock += 1;
        self.charged.insert(key.to_string(), Charged { account: account.to_string(), bytes, last_used: self.clock, evictable });
    }

    /// Charges `key` as found on disk at start: used before everything charged later.
    pub fn charge_found(&mut self, key: &str, account: &str, bytes: u64, evictable: bool, age_rank: u64) {
        self.charged.insert(key.to_string(), Charged { account: account.to_string(), bytes, last_used: age_rank, evictable });
        self.clock = self.clock.max(age_rank);
    }

    /// Marks `key` used now (a thread's turn); unknown keys are ignored.
    pub fn touch(&mut self, key: &str) {
        self.clock += 1;
        if let Some(c) = self.charged.get_mut(key) {
            c.last_used = self.clock;
        }
    }

    /// Stops charging `key` (its files deleted).
    pub fn remove(&mut self, key: &str) {
        self.charged.remove(key);
    }

    /// Bytes charged in all.
    pub fn used(&self) -> u64 {
        self.charged.values().map(|c| c.bytes).sum()
    }

    /// Bytes charged to `account`.
    pub fn account_used(&self, account: &str) -> u64 {
        self.charged.values().filter(|c| c.account == account).map(|c| c.bytes).sum()
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Whether the total fits the budget and every account its share (nothing to evict).
    pub fn within_limits(&self) -> bool {
        if self.used() > self.budget {
            return false;
        }
        let Some(share) = self.share else { return true };
        let mut accounts: HashMap<&str, u64> = HashMap::new();
        for c in self.charged.values() {
            *accounts.entry(c.account.as_str()).or_default() += c.bytes;
        }
        accounts.values().all(|&b| b <= share)
    }

    /// The entries to evict, least recently used first, so that every account fits its share
    /// and the total the budget — skipping those `protect` keeps (threads with a turn running).
    pub fn over_budget(&self, protect: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut lru: Vec<(&String, &Charged)> = self.charged.iter().filter(|(k, c)| c.evictable && !protect(k)).collect();
        lru.sort_by_key(|(k, c)| (c.last_used, k.as_str()));
        let mut accounts: HashMap<&str, u64> = HashMap::new();
        for c in self.charged.values() {
            *accounts.entry(c.account.as_str()).or_default() += c.bytes;
        }
        let mut total = self.used();
        let mut out = Vec::new();
        // Accounts over their share first (their own rings), then the total.
        if let Some(share) = self.share {
            for (k, c) in &lru {
                let a = accounts.get_mut(c.account.as_str()).expect("counted above");
                if *a > share {
                    *a -= c.bytes;
                    total -= c.bytes;
                    out.push((*k).clone());
                }
            }
        }
        for (k, c) in &lru {
            if total <= self.budget {
                break;
            }
            if !out.contains(k) {
                total -= c.bytes;
                out.push((*k).clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_rings_go_first_and_streams_stay() {
        let mut l = DualDiskLedger::new(100, None);
        l.charge("stream-a", "a", 30, false);
        l.charge("ring-1", "a", 30, true);
        l.charge("ring-2", "b", 30, true);
        l.charge("ring-3", "b", 30, true);
        l.touch("ring-1");
        assert_eq!(l.used(), 120);
        assert_eq!(l.over_budget(&|_| false), vec!["ring-2".to_string()]);
        assert_eq!(l.over_budget(&|k| k == "ring-2"), vec!["ring-3".to_string()]);
        assert!(!l.within_limits());
        l.remove("ring-2");
        assert!(l.over_budget(&|_| false).is_empty());
        assert!(l.within_limits());
    }

    #[test]
    fn an_account_over_its_share_loses_its_own_rings() {
        let mut l = DualDiskLedger::new(1000, Some(50));
        l.charge("ring-a1", "a", 30, true);
        l.charge("ring-b1", "b", 30, true);
        l.charge("ring-a2", "a", 30, true);
        assert_eq!(l.over_budget(&|_| false), vec!["ring-a1".to_string()], "b fits its share: untouched");
        assert_eq!(l.account_used("a"), 60);
        assert!(!l.within_limits(), "a is over its share");
    }
}
