//! Kept sparse sessions saved to the server's disk store, so that a restarted process resumes
//! the next turn of a long conversation without re-prefilling its history.
//!
//! ```text
//!  <kv dir>/long-<64 hex>.folder/   a folder entry of the disk store (`engram_kv::DiskStore`):
//!                                   counted against the disk budget and its tenant's share,
//!                                   evicted by the same policy as sessions; owner metadata
//!                                   "<owner>/<session id>", as a session entry's
//!      state, kv-<id>               the DynaKV state and offload file (`crate::persist`)
//!      turn                         envelope `engram-long-turn` v1: fingerprint, owner,
//!                                   session id, text, token ends, tokens, the unfed token
//! ```
//!
//! A save is queued at a turn's end and written by the layer's writer thread (`writer.rs`):
//! the engine thread takes a snapshot of the state (the RAM tail copied, the index and row
//! tables shared copy on write; charged to the KV pool as a copy until written) and goes on. A turn that would resume a session of its owner from disk while an operation on
//! the owner's saved sessions is still queued or running waits for it first, so it resumes
//! what was last saved.
//!
//! Invariant: a session is resumed only from a state whose envelope, fingerprint (model, KV
//! format and sparse configuration), owner, shape and KV rows' BLAKE3 check out and whose
//! tokens equal its turn file's, and only once no write of its owner's entries is pending;
//! anything else is an error naming the file (damaged files are deleted), and the caller
//! recomputes the turn. The id is a function of the owner and session id alone, so a
//! conversation's later save replaces its earlier one.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engram_kv::{DiskStore, KvPool};
use engram_model::ModelConfig;
use engram_policy::{AdmitRequest, OwnerKey};

use super::history::History;
use super::writer::{SaveCounters, SaveMonitor, Work, Writer};
use crate::offload::OffloadConfig;
use crate::persist::codec::{Dec, Enc, Short};
use crate::persist::{StateError, StateMeta};
use crate::{SparseConfig, SparseKv};

/// The turn file's name in an entry's folder.
const TURN_FILE: &str = "turn";
const TURN_MAGIC: &str = "engram-long-turn";
const TURN_VERSION: u32 = 1;
/// Domain-separation context of the entries' ids.
const ID_CONTEXT: &str = "engram 2026-11 disk id: long-context session (owner, session id)";

/// The store id of `owner`'s long session `session_id`: `long-` and 64 hex digits.
pub(crate) fn long_disk_id(owner: &str, session_id: &str) -> String {
    let mut h = blake3::Hasher::new_derive_key(ID_CONTEXT);
    for f in [owner, session_id] {
        h.update(&(f.len() as u64).to_le_bytes());
        h.update(f.as_bytes());
    }
    format!("long-{}", h.finalize().to_hex())
}

/// The entry's owner metadata (a session entry's form, so tenant shares count it alike).
fn entry_owner(owner: &str, session_id: &str) -> String {
    format!("{owner}/{session_id}")
}

/// A session saved on disk.
#[derive(Clone)]
pub(crate) struct Saved {
    pub owner: String,
    pub session_id: String,
    pub history: History,
}

/// Reads and checks a turn file: the saved session, or why it is not one of `fingerprint`.
fn read_turn(path: &Path, fingerprint: &str) -> Result<Saved, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let body = engram_kv::envelope::open(&bytes, TURN_MAGIC, TURN_VERSION).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = |s: Short| format!("{}: malformed: {}", path.display(), s.0);
    let mut d = Dec::new(body);
    let fp = d.str("fingerprint").map_err(bad)?;
    if fp != fingerprint {
        return Err(format!("{}: made by another model, KV format or sparse configuration", path.display()));
    }
    let owner = d.str("owner").map_err(bad)?;
    let session_id = d.str("session id").map_err(bad)?;
    let text = d.str("text").map_err(bad)?;
    let token_ends = d.lens("token ends").map_err(bad)?;
    let tokens = d.u32s("tokens").map_err(bad)?;
    let unfed = if d.bool("unfed").map_err(bad)? { Some(d.u32("unfed token").map_err(bad)?) } else { None };
    d.finish().map_err(bad)?;
    if token_ends.len() != tokens.len() {
        return Err(format!("{}: {} text ends for {} tokens", path.display(), token_ends.len(), tokens.len()));
    }
    Ok(Saved { owner, session_id, history: History { text, token_ends, tokens, unfed } })
}

/// Writes `saved`'s turn file into `dir` (atomically, sealed) for `fingerprint`.
pub(crate) fn write_turn(dir: &Path, fingerprint: &str, saved: &Saved) -> Result<(), String> {
    let h = &saved.history;
    let mut body = Vec::new();
    let mut e = Enc(&mut body);
    e.str(fingerprint);
    e.str(&saved.owner);
    e.str(&saved.session_id);
    e.str(&h.text);
    e.lens(&h.token_ends);
    e.u32s(&h.tokens);
    e.bool(h.unfed.is_some());
    if let Some(t) = h.unfed {
        e.u32(t);
    }
    engram_kv::envelope::write_sealed(&dir.join(TURN_FILE), TURN_MAGIC, TURN_VERSION, &body).map_err(|e| format!("{}: {e}", dir.display()))
}

/// Long sessions on disk (module doc).
pub(crate) struct LongDisk {
    store: Arc<Mutex<DiskStore>>,
    /// Model, KV format and sparse configuration: what a saved state must have been made by.
    fingerprint: String,
    /// The writer thread; it also holds the catalog of saved sessions, by disk id.
    writer: Writer,
}

/// The saved session a prompt extends: its disk id, session id, the prompt's tokens and text
/// ends, and the tokens it holds.
pub(crate) type Extended = (String, String, (Vec<u32>, Vec<usize>), usize);

impl LongDisk {
    /// The long sessions `store` holds that `fingerprint` made (others stay, a miss), and the
    /// writer that saves them; an error when the writer thread cannot start.
    pub fn open(store: Arc<Mutex<DiskStore>>, fingerprint: String) -> std::io::Result<LongDisk> {
        let entries: Vec<(String, String, std::path::PathBuf)> = {
            let s = store.lock().unwrap_or_else(|e| e.into_inner());
            s.list()
                .into_iter()
                .filter(|e| e.id.starts_with("long-") && s.is_folder(&e.id))
                .filter_map(|e| Some((s.folder_path(&e.id).ok()?, e)))
                .map(|(dir, e)| (e.id, e.owner, dir))
                .collect()
        };
        let mut catalog = HashMap::new();
        let mut bad = Vec::new();
        for (id, owner, dir) in entries {
            match read_turn(&dir.join(TURN_FILE), &fingerprint) {
                Ok(saved)
                    if entry_owner(&saved.owner, &saved.session_id) == owner && long_disk_id(&saved.owner, &saved.session_id) == id =>
                {
                    catalog.insert(id, saved);
                }
                Ok(_) => bad.push((id, owner, "its turn file names another owner or id".to_string())),
                Err(e) if e.contains("another model") => tracing::debug!("long session {id} not resumable here: {e}"),
                Err(e) => bad.push((id, owner, e)),
            }
        }
        let writer = Writer::start(store.clone(), fingerprint.clone(), catalog)?;
        let disk = LongDisk { store, fingerprint, writer };
        for (id, owner, why) in bad {
            disk.drop_entry(&id, &owner, &why);
        }
        Ok(disk)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DiskStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Saved sessions known (committed saves).
    pub fn len(&self) -> usize {
        self.writer.with_catalog(|c| c.len())
    }

    /// Bytes of the saved sessions' folders in the store.
    pub fn bytes(&self) -> u64 {
        let ids: Vec<String> = self.writer.with_catalog(|c| c.keys().cloned().collect());
        let s = self.lock();
        ids.iter().filter_map(|id| s.stats(id)).map(|e| e.bytes).sum()
    }

    /// The writer's counters.
    pub fn counters(&self) -> SaveCounters {
        self.writer.counters()
    }

    /// Saves and removals queued or running.
    pub fn pending(&self) -> usize {
        self.writer.pending()
    }

    /// The writer's monitor.
    pub fn monitor(&self) -> SaveMonitor {
        self.writer.monitor()
    }

    /// Waits up to `timeout` for the writer to finish what is queued; whether some is left.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.writer.wait_idle(timeout)
    }

    /// Deletes entry `id` of owner metadata `owner` now (on the caller's thread, with no
    /// operation on it pending) with a warning saying why.
    fn drop_entry(&self, id: &str, owner: &str, why: &str) {
        tracing::warn!("dropping saved long conversation {id}: {why}");
        self.writer.with_catalog(|c| c.remove(id));
        let mut s = self.lock();
        if let Err(e) = s.remove(id, owner) {
            tracing::warn!("deleting {id}: {e}");
        }
    }

    /// Queues a save of `owner`'s session `session_id` (its `history` and sparse cache `kv`),
    /// replacing its earlier save once written. The state's snapshot is taken now and charged
    /// to `pool` until written (where the pool has no room, once the pending saves are
    /// written); an error (counted as a failed save) when the cache cannot be saved or its
    /// copy does not fit. The write's own failures (disk budget, tenant share, I/O) are
    /// counted by the writer and leave nothing half-written.
    pub fn save(&self, owner: &OwnerKey, session_id: &str, history: &History, kv: &SparseKv, pool: &KvPool) -> Result<(), String> {
        let queued = (|| {
            let meta_owner = entry_owner(owner.as_str(), session_id);
            let id = long_disk_id(owner.as_str(), session_id);
            let dir = self.lock().folder_path(&id).map_err(|e| e.to_string())?;
            let meta = StateMeta { fingerprint: self.fingerprint.clone(), owner: meta_owner.clone(), tokens: history.tokens.clone() };
            let snapshot = kv.snapshot_state(&dir, &meta).map_err(|e| e.to_string())?;
            let bytes = snapshot.ram_bytes();
            let charge = match pool.charge(bytes) {
                Ok(c) => c,
                Err(_) => {
                    // Copies of earlier saves may hold the room: wait for them, then try again.
                    self.writer.settle();
                    pool.charge(bytes).map_err(|e| format!("the KV budget has no room for the save's copy of the state: {e}"))?
                }
            };
            let saved = Saved { owner: owner.as_str().to_string(), session_id: session_id.to_string(), history: history.clone() };
            self.writer.queue(id, owner.as_str(), meta_owner, Work::Save { snapshot, saved, charge });
            Ok(())
        })();
        self.writer.count_asked(queued.is_err());
        queued
    }

    /// Whether `owner` has saved sessions (only `session` where named), or operations on
    /// its saved sessions pending.
    pub fn has(&self, owner: &OwnerKey, session: Option<&str>) -> bool {
        let of = |s: &Saved| s.owner == owner.as_str() && session.is_none_or(|id| id == s.session_id);
        self.writer.with_catalog(|c| c.values().any(of)) || !self.writer.pending_of(owner.as_str()).is_empty()
    }

    /// The saved session of `owner` (only `session` where named) that `req` extends, the one
    /// holding most tokens, once no operation on `owner`'s saved sessions is pending (the
    /// caller waits for them here).
    pub fn extended_by(
        &self,
        owner: &OwnerKey,
        session: Option<&str>,
        req: &AdmitRequest<'_>,
        cold: &(Vec<u32>, Vec<usize>),
    ) -> Option<Extended> {
        if self.writer.wait_for(owner.as_str()) {
            tracing::debug!("a turn waited for its conversation's save to be written");
        }
        self.writer.with_catalog(|c| {
            c.iter()
                .filter(|(_, s)| s.owner == owner.as_str() && session.is_none_or(|id| id == s.session_id))
                .filter_map(|(id, s)| {
                    s.history.extended_by(req, cold).map(|t| (id.clone(), s.session_id.clone(), t, s.history.tokens.len()))
                })
                .max_by_key(|c| c.3)
        })
    }

    /// The sparse cache saved as entry `id`, resumed for `model` under `cfg` with its live
    /// file in `off.dir`, checked (module doc). A damaged or missing entry is deleted; one of
    /// another configuration or version is left (a later save replaces it); either way the
    /// error names the file and the caller recomputes. Call with no operation pending on it
    /// ([`LongDisk::extended_by`] waits for them).
    pub fn resume(&self, id: &str, model: &ModelConfig, cfg: SparseConfig, off: OffloadConfig) -> Result<SparseKv, StateError> {
        let Some(saved) = self.writer.with_catalog(|c| c.get(id).cloned()) else {
            return Err(StateError::NotFound { path: id.into() });
        };
        let meta_owner = entry_owner(&saved.owner, &saved.session_id);
        let dir = self.lock().folder_path(id).map_err(|e| StateError::Invalid { path: id.into(), reason: e.to_string() })?;
        let expect = StateMeta { fingerprint: self.fingerprint.clone(), owner: meta_owner.clone(), tokens: Vec::new() };
        let resumed = SparseKv::resume_state(&dir, model, cfg, &expect, Some(off)).and_then(|(kv, meta)| {
            if meta.tokens != saved.history.tokens {
                return Err(StateError::Invalid {
                    path: dir.join(TURN_FILE),
                    reason: format!(
                        "the state holds {} other tokens than its turn file's {}",
                        meta.tokens.len(),
                        saved.history.tokens.len()
                    ),
                });
            }
            Ok(kv)
        });
        match &resumed {
            Ok(_) => self.lock().record_folder_hit(id),
            Err(e) if e.is_corrupt() || matches!(e, StateError::NotFound { .. }) => self.drop_entry(id, &meta_owner, &e.to_string()),
            Err(_) => {
                self.writer.with_catalog(|c| c.remove(id));
            }
        }
        resumed
    }

    /// Deletes `owner`'s saved session `session_id`, if any (queued after its pending saves).
    pub fn remove(&self, owner: &str, session_id: &str) {
        let id = long_disk_id(owner, session_id);
        let known = self.writer.with_catalog(|c| c.contains_key(&id)) || self.writer.pending_of(owner).iter().any(|(i, _)| *i == id);
        if known {
            self.writer.queue(id, owner, entry_owner(owner, session_id), Work::Remove);
        }
    }

    /// Deletes every saved session of `owner`, and those whose saves are pending.
    pub fn remove_owner(&self, owner: &str) {
        let mut entries: Vec<(String, String)> = self.writer.with_catalog(|c| {
            c.iter().filter(|(_, s)| s.owner == owner).map(|(id, s)| (id.clone(), entry_owner(&s.owner, &s.session_id))).collect()
        });
        entries.extend(self.writer.pending_of(owner));
        entries.sort();
        entries.dedup();
        for (id, meta_owner) in entries {
            self.writer.queue(id, owner, meta_owner, Work::Remove);
        }
    }
}
