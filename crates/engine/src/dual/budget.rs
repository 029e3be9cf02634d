//! [`DualStream`]'s files under the disk budget (issue 15): its streams and rings are charged
//! to their owners' accounts in a [`DualDiskLedger`] against `--disk-budget-mib` and the
//! tenant share; past either, whole rings of the least recently used threads are deleted from
//! disk (never a stream, never a thread with a turn running). An evicted thread still in RAM
//! answers as before (its ring is untouched there) and is written whole at its next turn; one
//! that is not starts empty after a restart, like a thread whose ring was never saved.
//!
//! Invariant: once the writers are flushed, the `dual/` directory holds at most the budget (and
//! each account its share) plus the streams, which are never evicted
//! (`crates/engine/tests/dual_budget.rs`).

use engram_context::{account, stream_file_name, DualDiskLedger, RingStore};

use super::DualStream;

impl DualStream {
    /// Keeps this policy's files (with [`DualStream::with_dir`]) within `budget` bytes, each
    /// account within `share` bytes of it (`None`: the whole budget); files a previous process
    /// left are charged at once (rings oldest first by their manifest's time) and evicted if
    /// over. Without a directory it does nothing.
    pub fn set_disk_budget(&mut self, budget: u64, share: Option<u64>) {
        let (Some(dir), Some(rings)) = (&self.dir, &self.rings) else { return };
        let mut ledger = DualDiskLedger::new(budget, share);
        let mut found = rings.on_disk();
        found.sort_by_key(|(key, _, _, modified)| (*modified, key.clone()));
        for (rank, (key, owner, bytes, _)) in found.into_iter().enumerate() {
            ledger.charge_found(&key, account(&owner), bytes, true, rank as u64);
        }
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("stream-") && name.ends_with(".safetensors") {
                if let Ok(info) = engram_kv::read_meta(&e.path()) {
                    ledger.charge_found(&name, account(&info.meta.owner), e.metadata().map_or(0, |m| m.len()), false, 0);
                }
            }
        }
        self.ledger = Some(ledger);
        self.enforce_disk_budget();
    }

    /// Bytes of this policy's files the disk budget counts (0 without one).
    pub fn disk_bytes_charged(&self) -> u64 {
        self.ledger.as_ref().map_or(0, |l| l.used())
    }

    /// Charges `owner`'s `thread` ring at `bytes` (just saved) and enforces the budget.
    pub(super) fn charge_ring(&mut self, owner: &str, thread: &str, bytes: u64) {
        let Some(ledger) = self.ledger.as_mut() else { return };
        ledger.charge(&RingStore::ring_key(owner, thread), account(owner), bytes, true);
        self.enforce_disk_budget();
    }

    /// Charges `owner`'s stream file at `bytes` (just written or restored) and enforces the budget.
    pub(super) fn charge_stream(&mut self, owner: &str, bytes: u64) {
        let Some(ledger) = self.ledger.as_mut() else { return };
        ledger.charge(&stream_file_name(owner), account(owner), bytes, false);
        self.enforce_disk_budget();
    }

    /// Marks `owner`'s `thread` used now (its turn was admitted).
    pub(super) fn touch_ring(&mut self, owner: &str, thread: &str) {
        if let Some(ledger) = self.ledger.as_mut() {
            ledger.touch(&RingStore::ring_key(owner, thread));
        }
    }

    /// Stops charging everything of `owner` (forgotten: its files are being deleted).
    pub(super) fn uncharge_owner(&mut self, owner: &str, threads: &[String]) {
        if let Some(ledger) = self.ledger.as_mut() {
            ledger.remove(&stream_file_name(owner));
            for t in threads {
                ledger.remove(&RingStore::ring_key(owner, t));
            }
        }
    }

    /// Deletes the least recently used rings until the files fit the budget and every account
    /// its share; threads with a turn running or a restore unverified are kept.
    fn enforce_disk_budget(&mut self) {
        let (Some(ledger), Some(rings)) = (self.ledger.as_mut(), self.rings.as_mut()) else { return };
        let busy: Vec<String> = self
            .threads
            .iter()
            .filter(|(k, t)| t.pending.is_some() || self.running.contains_key(*k))
            .map(|((o, t), _)| RingStore::ring_key(o, t))
            .collect();
        for key in ledger.over_budget(&|k| busy.iter().any(|b| b == k)) {
            rings.discard_key(&key);
            ledger.remove(&key);
            self.stats.rings_evicted_for_disk += 1;
        }
    }
}
