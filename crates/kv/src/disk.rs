//! `DiskStore`: a directory of cache entries under a hard byte budget.
//!
//! ```text
//!  <dir>/<id>.safetensors        one entry each (format: `persist.rs`)
//!  <dir>/index.json              stats headers do not carry: hits, last use, pin
//!  <dir>/.<name>.tmp-<pid>-<n>   an interrupted write; deleted by `open`
//!  <dir>/<id>.folder/            a folder entry: files another crate writes, counted and
//!                                evicted like the others (`disk/folder.rs`)
//! ```
//! Invariants:
//! * `used_bytes() <= budget` after every `put` and `gc` (the project's
//!   budget invariant, ARCHITECTURE.md (5)): `put` evicts first, and refuses an entry that cannot fit with a
//!   clear error.
//! * A replacement never loses the old version before the new one is in place:
//!   the new file is written beside it (temp file) and renamed over it. Other
//!   entries are evicted so that both fit the budget where they can; where only
//!   the old version is in the way, the store holds both for the length of the
//!   write (over the budget by at most the old version). A write that fails (a
//!   full disk) leaves the old version, whole and listed.
//! * Pinned entries are never evicted.
//! * With a [`GroupQuota`] (one per tenant, `disk_quota.rs`), a group's entries take at
//!   most its share after its puts: a put evicts its own group's entries first.
//! * An entry is its stored owner's alone: `get` by any other owner is a miss,
//!   `put` and `remove` by any other owner are refused ([`DiskError::OwnerMismatch`])
//!   and change nothing. Only the operator's [`DiskStore::remove_any`] (`engram cache rm`)
//!   deletes without naming the owner.
//! * Nothing on disk is trusted: files that fail validation are deleted with
//!   a warning and reported as misses; a missing or corrupt `index.json` is
//!   rebuilt from the entries' headers (hits and pins start over).
//! * `index.json` is written under the store's lock only when a pin changes (`pin`, a
//!   pinning put, a pinned entry dropped) and by `gc`; the stats of puts, restores and evictions are handed out by
//!   [`DiskStore::take_index`] to be written outside it ([`IndexWrite`], never older over
//!   newer), and on drop. Stats not yet written when the process dies are lost, never an entry.
//! * An entry of another format version (older or newer) is not damage: it is
//!   never deleted by this build (not by `open`, `get` nor `gc`), only skipped —
//!   a miss, not listed and not counted against the budget.
//!
//! Mechanism apart from policy (as in SGLang's radix cache): the store keeps
//! [`EntryStats`] and evicts the lowest [`EvictionPolicy::priority`] first.
//!
//! NOTE: one process writes a store at a time; others (`engram cache ls`)
//! may open it meanwhile. Temp files name their writer's pid, and `open`
//! deletes only those whose writer is gone (on Linux, no `/proc/<pid>`;
//! elsewhere all of them), so listing never breaks a live write.

mod eviction;
mod folder;

pub use eviction::{EvictionPolicy, RECENCY_HALF_LIFE_SECS};

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::disk_quota::GroupQuota;
use crate::persist::{self, ChecksumCheck, EntryInfo, EntryKind, EntryMeta, PersistError};
use crate::pool::KvPool;
use crate::seq::SeqKv;

/// File name extension of entries.
pub const ENTRY_EXT: &str = "safetensors";
/// The stats file.
pub const INDEX_FILE: &str = "index.json";
/// Longest id accepted.
pub const MAX_ID_LEN: usize = 200;

/// Errors of the disk store.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The id would not name a plain file in the store.
    #[error("invalid cache entry id {id:?}: {reason}")]
    InvalidId { id: String, reason: &'static str },
    /// No entry with this id.
    #[error("no cache entry with id {0:?}")]
    UnknownId(String),
    /// The entry is larger than the whole budget.
    #[error("cache entry {id:?} is {bytes} bytes, larger than the whole disk budget of {budget} bytes")]
    TooLarge { id: String, bytes: u64, budget: u64 },
    /// Pinned entries leave too little room.
    #[error("cache entry {id:?} ({bytes} bytes) does not fit: pinned entries hold {pinned} of the {budget}-byte disk budget")]
    PinnedFull { id: String, bytes: u64, pinned: u64, budget: u64 },
    /// The entry's group (tenant) cannot fit it in its share, even after evicting its own
    /// unpinned entries: refused, nothing changed.
    #[error("cache entry {id:?} ({bytes} bytes) does not fit its tenant's {quota}-byte disk share ({pinned} bytes pinned)")]
    OverQuota { id: String, bytes: u64, group: String, pinned: u64, quota: u64 },
    /// The entry belongs to another owner than the one named: refused, nothing changed.
    /// (The stored owner is not named: the message may reach the caller's logs.)
    #[error("cache entry {id:?} belongs to another owner")]
    OwnerMismatch { id: String },
    /// The file system failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing or restoring an entry failed.
    #[error(transparent)]
    Persist(#[from] PersistError),
}

/// Result alias of the disk store.
pub type Result<T> = std::result::Result<T, DiskError>;

/// What the store knows about one entry.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryStats {
    pub id: String,
    pub kind: EntryKind,
    pub owner: String,
    /// File size.
    pub bytes: u64,
    pub hits: u64,
    pub created_unix: u64,
    pub last_used_unix: u64,
    pub pinned: bool,
    pub num_tokens: usize,
}

/// What `gc` did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GcReport {
    /// Entries whose files failed validation (deleted).
    pub dropped: Vec<String>,
    /// Entries evicted to meet the budget.
    pub evicted: Vec<String>,
    /// Bytes freed by both.
    pub freed_bytes: u64,
    pub used_bytes: u64,
    pub budget_bytes: u64,
}

/// A put between [`DiskStore::stage_put`] and [`DiskStore::commit_put`]: room made, owner
/// checked, the file not yet (or just) written. Invariant: until committed the store does
/// not list it, and the old version of the entry stays readable (the new file replaces it
/// by rename).
#[derive(Debug)]
pub struct StagedPut {
    id: String,
    path: PathBuf,
    meta: EntryMeta,
    bytes: u64,
    num_tokens: usize,
    pin: Option<bool>,
}

impl StagedPut {
    /// Writes the entry file (temp + fsync + rename); needs no access to the store.
    pub fn write(&self, kv: &SeqKv) -> Result<()> {
        persist::write_entry(&self.path, &self.meta, kv)?;
        Ok(())
    }
}

/// A directory of cache entries under a byte budget.
pub struct DiskStore {
    dir: PathBuf,
    budget_bytes: u64,
    policy: EvictionPolicy,
    entries: BTreeMap<String, EntryStats>,
    /// Fixed clock for tests and simulations; `None` is the system clock.
    now: Option<u64>,
    /// A cap per group of owners (a tenant), see `disk_quota.rs`.
    quota: Option<GroupQuota>,
    /// The ids of folder entries (`disk/folder.rs`), a subset of `entries`' keys.
    folders: BTreeSet<String>,
    /// The stats changed since `index.json` was last written or handed out to be written.
    index_dirty: bool,
    /// Bumped on every change of the stats; orders the writes of `index.json`.
    index_generation: u64,
    /// The generation last written to `index.json`, shared with every [`IndexWrite`] so that
    /// an older snapshot written late never replaces a newer one.
    index_written: Arc<Mutex<u64>>,
}

/// A snapshot of the store's `index.json` to be written outside the lock that guards the
/// store ([`DiskStore::take_index`]). Invariant: writes of snapshots of one store are
/// serialized, and a snapshot older than the one on disk is skipped, so the file only moves
/// forward whatever order the writers run in.
#[derive(Debug)]
#[must_use = "an IndexWrite does nothing until written"]
pub struct IndexWrite {
    path: PathBuf,
    bytes: Vec<u8>,
    generation: u64,
    written: Arc<Mutex<u64>>,
}

impl IndexWrite {
    /// Writes the snapshot (temp + fsync + rename) unless a newer one is already on disk.
    pub fn write(self) -> Result<()> {
        let mut last = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if *last >= self.generation {
            return Ok(());
        }
        let path = self.path;
        persist::atomic_write(&path, |w| w.write_all(&self.bytes)).map_err(|e| DiskError::Io { path, source: e })?;
        *last = self.generation;
        Ok(())
    }
}

/// Checks that `id` names a plain file inside the store: 1..=200 characters,
/// no `/`, `\`, `..`, NUL or leading `.` (temp files and hidden files).
pub fn validate_id(id: &str) -> Result<()> {
    let reason = if id.is_empty() {
        "empty"
    } else if id.chars().count() > MAX_ID_LEN {
        "longer than 200 characters"
    } else if id.contains(['/', '\\']) {
        "contains a path separator"
    } else if id.contains("..") {
        "contains \"..\""
    } else if id.contains('\0') {
        "contains NUL"
    } else if id.starts_with('.') {
        "starts with '.'"
    } else {
        return Ok(());
    };
    Err(DiskError::InvalidId { id: id.to_string(), reason })
}

/// True when the temp file's writer (the pid in its name) may still be
/// writing it: a live process other than a dead one we can see in `/proc`.
fn temp_writer_alive(name: &str) -> bool {
    let pid = name.rsplit_once(persist::TEMP_MARK).and_then(|(_, rest)| rest.split('-').next()).and_then(|p| p.parse::<u32>().ok());
    match pid {
        Some(pid) if Path::new("/proc/self").exists() => Path::new(&format!("/proc/{pid}")).exists(),
        _ => false,
    }
}

impl DiskStore {
    /// Opens (creating if needed) the store in `dir`: reads every entry's
    /// header, deletes bad files and temp files with a warning, and loads
    /// stats from `index.json` (rebuilt when missing or corrupt). Does not
    /// evict: `gc` or the next `put` enforce a smaller budget.
    pub fn open(dir: impl Into<PathBuf>, budget_bytes: u64, policy: EvictionPolicy) -> Result<DiskStore> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| DiskError::Io { path: dir.clone(), source: e })?;
        let mut store = DiskStore {
            dir,
            budget_bytes,
            policy,
            entries: BTreeMap::new(),
            now: None,
            quota: None,
            folders: BTreeSet::new(),
            index_dirty: false,
            index_generation: 0,
            index_written: Arc::new(Mutex::new(0)),
        };
        store.scan(false)?;
        Ok(store)
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Caps each group of owners (a tenant) at the quota's bytes from the next put on
    /// (`disk_quota.rs`); `None` lifts the cap. Entries already over it stay until their
    /// group's next put.
    pub fn set_group_quota(&mut self, quota: Option<GroupQuota>) {
        self.quota = quota;
    }

    /// Bytes the entries of `group` hold (0 without a quota).
    pub fn group_bytes(&self, group: &str) -> u64 {
        let Some(q) = &self.quota else { return 0 };
        self.entries.values().filter(|s| q.group(&s.owner) == group).map(|s| s.bytes).sum()
    }

    /// The byte budget.
    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }
    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }
    /// Bytes of all entries' files.
    pub fn used_bytes(&self) -> u64 {
        self.entries.values().map(|s| s.bytes).sum()
    }
    /// All entries, by id.
    pub fn list(&self) -> Vec<EntryStats> {
        self.entries.values().cloned().collect()
    }
    /// One entry's stats.
    pub fn stats(&self, id: &str) -> Option<&EntryStats> {
        self.entries.get(id)
    }
    /// Fixes the clock (unix seconds) for tests and simulations; `None`
    /// returns to the system clock.
    pub fn set_now(&mut self, now: Option<u64>) {
        self.now = now;
    }
    /// The file of entry `id` (which may not exist).
    pub fn entry_path(&self, id: &str) -> Result<PathBuf> {
        validate_id(id)?;
        Ok(self.dir.join(format!("{id}.{ENTRY_EXT}")))
    }

    /// The header of entry `id` (for `cache inspect`).
    pub fn inspect(&self, id: &str) -> Result<EntryInfo> {
        let path = self.entry_path(id)?;
        if !self.entries.contains_key(id) {
            return Err(DiskError::UnknownId(id.to_string()));
        }
        Ok(persist::read_meta(&path)?)
    }

    /// Stores `kv` as entry `id` of `meta.owner`, replacing that owner's entry of
    /// that id (keeping its hits and pin). Evicts by policy first so the budget
    /// holds. The old version stays until the new file is renamed over it, so a
    /// failed write (a full disk) keeps it. An entry `id` of another owner is not
    /// replaced: [`DiskError::OwnerMismatch`], nothing changed.
    pub fn put(&mut self, id: &str, meta: &EntryMeta, kv: &SeqKv) -> Result<()> {
        self.store(id, meta, kv, None)
    }

    /// [`DiskStore::put`], and pins the entry (a named agent's session): it
    /// is never evicted, and fails with [`DiskError::PinnedFull`] — changing
    /// nothing — when pinned entries would exceed the budget.
    pub fn put_pinned(&mut self, id: &str, meta: &EntryMeta, kv: &SeqKv) -> Result<()> {
        self.store(id, meta, kv, Some(true))
    }

    /// `put` with the entry's pin set to `pin`, or kept when `None`.
    fn store(&mut self, id: &str, meta: &EntryMeta, kv: &SeqKv, pin: Option<bool>) -> Result<()> {
        let staged = self.stage_put(id, meta, kv, pin)?;
        staged.write(kv)?;
        self.commit_put(staged)
    }

    /// The first step of a put whose file is written outside the lock that guards the store
    /// (a long session's file is hundreds of MB and an fsync): checks the owner and makes
    /// room for the entry now. Then [`StagedPut::write`] (no store needed), then
    /// [`DiskStore::commit_put`]. `pin`: pin the entry, or keep its pin when `None`.
    pub fn stage_put(&mut self, id: &str, meta: &EntryMeta, kv: &SeqKv, pin: Option<bool>) -> Result<StagedPut> {
        let path = self.entry_path(id)?;
        self.check_owner(id, &meta.owner)?;
        let bytes = persist::encoded_len(meta, kv)?;
        self.make_room(id, &meta.owner, bytes)?;
        Ok(StagedPut { id: id.to_string(), path, meta: meta.clone(), bytes, num_tokens: kv.len(), pin })
    }

    /// Records a written [`StagedPut`]: the entry's stats (keeping its hits, and its pin
    /// unless set) and the index. Room is made again should other puts have taken it
    /// meanwhile; if the owner changed meanwhile or room cannot be made, the new file is
    /// deleted and the error returned.
    pub fn commit_put(&mut self, staged: StagedPut) -> Result<()> {
        let StagedPut { id, path, meta, bytes, num_tokens, pin } = staged;
        let checked = self.check_owner(&id, &meta.owner).and_then(|()| self.make_room(&id, &meta.owner, bytes));
        if let Err(e) = checked {
            let _ = std::fs::remove_file(&path);
            self.entries.remove(&id);
            return Err(e);
        }
        let now = self.now();
        let old = self.entries.remove(&id);
        let pin_changed = pin.is_some_and(|p| p != old.as_ref().is_some_and(|o| o.pinned));
        self.entries.insert(
            id.clone(),
            EntryStats {
                id,
                kind: meta.kind,
                owner: meta.owner.clone(),
                bytes,
                hits: old.as_ref().map_or(0, |o| o.hits),
                created_unix: meta.created_unix,
                last_used_unix: now,
                pinned: pin.unwrap_or(old.is_some_and(|o| o.pinned)),
                num_tokens,
            },
        );
        // A pin lives only in the index: written now. Other stats wait for `take_index`.
        if pin_changed {
            self.save_index()
        } else {
            self.mark_index_dirty();
            Ok(())
        }
    }

    /// The index to write when its stats changed since the last snapshot (hits, last use,
    /// new and dropped entries): taken under the store's lock, written with
    /// [`IndexWrite::write`] outside it, so no caller of the store waits on its fsync.
    /// Stats are advisory: those not yet written when the process dies are lost (the
    /// entries are not), and the store rebuilds them from the files' headers. Pins are
    /// written at once by the calls that change them.
    pub fn take_index(&mut self) -> Option<IndexWrite> {
        if !self.index_dirty {
            return None;
        }
        self.index_dirty = false;
        Some(self.index_snapshot())
    }

    /// Restores entry `id` of `owner` into `pool` if it exists and was made by
    /// `fingerprint`; counts a hit. A bad file is deleted with a warning and
    /// reported as a miss; an entry of another owner, model or format is a miss
    /// and stays. Errors: an invalid id, I/O, or a RAM budget too small for it.
    pub fn get(
        &mut self,
        id: &str,
        owner: &str,
        pool: &KvPool,
        fingerprint: &str,
        vocab_size: usize,
    ) -> Result<Option<(EntryMeta, SeqKv)>> {
        let Some((meta, kv, check)) = self.get_unverified(id, owner, pool, fingerprint, vocab_size)? else {
            return Ok(None);
        };
        match check.wait() {
            Ok(()) => Ok(Some((meta, kv))),
            Err(e) => {
                drop(kv);
                self.drop_corrupt(id, owner, &e)?;
                Ok(None)
            }
        }
    }

    /// [`DiskStore::get`] that returns before the checksum of the KV bytes
    /// is known ([`persist::open_entry`]): the caller computes on the blocks
    /// meanwhile, must wait for the [`ChecksumCheck`] before using anything
    /// computed from them, and calls [`DiskStore::drop_corrupt`] when it fails.
    pub fn get_unverified(
        &mut self,
        id: &str,
        owner: &str,
        pool: &KvPool,
        fingerprint: &str,
        vocab_size: usize,
    ) -> Result<Option<(EntryMeta, SeqKv, ChecksumCheck)>> {
        let path = self.entry_path(id)?;
        if self.folders.contains(id) {
            // A folder entry's files are read by whoever wrote them, never as KV.
            return Ok(None);
        }
        match self.entries.get(id) {
            None => return Ok(None),
            Some(s) if s.owner != owner => {
                tracing::debug!("cache miss for {id:?}: stored for another owner");
                return Ok(None);
            }
            Some(_) => {}
        }
        match persist::open_entry(&path, pool, fingerprint, vocab_size) {
            Ok((meta, _, _)) if meta.owner != owner => {
                // The file changed owner behind the store's back (the header read at
                // open said otherwise): not this owner's data, and not ours to delete.
                tracing::warn!("cache miss for {id:?}: the file now names another owner");
                Ok(None)
            }
            Ok(found) => {
                let now = self.now();
                if let Some(s) = self.entries.get_mut(id) {
                    s.hits += 1;
                    s.last_used_unix = now;
                }
                // Stats are advisory: written by the next `take_index`, not on the restore's path.
                self.mark_index_dirty();
                Ok(Some(found))
            }
            Err(e) if e.is_corrupt() || matches!(e, PersistError::NotFound { .. }) => {
                self.drop_corrupt(id, owner, &e)?;
                Ok(None)
            }
            Err(e @ PersistError::Mismatch { .. }) => {
                tracing::debug!("cache miss for {id:?}: {e}");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes entry `id` of `owner`, which failed validation with `why`, with a
    /// warning. An entry of another owner is not deleted ([`DiskError::OwnerMismatch`]).
    pub fn drop_corrupt(&mut self, id: &str, owner: &str, why: &PersistError) -> Result<()> {
        self.check_owner(id, owner)?;
        tracing::warn!("dropping cache entry {id:?}: {why}");
        self.drop_entry(id)
    }

    /// Deletes `owner`'s entry `id`; false when there was none. An entry of another
    /// owner is not deleted: [`DiskError::OwnerMismatch`].
    pub fn remove(&mut self, id: &str, owner: &str) -> Result<bool> {
        validate_id(id)?;
        if !self.entries.contains_key(id) {
            return Ok(false);
        }
        self.check_owner(id, owner)?;
        self.drop_entry(id)?;
        Ok(true)
    }

    /// Deletes entry `id` whoever owns it; false when there was none. For the
    /// store's operator (`engram cache rm`), never on behalf of a tenant.
    pub fn remove_any(&mut self, id: &str) -> Result<bool> {
        validate_id(id)?;
        if !self.entries.contains_key(id) {
            return Ok(false);
        }
        self.drop_entry(id)?;
        Ok(true)
    }

    /// Pins (never evicted) or unpins entry `id`.
    pub fn pin(&mut self, id: &str, pinned: bool) -> Result<()> {
        validate_id(id)?;
        let s = self.entries.get_mut(id).ok_or_else(|| DiskError::UnknownId(id.to_string()))?;
        s.pinned = pinned;
        self.save_index()
    }

    /// Re-reads the directory, deletes entries whose files fail full
    /// validation (checksum included) and temp files, then evicts by policy
    /// until the budget holds.
    pub fn gc(&mut self) -> Result<GcReport> {
        let before = self.used_bytes();
        let dropped = self.scan(true)?;
        let mut report = GcReport { dropped, budget_bytes: self.budget_bytes, ..GcReport::default() };
        let order = self.policy.eviction_order(&self.list(), self.now());
        for id in order {
            if self.used_bytes() <= self.budget_bytes {
                break;
            }
            self.drop_entry(&id)?;
            report.evicted.push(id);
        }
        report.used_bytes = self.used_bytes();
        report.freed_bytes = before.saturating_sub(report.used_bytes);
        self.save_index()?;
        Ok(report)
    }

    // -----------------------------------------------------------------------
    // Internals.

    /// `Ok` when there is no entry `id` or `owner` owns it.
    fn check_owner(&self, id: &str, owner: &str) -> Result<()> {
        match self.entries.get(id) {
            Some(s) if s.owner != owner => Err(DiskError::OwnerMismatch { id: id.to_string() }),
            _ => Ok(()),
        }
    }

    fn now(&self) -> u64 {
        self.now.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
    }

    /// Evicts others so that `bytes` more fit, counting the current entry `id` (it
    /// stays on disk until the new file is renamed over it) where evicting others
    /// can make room for both, else only so that the new version fits once it
    /// has replaced the old. Never evicts `id` itself: the rename replaces it, so
    /// a failed write keeps it. Checks feasibility before evicting anything.
    /// With a group quota, the entry's group first evicts its own entries to fit its share.
    fn make_room(&mut self, id: &str, owner: &str, bytes: u64) -> Result<()> {
        let budget = self.budget_bytes;
        if bytes > budget {
            return Err(DiskError::TooLarge { id: id.to_string(), bytes, budget });
        }
        let pinned: u64 = self.entries.values().filter(|s| s.pinned && s.id != id).map(|s| s.bytes).sum();
        if pinned + bytes > budget {
            return Err(DiskError::PinnedFull { id: id.to_string(), bytes, pinned, budget });
        }
        if let Some(q) = self.quota.clone() {
            let all: Vec<EntryStats> = self.entries.values().cloned().collect();
            let victims = q.victims(&all, id, owner, bytes, self.policy, self.now()).map_err(|e| DiskError::OverQuota {
                id: id.to_string(),
                bytes,
                group: e.group,
                pinned: e.pinned,
                quota: q.bytes,
            })?;
            for victim in victims {
                tracing::info!("evicting cache entry {victim:?} (its tenant's disk share is full)");
                self.drop_entry(&victim)?;
            }
        }
        let others: Vec<EntryStats> = self.entries.values().filter(|s| s.id != id).cloned().collect();
        let old = self.entries.get(id).map_or(0, |s| s.bytes);
        // Room for the new version beside the old one while it is written, where evicting
        // others can make it; else only for the new one (the rename frees the old).
        let beside = if pinned + old + bytes <= budget { old } else { 0 };
        for victim in self.policy.eviction_order(&others, self.now()) {
            if self.used_bytes() - old + beside + bytes <= budget {
                break;
            }
            tracing::info!("evicting cache entry {victim:?} ({} policy)", self.policy);
            self.drop_entry(&victim)?;
        }
        Ok(())
    }

    /// Deletes the file and the stats of `id`.
    fn drop_entry(&mut self, id: &str) -> Result<()> {
        let path = self.entry_path(id)?;
        if self.folders.remove(id) {
            self.remove_folder(id)?;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(DiskError::Io { path, source: e }),
        }
        // The file is the truth: an index entry without its file is ignored at open. A pin is
        // the exception: left in the index, it would pin a later entry of the same id.
        if self.entries.remove(id).is_some_and(|s| s.pinned) {
            return self.save_index();
        }
        self.mark_index_dirty();
        Ok(())
    }

    /// Rebuilds `entries` from the directory (headers, plus the checksum when
    /// `verify`) and `index.json`. Deletes temp files and bad entries; returns
    /// the ids of the latter.
    fn scan(&mut self, verify: bool) -> Result<Vec<String>> {
        let io = |e| DiskError::Io { path: self.dir.clone(), source: e };
        let mut found = BTreeMap::new();
        let mut dropped = Vec::new();
        let mut folders = BTreeSet::new();
        for dirent in std::fs::read_dir(&self.dir).map_err(io)? {
            let dirent = dirent.map_err(io)?;
            let Ok(name) = dirent.file_name().into_string() else { continue };
            let path = dirent.path();
            if let Some(id) = name.strip_suffix(&format!(".{}", folder::FOLDER_EXT)) {
                if dirent.file_type().is_ok_and(|t| t.is_dir()) && validate_id(id).is_ok() {
                    match folder::read_folder(id, &path) {
                        Ok(stats) => {
                            folders.insert(id.to_string());
                            found.insert(id.to_string(), stats);
                        }
                        Err(why) => {
                            tracing::warn!("dropping cache entry {id:?}: {why}");
                            let _ = std::fs::remove_dir_all(&path);
                            dropped.push(id.to_string());
                        }
                    }
                }
                continue;
            }
            if persist::is_temp_name(&name) {
                if !temp_writer_alive(&name) {
                    tracing::warn!("removing interrupted write {}", path.display());
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let Some(id) = name.strip_suffix(&format!(".{ENTRY_EXT}")) else { continue };
            if validate_id(id).is_err() {
                continue;
            }
            let read = if verify { persist::verify_entry(&path) } else { persist::read_meta(&path) };
            match read {
                Ok(info) => {
                    let stats = EntryStats {
                        id: id.to_string(),
                        kind: info.meta.kind,
                        owner: info.meta.owner,
                        bytes: info.file_bytes,
                        hits: 0,
                        created_unix: info.meta.created_unix,
                        last_used_unix: info.meta.created_unix,
                        pinned: false,
                        num_tokens: info.num_tokens,
                    };
                    found.insert(id.to_string(), stats);
                }
                Err(PersistError::NotFound { .. }) => {}
                Err(e) if e.is_corrupt() => {
                    tracing::warn!("dropping cache entry {id:?}: {e}");
                    let _ = std::fs::remove_file(&path);
                    dropped.push(id.to_string());
                }
                Err(e) => tracing::warn!("skipping cache entry {id:?}: {e}"),
            }
        }
        self.load_index(&mut found);
        self.entries = found;
        self.folders = folders;
        Ok(dropped)
    }

    /// Applies `index.json` stats to `found`; ignores it when unreadable.
    fn load_index(&self, found: &mut BTreeMap<String, EntryStats>) {
        let path = self.dir.join(INDEX_FILE);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                tracing::warn!("{}: {e}; rebuilding cache stats from headers", path.display());
                return;
            }
        };
        let parsed: Option<Value> = serde_json::from_slice(&text).ok();
        let entries = parsed.as_ref().filter(|v| v["version"] == 1).and_then(|v| v["entries"].as_object());
        let Some(entries) = entries else {
            tracing::warn!("{}: not a cache index; rebuilding cache stats from headers", path.display());
            return;
        };
        for (id, s) in entries {
            if let Some(st) = found.get_mut(id) {
                st.hits = s["hits"].as_u64().unwrap_or(0);
                st.last_used_unix = s["last_used_unix"].as_u64().unwrap_or(st.created_unix);
                st.pinned = s["pinned"].as_bool().unwrap_or(false);
            }
        }
    }

    fn mark_index_dirty(&mut self) {
        self.index_dirty = true;
        self.index_generation += 1;
    }

    /// Writes `index.json` now (pins, `gc`, drop).
    fn save_index(&mut self) -> Result<()> {
        self.index_generation += 1;
        self.index_dirty = false;
        self.index_snapshot().write()
    }

    fn index_snapshot(&self) -> IndexWrite {
        let entries: serde_json::Map<String, Value> = self
            .entries
            .values()
            .map(|s| (s.id.clone(), json!({"hits": s.hits, "last_used_unix": s.last_used_unix, "pinned": s.pinned})))
            .collect();
        let bytes = serde_json::to_vec_pretty(&json!({"version": 1, "entries": entries})).expect("JSON values serialize");
        IndexWrite { path: self.dir.join(INDEX_FILE), bytes, generation: self.index_generation, written: self.index_written.clone() }
    }
}

impl Drop for DiskStore {
    /// Writes the stats not yet written (a clean shutdown keeps hits and last use).
    fn drop(&mut self) {
        if let Some(w) = self.take_index() {
            if let Err(e) = w.write() {
                tracing::warn!("cache index not saved: {e}");
            }
        }
    }
}
