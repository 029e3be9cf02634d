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
//! Invariant: a session is resumed only from a state whose envelope, fingerprint (model, KV
//! format and sparse configuration), owner, shape and KV rows' BLAKE3 check out and whose
//! tokens equal its turn file's; anything else is an error naming the file (damaged files are
//! deleted), and the caller recomputes the turn. The id is a function of the owner and session
//! id alone, so a conversation's later save replaces its earlier one.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use engram_kv::DiskStore;
use engram_model::ModelConfig;
use engram_policy::OwnerKey;

use super::history::History;
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

/// Long sessions on disk (module doc).
pub(crate) struct LongDisk {
    store: Arc<Mutex<DiskStore>>,
    /// Model, KV format and sparse configuration: what a saved state must have been made by.
    fingerprint: String,
    /// Saved sessions known, by disk id.
    catalog: HashMap<String, Saved>,
}

impl LongDisk {
    /// The long sessions `store` holds that `fingerprint` made (others stay, a miss).
    pub fn open(store: Arc<Mutex<DiskStore>>, fingerprint: String) -> LongDisk {
        let mut disk = LongDisk { store, fingerprint, catalog: HashMap::new() };
        let entries: Vec<(String, String, std::path::PathBuf)> = {
            let s = disk.lock();
            s.list()
                .into_iter()
                .filter(|e| e.id.starts_with("long-") && s.is_folder(&e.id))
                .filter_map(|e| Some((s.folder_path(&e.id).ok()?, e)))
                .map(|(dir, e)| (e.id, e.owner, dir))
                .collect()
        };
        for (id, owner, dir) in entries {
            match read_turn(&dir.join(TURN_FILE), &disk.fingerprint) {
                Ok(saved)
                    if entry_owner(&saved.owner, &saved.session_id) == owner && long_disk_id(&saved.owner, &saved.session_id) == id =>
                {
                    disk.catalog.insert(id, saved);
                }
                Ok(_) => disk.drop_entry(&id, &owner, "its turn file names another owner or id"),
                Err(e) if e.contains("another model") => tracing::debug!("long session {id} not resumable here: {e}"),
                Err(e) => disk.drop_entry(&id, &owner, &e),
            }
        }
        disk
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DiskStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Saved sessions known.
    pub fn len(&self) -> usize {
        self.catalog.len()
    }

    /// Bytes of the saved sessions' folders in the store.
    pub fn bytes(&self) -> u64 {
        let s = self.lock();
        self.catalog.keys().filter_map(|id| s.stats(id)).map(|e| e.bytes).sum()
    }

    /// Deletes entry `id` of owner metadata `owner` with a warning saying why.
    fn drop_entry(&mut self, id: &str, owner: &str, why: &str) {
        tracing::warn!("dropping saved long conversation {id}: {why}");
        self.catalog.remove(id);
        let mut s = self.lock();
        if let Err(e) = s.remove(id, owner) {
            tracing::warn!("deleting {id}: {e}");
        }
    }

    /// Saves `owner`'s session `session_id` (its `history` and sparse cache `kv`), replacing
    /// its earlier save; the entry's bytes. A save the disk budget or the tenant's share
    /// cannot take leaves nothing (the error says why).
    pub fn save(&mut self, owner: &OwnerKey, session_id: &str, history: &History, kv: &SparseKv) -> Result<u64, String> {
        let meta_owner = entry_owner(owner.as_str(), session_id);
        let id = long_disk_id(owner.as_str(), session_id);
        let (dir, existed) = {
            let mut s = self.lock();
            (s.begin_folder(&id, &meta_owner).map_err(|e| e.to_string())?, s.stats(&id).is_some())
        };
        let written = kv
            .save_state(
                &dir,
                &StateMeta { fingerprint: self.fingerprint.clone(), owner: meta_owner.clone(), tokens: history.tokens.clone() },
            )
            .map_err(|e| e.to_string())
            .and_then(|_| {
                let mut body = Vec::new();
                let mut e = Enc(&mut body);
                e.str(&self.fingerprint);
                e.str(owner.as_str());
                e.str(session_id);
                e.str(&history.text);
                e.lens(&history.token_ends);
                e.u32s(&history.tokens);
                e.bool(history.unfed.is_some());
                if let Some(t) = history.unfed {
                    e.u32(t);
                }
                engram_kv::envelope::write_sealed(&dir.join(TURN_FILE), TURN_MAGIC, TURN_VERSION, &body)
                    .map_err(|e| format!("{}: {e}", dir.display()))
            });
        if let Err(e) = written {
            if !existed {
                let _ = std::fs::remove_dir_all(&dir);
            }
            return Err(e);
        }
        let (bytes, index) = {
            let mut s = self.lock();
            let r = s.commit_folder(&id, &meta_owner, history.tokens.len());
            (r, s.take_index())
        };
        if let Some(Err(e)) = index.map(engram_kv::IndexWrite::write) {
            tracing::warn!("cache index not saved: {e}");
        }
        let bytes = bytes.map_err(|e| {
            self.catalog.remove(&id);
            e.to_string()
        })?;
        self.catalog.insert(id, Saved { owner: owner.as_str().to_string(), session_id: session_id.to_string(), history: history.clone() });
        Ok(bytes)
    }

    /// The saved sessions of `owner` (only `session` where named): disk ids and what they hold.
    pub fn of<'a>(&'a self, owner: &'a OwnerKey, session: Option<&'a str>) -> impl Iterator<Item = (&'a String, &'a Saved)> + 'a {
        self.catalog.iter().filter(move |(_, s)| s.owner == owner.as_str() && session.is_none_or(|id| id == s.session_id))
    }

    /// The sparse cache saved as entry `id`, resumed for `model` under `cfg` with its live
    /// file in `off.dir`, checked (module doc). A damaged or missing entry is deleted; one of
    /// another configuration or version is left (a later save replaces it); either way the
    /// error names the file and the caller recomputes.
    pub fn resume(&mut self, id: &str, model: &ModelConfig, cfg: SparseConfig, off: OffloadConfig) -> Result<SparseKv, StateError> {
        let Some(saved) = self.catalog.get(id) else {
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
                self.catalog.remove(id);
            }
        }
        resumed
    }

    /// Deletes `owner`'s saved session `session_id`, if any.
    pub fn remove(&mut self, owner: &str, session_id: &str) {
        let id = long_disk_id(owner, session_id);
        if self.catalog.remove(&id).is_some() {
            let mut s = self.lock();
            if let Err(e) = s.remove(&id, &entry_owner(owner, session_id)) {
                tracing::warn!("deleting {id}: {e}");
            }
        }
    }

    /// Deletes every saved session of `owner`.
    pub fn remove_owner(&mut self, owner: &str) {
        let sessions: Vec<String> = self.catalog.values().filter(|s| s.owner == owner).map(|s| s.session_id.clone()).collect();
        for sid in sessions {
            self.remove(owner, &sid);
        }
    }
}
