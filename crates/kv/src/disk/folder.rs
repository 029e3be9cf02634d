//! Folder entries: a cache entry that is a folder of files another crate writes (a long
//! conversation's sparse state: its state file and its offload file), counted against the
//! store's budget and its owner's group share, and evicted by the same policy as KV entries.
//!
//! ```text
//!  <dir>/<id>.folder/          the owner's files, written by the owner between
//!                              `begin_folder` and `commit_folder`
//!  <dir>/<id>.folder/.entry    envelope `engram-folder-entry` v1, JSON body: owner, tokens,
//!                              creation time; written last, by `commit_folder`
//! ```
//!
//! Invariant: the store never reads the owner's files (their writer checks them when it reads
//! them back; the store counts and evicts); a folder without a sound `.entry` (a first write
//! interrupted before its commit, or damage) is deleted at open; a folder's bytes are every
//! file in it as measured at its last commit, and after that commit the budget and the
//! owner's share hold as after a `put`. A folder entry is never restored as KV (`get` misses).

use std::path::{Path, PathBuf};

use serde_json::json;

use super::{validate_id, DiskError, DiskStore, EntryStats, Result};
use crate::envelope;
use crate::persist::EntryKind;

/// The extension of a folder entry's folder.
pub const FOLDER_EXT: &str = "folder";
/// The file in a folder entry that names its owner (written by the store).
const ENTRY_FILE: &str = ".entry";
const MAGIC: &str = "engram-folder-entry";
const VERSION: u32 = 1;

/// Bytes of the regular files directly in `dir`.
fn folder_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let m = e?.metadata()?;
        if m.is_file() {
            n += m.len();
        }
    }
    Ok(n)
}

/// The stats of folder entry `id` at `dir` from its `.entry` (hits and pin start over), or
/// why it is not a sound folder entry.
pub(super) fn read_folder(id: &str, dir: &Path) -> std::result::Result<EntryStats, String> {
    let path = dir.join(ENTRY_FILE);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e} (a write interrupted before its commit)", path.display()))?;
    let body = envelope::open(&bytes, MAGIC, VERSION).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("{}: {e}", path.display()))?;
    let (Some(owner), Some(tokens), Some(created)) = (v["owner"].as_str(), v["num_tokens"].as_u64(), v["created_unix"].as_u64()) else {
        return Err(format!("{}: not a folder entry's metadata", path.display()));
    };
    let total = folder_bytes(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(EntryStats {
        id: id.to_string(),
        kind: EntryKind::Session,
        owner: owner.to_string(),
        bytes: total,
        hits: 0,
        created_unix: created,
        last_used_unix: created,
        pinned: false,
        num_tokens: tokens as usize,
    })
}

impl DiskStore {
    /// The folder of folder entry `id` (which may not exist).
    pub fn folder_path(&self, id: &str) -> Result<PathBuf> {
        validate_id(id)?;
        Ok(self.dir.join(format!("{id}.{FOLDER_EXT}")))
    }

    /// Whether `id` is a folder entry.
    pub fn is_folder(&self, id: &str) -> bool {
        self.folders.contains(id)
    }

    /// Before `owner` writes folder entry `id`'s files: checks the owner (an entry of another
    /// owner is [`DiskError::OwnerMismatch`]) and returns the folder, created. Nothing is
    /// counted until [`DiskStore::commit_folder`]; an existing entry stays listed meanwhile.
    pub fn begin_folder(&mut self, id: &str, owner: &str) -> Result<PathBuf> {
        let dir = self.folder_path(id)?;
        self.check_owner(id, owner)?;
        if self.entries.contains_key(id) && !self.folders.contains(id) {
            return Err(DiskError::InvalidId { id: id.to_string(), reason: "names a KV entry, not a folder" });
        }
        std::fs::create_dir_all(&dir).map_err(|e| DiskError::Io { path: dir.clone(), source: e })?;
        Ok(dir)
    }

    /// Records folder entry `id` of `owner` holding `num_tokens` tokens once its files are
    /// written in [`DiskStore::begin_folder`]'s folder: measures them, makes room (evicting
    /// other entries by policy, the owner's group first past its share; never `id`), then
    /// writes the `.entry`. Returns the entry's bytes. Where it cannot fit (larger than the
    /// budget or the share, pinned entries in the way) the folder is deleted and the error
    /// returned.
    pub fn commit_folder(&mut self, id: &str, owner: &str, num_tokens: usize) -> Result<u64> {
        let dir = self.folder_path(id)?;
        let io = |e| DiskError::Io { path: dir.clone(), source: e };
        let now = self.now();
        let body =
            serde_json::to_vec(&json!({"owner": owner, "num_tokens": num_tokens, "created_unix": now})).expect("JSON values serialize");
        let fits = folder_bytes(&dir)
            .map_err(io)
            .and_then(|files| {
                let bytes = files + envelope::seal(MAGIC, VERSION, &body).len() as u64;
                self.check_owner(id, owner)?;
                self.make_room(id, owner, bytes)?;
                Ok(bytes)
            })
            .and_then(|bytes| {
                envelope::write_sealed(&dir.join(ENTRY_FILE), MAGIC, VERSION, &body).map_err(io)?;
                Ok(bytes)
            });
        let bytes = match fits {
            Ok(b) => b,
            Err(e) => {
                if self.check_owner(id, owner).is_ok() {
                    let _ = std::fs::remove_dir_all(&dir);
                    self.entries.remove(id);
                    self.folders.remove(id);
                    self.mark_index_dirty();
                }
                return Err(e);
            }
        };
        let old = self.entries.remove(id);
        self.folders.insert(id.to_string());
        self.entries.insert(
            id.to_string(),
            EntryStats {
                id: id.to_string(),
                kind: EntryKind::Session,
                owner: owner.to_string(),
                bytes,
                hits: old.as_ref().map_or(0, |o| o.hits),
                created_unix: old.as_ref().map_or(now, |o| o.created_unix),
                last_used_unix: now,
                pinned: old.is_some_and(|o| o.pinned),
                num_tokens,
            },
        );
        self.mark_index_dirty();
        Ok(bytes)
    }

    /// Counts a use of folder entry `id` (its owner read it back): a hit, and now as its last
    /// use, for the eviction policy.
    pub fn record_folder_hit(&mut self, id: &str) {
        let now = self.now();
        if let Some(s) = self.entries.get_mut(id).filter(|s| self.folders.contains(&s.id)) {
            s.hits += 1;
            s.last_used_unix = now;
            self.mark_index_dirty();
        }
    }

    /// Deletes folder `id`'s files (the stats are the caller's).
    pub(super) fn remove_folder(&self, id: &str) -> Result<()> {
        let dir = self.folder_path(id)?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(DiskError::Io { path: dir, source: e }),
        }
    }
}
