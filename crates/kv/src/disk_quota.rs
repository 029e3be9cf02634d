//! `GroupQuota`: a cap on the bytes one group of owners may hold in a [`crate::disk::DiskStore`]
//! (a tenant's sessions, its agents' pinned ones and its prefix chains), so that one tenant
//! filling the disk budget evicts its own entries, not every other tenant's.
//!
//! Mechanism apart from policy: the store knows owners, not tenants; the caller says how an
//! owner maps to its group ([`GroupQuota::new`]'s `group_of`) and the store enforces the cap.
//! Invariant (with a quota set): after every put, each group's entries take at most
//! `bytes`, pinned ones included — a put that only evicting the group's own unpinned entries
//! cannot fit is refused, changing nothing; other groups' entries are never evicted for it
//! beyond what the store's whole budget needs.

use std::fmt;
use std::sync::Arc;

use crate::disk::{EntryStats, EvictionPolicy};

/// Maps an entry's owner metadata to its group (a tenant).
pub type GroupOf = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// At most `bytes` per group of owners.
#[derive(Clone)]
pub struct GroupQuota {
    /// Bytes one group may hold on disk, pinned entries included.
    pub bytes: u64,
    group_of: GroupOf,
}

impl fmt::Debug for GroupQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupQuota").field("bytes", &self.bytes).finish_non_exhaustive()
    }
}

/// Why a put does not fit its group's quota.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverQuota {
    pub group: String,
    /// The group's pinned bytes, which no eviction frees.
    pub pinned: u64,
}

impl GroupQuota {
    /// A quota of `bytes` per group, groups given by `group_of(owner)`.
    pub fn new(bytes: u64, group_of: impl Fn(&str) -> String + Send + Sync + 'static) -> GroupQuota {
        GroupQuota { bytes, group_of: Arc::new(group_of) }
    }

    /// The group of an entry's owner.
    pub fn group(&self, owner: &str) -> String {
        (self.group_of)(owner)
    }

    /// The entries to evict, in `policy`'s order, so that an entry of `bytes` owned by `owner`
    /// fits its group's quota, counting `id`'s current version as replaced (the rename frees
    /// it); `Err` when even evicting all the group's unpinned entries would not do.
    pub fn victims(
        &self,
        entries: &[EntryStats],
        id: &str,
        owner: &str,
        bytes: u64,
        policy: EvictionPolicy,
        now: u64,
    ) -> Result<Vec<String>, OverQuota> {
        let group = self.group(owner);
        let mine: Vec<EntryStats> = entries.iter().filter(|s| s.id != id && self.group(&s.owner) == group).cloned().collect();
        let pinned: u64 = mine.iter().filter(|s| s.pinned).map(|s| s.bytes).sum();
        if pinned + bytes > self.bytes {
            return Err(OverQuota { group, pinned });
        }
        let mut used: u64 = mine.iter().map(|s| s.bytes).sum();
        let mut out = Vec::new();
        for victim in policy.eviction_order(&mine, now) {
            if used + bytes <= self.bytes {
                break;
            }
            used -= mine.iter().find(|s| s.id == victim).map_or(0, |s| s.bytes);
            out.push(victim);
        }
        Ok(out)
    }
}
