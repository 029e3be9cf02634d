//! Sessions on disk: written after each turn by a background thread, found
//! again by a restarted process, restored by mapping the file.
//!
//! ```text
//!  engine thread: checkin ──(fork of the cache: shares blocks, no copy)──> writer thread ──> DiskStore::put
//!                 checkout <── restore (mmap + validate header) <── catalog of persisted sessions (owner, id, text)
//!                    └─ the checksum of the KV bytes runs on its own thread beside the prefill;
//!                       the engine waits for it before the first token (`PendingRestore`)
//! ```
//! An entry's `owner` metadata is `"<owner>/<session id>"` (session ids never
//! contain `/`); a shared prefix chain's is its salt, `"salt/<tenant>"`, or empty
//! for a chain shared across tenants. Its id is a blake3 hash of what it names
//! (`disk_id.rs`), and every read, write and delete names that owner metadata,
//! which the store checks against the entry's. Invariant: saves and removals of a
//! session are carried out in the order they were queued; what `flush` returns after
//! is on disk (or gone), written atomically (temp file, fsync, rename), unless it was shed
//! first; a file that
//! fails validation is dropped by the store and the session is recomputed, never
//! misused; an entry not at the id its owner metadata maps to (written under the
//! FNV ids before, or misplaced) is deleted at open and never read.
//!
//! A queued save holds its cache's blocks in the RAM pool until it is written. So that a
//! writer behind a busy engine cannot fill the budget with them: a newer save of an entry
//! replaces its older queued one at once, and [`PersistedSessions::shed_queued`] (the session
//! store's last resort when making room) drops every save not yet started. A shed session
//! is only a miss later (recomputed): restores read each file's own metadata, never the
//! catalog's text.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use engram_kv::disk::{DiskError, DiskStore, EvictionPolicy, IndexWrite};
use engram_kv::persist::{ChecksumCheck, EntryKind, EntryMeta, PersistError};
use engram_kv::GroupQuota;
use engram_kv::{KvPool, SeqKv};

use crate::disk_id::{prefix_disk_id, prefix_owner, session_disk_id};

/// The owner metadata of `owner`'s session `session_id`.
fn session_owner(owner: &str, session_id: &str) -> String {
    format!("{owner}/{session_id}")
}

/// A persisted shared prefix chain: whole blocks of `tokens`, findable only by lookups
/// under `salt` (see [`crate::prefix::chain_root`]); `disk_id` is
/// [`crate::disk_id::prefix_disk_id`] of them.
#[derive(Clone, Debug)]
pub struct PrefixCatalogEntry {
    pub disk_id: String,
    pub salt: Option<String>,
    pub tokens: Vec<u32>,
}

/// A persisted session the process knows about but has not loaded.
#[derive(Clone, Debug)]
pub struct CatalogEntry {
    pub owner: String,
    pub session_id: String,
    pub disk_id: String,
    pub text: String,
    /// Tokens of KV the entry holds.
    pub tokens: usize,
    /// Bytes a restore charges to the RAM pool: the entry's blocks as they are held (a
    /// released block's global layers only) and its recent window.
    pub ram_bytes: usize,
}

enum Msg {
    /// Entry id and the number of its save in [`Queued`]: written if still queued there.
    Save(String, u64),
    /// Entry id and its owner metadata.
    Remove(String, String),
    Flush(Sender<()>),
}

impl Msg {
    /// The entry a save or remove is about.
    fn entry(&self) -> Option<&str> {
        match self {
            Msg::Save(id, ..) | Msg::Remove(id, _) => Some(id),
            Msg::Flush(_) => None,
        }
    }
}

/// A save waiting for the writer: what to write, and whether to pin it.
struct QueuedSave {
    number: u64,
    meta: EntryMeta,
    kv: SeqKv,
    pinned: bool,
}

/// Saves not yet started, newest of each entry only, by entry id.
#[derive(Default)]
struct Queued {
    saves: HashMap<String, QueuedSave>,
    next: u64,
}

impl Queued {
    /// Takes the save `number` of entry `id` if it is still the one queued (not replaced
    /// by a newer save, not shed).
    fn take(&mut self, id: &str, number: u64) -> Option<QueuedSave> {
        match self.saves.get(id) {
            Some(q) if q.number == number => self.saves.remove(id),
            _ => None,
        }
    }
}

/// The disk tier of a [`crate::SessionStore`].
pub struct PersistedSessions {
    store: Arc<Mutex<DiskStore>>,
    fingerprint: String,
    queued: Arc<Mutex<Queued>>,
    /// Saves dropped unwritten by [`PersistedSessions::shed_queued`], since open.
    shed: AtomicU64,
    tx: Option<Sender<Msg>>,
    writer: Option<JoinHandle<()>>,
}

/// True when entry `id` with metadata `meta` sits at the id its owner (and, for a
/// prefix chain, its fingerprint and tokens) maps to (see `disk_id.rs`).
fn at_its_id(id: &str, meta: &EntryMeta) -> bool {
    match meta.kind {
        EntryKind::Session => meta.owner.rsplit_once('/').is_some_and(|(o, sid)| id == session_disk_id(o, sid)),
        EntryKind::Prefix => {
            let salt = if meta.owner.is_empty() { Some(None) } else { meta.owner.strip_prefix("salt/").map(Some) };
            salt.is_some_and(|salt| id == prefix_disk_id(&meta.fingerprint, salt, &meta.tokens))
        }
    }
}

impl PersistedSessions {
    /// Opens (or creates) the store at `dir` for caches whose fingerprint is
    /// `fingerprint` (see `engram_kv::persist::cache_fingerprint`). Deletes entries
    /// not at the id their owner maps to: files written under the FNV ids of
    /// earlier versions are a miss, cleaned up, and their sessions recomputed.
    pub fn open(dir: &Path, budget_bytes: u64, policy: EvictionPolicy, fingerprint: String) -> Result<PersistedSessions, DiskError> {
        let mut disk = DiskStore::open(dir, budget_bytes, policy)?;
        drop_misplaced(&mut disk);
        let store = Arc::new(Mutex::new(disk));
        let (tx, rx) = channel::<Msg>();
        let st = store.clone();
        let queued = Arc::new(Mutex::new(Queued::default()));
        let waiting = queued.clone();
        let writer = std::thread::Builder::new()
            .name("engram-persist".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    // Coalesce: only the newest save or remove of each session is
                    // carried out (a remove queued after a save wins, and the
                    // other way round), in the order they were queued.
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    let mut latest: HashMap<String, usize> = HashMap::new();
                    for (i, m) in batch.iter().enumerate() {
                        if let Some(id) = m.entry() {
                            latest.insert(id.to_string(), i);
                        }
                    }
                    for (i, m) in batch.into_iter().enumerate() {
                        let superseded = m.entry().is_some_and(|id| latest.get(id) != Some(&i));
                        // A save's cache leaves the queue either way (written, or superseded).
                        let save = match &m {
                            Msg::Save(id, number) => waiting.lock().unwrap_or_else(|e| e.into_inner()).take(id, *number),
                            _ => None,
                        };
                        if superseded {
                            continue;
                        }
                        match m {
                            Msg::Save(id, _) => {
                                // Replaced by a newer save, or shed to make room.
                                let Some(QueuedSave { meta, kv, pinned: pin, .. }) = save else { continue };
                                let _span = tracing::debug_span!("persist", entry = %id, tokens = kv.len()).entered();
                                // The lock is held to check and make room, and to record the
                                // entry, not while the file is written and synced: the engine
                                // reads the store's gauges every step.
                                let pin = pin.then_some(true);
                                let staged = st.lock().unwrap_or_else(|e| e.into_inner()).stage_put(&id, &meta, &kv, pin);
                                let saved = staged.and_then(|staged| {
                                    staged.write(&kv)?;
                                    let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                                    s.commit_put(staged)?;
                                    Ok(s.take_index())
                                });
                                // The index (stats only) is written and synced after the lock is let go.
                                match saved.and_then(|index| index.map_or(Ok(()), IndexWrite::write)) {
                                    Ok(()) => {}
                                    Err(e) => tracing::warn!("session {id} not persisted: {e}"),
                                }
                            }
                            Msg::Remove(id, owner) => {
                                let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                                let removed = s.remove(&id, &owner).map(|_| s.take_index());
                                drop(s);
                                if let Err(e) = removed.and_then(|index| index.map_or(Ok(()), IndexWrite::write)) {
                                    tracing::warn!("session {id} not deleted: {e}");
                                }
                            }
                            Msg::Flush(done) => {
                                // Stats of restores since the last save reach the disk too.
                                let index = st.lock().unwrap_or_else(|e| e.into_inner()).take_index();
                                if let Some(Err(e)) = index.map(IndexWrite::write) {
                                    tracing::warn!("cache index not saved: {e}");
                                }
                                let _ = done.send(());
                            }
                        }
                    }
                }
            })
            .map_err(|e| DiskError::Io { path: dir.to_path_buf(), source: e })?;
        Ok(PersistedSessions { store, fingerprint, queued, shed: AtomicU64::new(0), tx: Some(tx), writer: Some(writer) })
    }

    /// Caps each account's entries (`crate::entry_account`) at `bytes` of the disk budget
    /// from its next save on (`None`: no cap): an account past its share evicts its own
    /// entries first, and a save that would pass it with pinned entries alone is refused.
    pub fn set_tenant_share(&self, bytes: Option<u64>) {
        let quota = bytes.map(|b| GroupQuota::new(b, |owner: &str| crate::entry_account(owner).to_string()));
        self.store.lock().unwrap_or_else(|e| e.into_inner()).set_group_quota(quota);
    }

    /// The store itself, shared: other policies keep their files in it as folder entries
    /// (`engram_kv::DiskStore::begin_folder`), under the same budget and tenant shares.
    pub fn shared_store(&self) -> Arc<Mutex<DiskStore>> {
        self.store.clone()
    }

    /// Sessions on disk made by this model and KV format.
    pub fn catalog(&self) -> Vec<CatalogEntry> {
        let s = self.store.lock().unwrap_or_else(|e| e.into_inner());
        s.list()
            .into_iter()
            .filter(|e| e.kind == EntryKind::Session)
            .filter_map(|e| {
                let info = s.inspect(&e.id).ok()?;
                if info.meta.fingerprint != self.fingerprint {
                    return None;
                }
                let (owner, sid) = info.meta.owner.rsplit_once('/')?;
                Some(CatalogEntry {
                    owner: owner.to_string(),
                    session_id: sid.to_string(),
                    disk_id: e.id.clone(),
                    text: info.meta.text,
                    tokens: e.num_tokens,
                    ram_bytes: info.kv_bytes + info.window_bytes,
                })
            })
            .collect()
    }

    /// Queues a session for writing (off the caller's thread). `kv` should be
    /// a fork: it shares the session's blocks until the writer is done.
    /// `pinned`: the entry is pinned (see [`DiskStore::put_pinned`]); else
    /// it keeps the pin it had.
    #[allow(clippy::too_many_arguments)]
    pub fn save(&self, owner: &str, session_id: &str, text: &str, tokens: &[u32], token_ends: &[usize], kv: SeqKv, pinned: bool) {
        let mut prev = 0;
        let offsets = token_ends
            .iter()
            .map(|&e| {
                let o = (prev.min(e), e);
                prev = e;
                o
            })
            .collect();
        let meta = EntryMeta {
            fingerprint: self.fingerprint.clone(),
            kind: EntryKind::Session,
            owner: session_owner(owner, session_id),
            tokens: tokens.to_vec(),
            text: text.to_string(),
            offsets,
            created_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        };
        self.enqueue(session_disk_id(owner, session_id), meta, kv, pinned);
    }

    /// Queues entry `id`'s save, replacing (and letting go of) any older one still queued.
    fn enqueue(&self, id: String, meta: EntryMeta, kv: SeqKv, pinned: bool) {
        let Some(tx) = &self.tx else { return };
        let number = {
            let mut q = self.queued.lock().unwrap_or_else(|e| e.into_inner());
            let number = q.next;
            q.next += 1;
            // The older save's cache is dropped after the lock is let go.
            let older = q.saves.insert(id.clone(), QueuedSave { number, meta, kv, pinned });
            drop(q);
            drop(older);
            number
        };
        let _ = tx.send(Msg::Save(id, number));
    }

    /// Drops every save not yet started, letting go of the blocks their caches hold in the
    /// RAM pool; returns how many. Their entries keep what was last written (or stay
    /// absent): a later restore finds the older state, or nothing, and recomputes the rest.
    pub fn shed_queued(&self) -> usize {
        let saves = std::mem::take(&mut self.queued.lock().unwrap_or_else(|e| e.into_inner()).saves);
        let n = saves.len();
        self.shed.fetch_add(n as u64, Relaxed);
        if n > 0 {
            tracing::debug!("{n} queued saves dropped unwritten to free RAM for the engine");
        }
        n
    }

    /// Saves dropped unwritten by [`PersistedSessions::shed_queued`] since open.
    pub fn saves_shed(&self) -> u64 {
        self.shed.load(Relaxed)
    }

    /// Shared prefix chains on disk made by this model and KV format.
    pub fn prefix_catalog(&self) -> Vec<PrefixCatalogEntry> {
        let s = self.store.lock().unwrap_or_else(|e| e.into_inner());
        s.list()
            .into_iter()
            .filter(|e| e.kind == EntryKind::Prefix)
            .filter_map(|e| {
                let info = s.inspect(&e.id).ok()?;
                if info.meta.fingerprint != self.fingerprint {
                    return None;
                }
                let salt = match info.meta.owner.as_str() {
                    "" => None,
                    o => Some(o.strip_prefix("salt/")?.to_string()),
                };
                Some(PrefixCatalogEntry { disk_id: e.id.clone(), salt, tokens: info.meta.tokens })
            })
            .collect()
    }

    /// The id a shared prefix chain `tokens` indexed under `salt` is saved as.
    pub fn prefix_id(&self, salt: Option<&str>, tokens: &[u32]) -> String {
        prefix_disk_id(&self.fingerprint, salt, tokens)
    }

    /// Queues a shared prefix chain (whole blocks) indexed under `salt` for writing
    /// (as [`PersistedSessions::prefix_id`]).
    pub fn save_prefix(&self, salt: Option<&str>, tokens: &[u32], kv: SeqKv) {
        let id = self.prefix_id(salt, tokens);
        let meta = EntryMeta {
            fingerprint: self.fingerprint.clone(),
            kind: EntryKind::Prefix,
            owner: prefix_owner(salt),
            tokens: tokens.to_vec(),
            text: String::new(),
            offsets: Vec::new(),
            created_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        };
        self.enqueue(id, meta, kv, false);
    }

    /// Maps the persisted prefix chain `disk_id` indexed under `salt` into `pool`;
    /// `None` if it is gone, invalid or not stored under that salt.
    pub fn load_prefix(&self, disk_id: &str, salt: Option<&str>, pool: &KvPool, vocab: usize) -> Option<(EntryMeta, SeqKv)> {
        let mut s = self.store.lock().unwrap_or_else(|e| e.into_inner());
        match s.get(disk_id, &prefix_owner(salt), pool, &self.fingerprint, vocab) {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!("restoring {disk_id}: {e}");
                None
            }
        }
    }

    /// Maps `owner`'s persisted session `session_id` into `pool` without waiting for the
    /// checksum of the KV bytes (see [`DiskStore::get_unverified`]): nothing computed from
    /// the sequence may be used before the check passes; on failure call
    /// [`PersistedSessions::drop_corrupt`]. `Ok(None)`: no such entry of that owner; an
    /// error says why it could not be used now (a RAM-budget refusal leaves the file sound).
    pub fn load_unverified(
        &self,
        owner: &str,
        session_id: &str,
        pool: &KvPool,
        vocab: usize,
    ) -> Result<Option<(EntryMeta, SeqKv, ChecksumCheck)>, DiskError> {
        let id = session_disk_id(owner, session_id);
        let mut s = self.store.lock().unwrap_or_else(|e| e.into_inner());
        s.get_unverified(&id, &session_owner(owner, session_id), pool, &self.fingerprint, vocab)
            .inspect_err(|e| tracing::warn!("restoring {id}: {e}"))
    }

    /// Queues the deletion of a session's file, after any save of it queued
    /// before (so a save in flight cannot bring it back).
    pub fn remove(&self, owner: &str, session_id: &str) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Remove(session_disk_id(owner, session_id), session_owner(owner, session_id)));
        }
    }

    /// Deletes `owner`'s session `session_id` file, whose checksum failed with `why`.
    pub fn drop_corrupt(&self, owner: &str, session_id: &str, why: &PersistError) {
        let disk_id = session_disk_id(owner, session_id);
        let mut s = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = s.drop_corrupt(&disk_id, &session_owner(owner, session_id), why) {
            tracing::warn!("deleting {disk_id}: {e}");
        }
    }

    /// Bytes of entries in the store.
    pub fn used_bytes(&self) -> u64 {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).used_bytes()
    }

    /// Blocks until every queued save is on disk (or was shed).
    pub fn flush(&self) {
        if let Some(tx) = &self.tx {
            let (done, wait) = channel();
            if tx.send(Msg::Flush(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }
}

/// Deletes entries not at the id their stored owner maps to (see [`at_its_id`]).
fn drop_misplaced(disk: &mut DiskStore) {
    for e in disk.list() {
        let Ok(info) = disk.inspect(&e.id) else { continue };
        if at_its_id(&e.id, &info.meta) {
            continue;
        }
        tracing::info!("removing cache entry {:?}: not at the id its owner maps to (written by an earlier version)", e.id);
        if let Err(err) = disk.remove_any(&e.id) {
            tracing::warn!("removing cache entry {:?}: {err}", e.id);
        }
    }
}

impl Drop for PersistedSessions {
    fn drop(&mut self) {
        self.flush();
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_kv::{KvFormat, KvLayout};

    fn save(number: u64) -> QueuedSave {
        let layout = KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4 };
        let kv = SeqKv::new(&KvPool::new(layout, KvFormat::F32, 1 << 20));
        let meta = EntryMeta {
            fingerprint: String::new(),
            kind: EntryKind::Session,
            owner: "o/s".into(),
            tokens: Vec::new(),
            text: String::new(),
            offsets: Vec::new(),
            created_unix: 0,
        };
        QueuedSave { number, meta, kv, pinned: false }
    }

    #[test]
    fn only_the_newest_queued_save_of_an_entry_is_taken() {
        let mut q = Queued::default();
        q.saves.insert("a".into(), save(0));
        q.saves.insert("a".into(), save(1));
        assert!(q.take("a", 0).is_none(), "replaced by save 1");
        assert_eq!(q.take("a", 1).map(|s| s.number), Some(1));
        assert!(q.take("a", 1).is_none(), "taken once");
        assert!(q.take("b", 0).is_none(), "never queued");
    }
}
