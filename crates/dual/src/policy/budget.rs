//! [`DualStream`]'s files under the disk budget: its streams and rings are charged
//! to their owners' accounts in a [`DualDiskLedger`] against `--disk-budget-mib` and the
//! tenant share; past either, the least recently used files are deleted from disk: whole rings
//! of threads with no turn running, and whole stream files of users with no turn running and no
//! write in flight (a stream counts as used whenever any thread of its user is). An evicted ring
//! still in RAM answers as before (untouched there) and is written whole at its next turn; one
//! that is not starts empty after a restart, like a thread whose ring was never saved. An
//! evicted stream file is only a cache: the stream's tokens are its anchors, the user's facts
//! (kept by their own log, ``crate::FactStore``, in the server) and a summary the
//! summarizer makes again from them, so a stream whose file is gone is prefilled again at its
//! user's next turn after a restart (and written again at the next turn in this process).
//!
//! Masked turns' files (`policy/masked.rs`) are charged too, each under its file name, to its
//! owner's account, as it lands; it counts as used whenever its thread is (its thread's ring is
//! marked used first, at admission and when saved, so within one thread the ring's restart files
//! go before a masked turn, and the masked files oldest first).
//! A masked file deleted for the budget takes its turn out of the ring, as a whole-turn eviction
//! does (the turns after it moved down, logged, `engram_masked_turns_evicted_for_disk_total`):
//! the thread answers from then on as if the turn had been evicted, never with other bytes. The
//! masked files of a thread with a turn running (or a restore unverified) are never deleted.
//!
//! Invariant: once the writers are flushed, the `dual/` directory (masked turns' files included)
//! holds at most the budget (and each account its share) as far as files of idle owners allow,
//! and answers equal an unbudgeted run's as long as no masked file had to go
//! (`crates/dual/tests/it/dual_files.rs`, `masked_budget.rs`).

use engram_policy::OwnerKey;

use super::DualStream;
use crate::{stream_file_name, DualDiskLedger, RingStore};

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
            ledger.charge_found(&key, OwnerKey::tenant_of(&owner), bytes, true, rank as u64);
        }
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("stream-") && name.ends_with(".safetensors") {
                if let Ok(info) = engram_kv::read_meta(&e.path()) {
                    ledger.charge_found(&name, OwnerKey::tenant_of(&info.meta.owner), e.metadata().map_or(0, |m| m.len()), true, 0);
                }
            }
        }
        // Masked turns' files of this process (the store deleted a previous one's at start).
        if let Some(m) = &self.masked {
            for (name, (owner, _, _)) in &m.files {
                let bytes = std::fs::metadata(m.store.dir().join(name)).map_or(0, |x| x.len());
                ledger.charge(name, OwnerKey::tenant_of(owner), bytes, true);
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
        ledger.charge(&RingStore::ring_key(owner, thread), OwnerKey::tenant_of(owner), bytes, true);
        self.touch_masked(owner, thread);
        self.enforce_disk_budget();
    }

    /// Charges `owner`'s stream file at `bytes` (just written or restored) and enforces the budget.
    pub(super) fn charge_stream(&mut self, owner: &str, bytes: u64) {
        let Some(ledger) = self.ledger.as_mut() else { return };
        ledger.charge(&stream_file_name(owner), OwnerKey::tenant_of(owner), bytes, true);
        self.enforce_disk_budget();
    }

    /// Marks `owner`'s `thread` used now (its turn was admitted): its ring, then its masked
    /// turns' files, then the user's stream file.
    pub(super) fn touch_ring(&mut self, owner: &str, thread: &str) {
        if let Some(ledger) = self.ledger.as_mut() {
            ledger.touch(&RingStore::ring_key(owner, thread));
        }
        self.touch_masked(owner, thread);
        if let Some(ledger) = self.ledger.as_mut() {
            ledger.touch(&stream_file_name(owner));
        }
    }

    /// Marks the masked turns' files of `owner`'s `thread` used now (after its ring, so the
    /// ring's restart files go first), oldest file first.
    fn touch_masked(&mut self, owner: &str, thread: &str) {
        let (Some(ledger), Some(m)) = (self.ledger.as_mut(), self.masked.as_ref()) else { return };
        let mut names: Vec<&String> = m.files.iter().filter(|(_, (o, t, _))| o == owner && t == thread).map(|(n, _)| n).collect();
        // Names carry their write's ticket: in the order written.
        names.sort_by_key(|n| n.trim_start_matches(crate::masked_store::FILE_PREFIX).split('-').next().and_then(|t| t.parse::<u64>().ok()));
        for name in names {
            ledger.touch(name);
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

    /// Deletes the least recently used rings, masked turns' files and stream files until the
    /// files fit the budget and every account its share; threads with a turn running or a
    /// restore unverified are kept (their rings and masked files), and so are the streams of
    /// their users and streams with a write in flight.
    pub(super) fn enforce_disk_budget(&mut self) {
        self.take_gone_masked();
        let (Some(ledger), Some(rings), Some(dir)) = (self.ledger.as_mut(), self.rings.as_mut(), self.dir.as_ref()) else { return };
        // Asked at every admission and retirement: nothing to look at while the files fit.
        if ledger.within_limits() {
            return;
        }
        let is_busy = |k: &(String, String), t: &super::Thread| t.pending.is_some() || self.running.contains_key(k);
        let busy_threads = self.threads.iter().filter(|(k, t)| is_busy(k, t));
        let mut busy: Vec<String> = busy_threads.flat_map(|((o, t), _)| [RingStore::ring_key(o, t), stream_file_name(o)]).collect();
        busy.extend(self.running.keys().map(|(o, _)| stream_file_name(o)));
        busy.extend(self.users.iter().filter(|(_, u)| u.writing.is_some()).map(|(o, _)| stream_file_name(o)));
        if let Some(m) = &self.masked {
            let of_busy = m.files.iter().filter(|(_, (o, t, _))| {
                let k = (o.clone(), t.clone());
                self.threads.get(&k).is_some_and(|th| is_busy(&k, th))
            });
            busy.extend(of_busy.map(|(name, _)| name.clone()));
        }
        for key in ledger.over_budget(&|k| busy.iter().any(|b| b == k)) {
            ledger.remove(&key);
            if key.starts_with(crate::masked_store::FILE_PREFIX) {
                let Some((owner, thread, id)) = self.masked.as_mut().and_then(|m| m.files.remove(&key)) else { continue };
                // Its turn goes as a whole-turn eviction: the handle dropped deletes the file.
                let Some(t) = self.threads.get_mut(&(owner.clone(), thread.clone())) else { continue };
                match t.ring.remove(id) {
                    Ok(true) => {
                        tracing::info!(
                            "thread {thread:?} of {owner:?}: a masked turn's file is deleted for the disk budget, the turn leaves the ring"
                        );
                        self.stats.masked_turns_evicted_for_disk += 1;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        // Out of the ring all the same; the turns after it could not all move.
                        tracing::warn!("thread {thread:?} of {owner:?}: a masked turn left the ring for the disk budget: {e}");
                        self.stats.masked_turns_evicted_for_disk += 1;
                    }
                }
                t.last_masked.retain(|x| *x != id);
                continue;
            }
            if !key.starts_with("stream-") {
                rings.discard_key(&key);
                self.stats.rings_evicted_for_disk += 1;
                continue;
            }
            // The user whose file it is (a previous process's user not yet seen: none).
            if let Some(u) = self.users.iter_mut().find(|(o, _)| stream_file_name(o) == key).map(|(_, u)| u) {
                u.saved = None;
            }
            match &self.streams {
                Some(w) => w.delete(dir.join(&key)),
                None => {
                    let _ = std::fs::remove_file(dir.join(&key));
                }
            }
            self.stats.streams_evicted_for_disk += 1;
        }
    }
}
