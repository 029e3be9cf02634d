//! Threads' rings on disk (everything persisted survives a restart): each
//! turn's KV as an `engram-kv` entry file, and per thread a manifest naming them in ring order
//! with what the ring keeps beside the KV (tokens, first position, embedding, pinned, when it
//! was saved) and the answer's unfed last token. Written by a background thread after a turn
//! retires, read back at the thread's first request after a restart.
//!
//! ```text
//!  <dir>/ring-<h(owner)>-<h(owner, thread)>.ring                 the manifest: "engram-ring v1 <len> <blake3>\n" + JSON
//!  <dir>/ring-<h(owner)>-<h(owner, thread)>-<nonce>.safetensors  one turn's KV at its slots (positions in the manifest)
//!  save:  new or moved turns' files written  →  manifest renamed over the old  →  files it no longer names deleted
//! ```
//! A turn's KV depends on its position (keys are stored after RoPE), so a turn moved since it
//! was last written (an eviction before it) or replaced in place (a state entry) gets a new
//! file; an unmoved one keeps its file.
//!
//! NOTE: a turn moved away and back to the same position between two saves keeps its older
//! file, whose keys differ from the moved ones by the rotations' float rounding only.
//!
//! Invariant: a restore yields exactly the turns, tokens, positions, embeddings and carry
//! that were saved, with each turn's KV bytes as written (every entry check passed and its
//! tokens equal to the manifest's), or an error and nothing: a damaged, truncated, foreign or
//! missing file refuses the whole ring (`crates/dual/tests/it/dual_persist.rs`). With
//! [`RingStore::load_unverified`] the turn files' checksums are the one check left running
//! (one background thread for the ring) until the caller waits for them
//! (`crates/dual/tests/it/dual_restore.rs`). Writes are
//! carried out in the order queued, each file atomically; [`RingStore::flush`] returns once
//! everything queued is on disk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::thread::JoinHandle;

use engram_kv::{
    check_in_background, open_entry_unchecked, write_entry, ChecksumCheck, EntryKind, EntryMeta, KvPool, SeqKv, UncheckedEntry,
};
use serde::{Deserialize, Serialize};

use crate::ring::TurnRing;

const MAGIC: &str = "engram-ring";
const VERSION: u32 = 1;
/// Manifests larger than this are refused unread (a ring of a few thousand tokens with
/// 384-float embeddings per turn is well under 1 MiB).
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// One turn as its manifest records it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct TurnRecord {
    file: String,
    tokens: Vec<u32>,
    first_position: usize,
    /// The embedding's floats as their bits: exact, NaN included (JSON has no NaN).
    embedding: Option<Vec<u32>>,
    pinned: bool,
    saved_unix: u64,
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    owner: String,
    thread: String,
    fingerprint: String,
    carry: Option<u32>,
    turns: Vec<TurnRecord>,
}

/// A turn read back: its tokens, its KV at its saved positions, and what the ring keeps
/// beside them.
pub struct RestoredTurn {
    /// The turn's tokens (at least one), as the manifest and its entry file both hold them.
    pub tokens: Vec<u32>,
    /// Exactly `tokens`' KV as written, at the positions it was saved at (`KvCache::place`).
    pub kv: SeqKv,
    /// The relevance embedding, bit for bit.
    pub embedding: Option<Vec<f32>>,
    /// A state entry (the hybrid mode): never evicted.
    pub pinned: bool,
}

/// A thread's ring read back: its turns in ring order and the last answer's unfed token.
pub struct RestoredRing {
    /// Oldest first, as the ring held them.
    pub turns: Vec<RestoredTurn>,
    /// The last answer's sampled, never fed token: the thread's next turn starts with it.
    pub carry: Option<u32>,
}

/// A ring read back with its turn files' checksums still to compute.
type Opened = (RestoredRing, Vec<UncheckedEntry>);

enum Job {
    /// Writes `files`, then the manifest, then deletes the thread's turn files (names starting
    /// with `prefix`) other than `keep`.
    Save {
        files: Vec<(PathBuf, EntryMeta, SeqKv)>,
        manifest: PathBuf,
        body: Vec<u8>,
        prefix: String,
        keep: Vec<String>,
    },
    /// Deletes every file in the directory whose name starts with the prefix.
    DeletePrefix(String),
    Flush(Sender<()>),
}

/// Every thread's ring files in one directory, and the writer thread. See the module doc.
pub struct RingStore {
    dir: PathBuf,
    fingerprint: String,
    tx: Option<Sender<Job>>,
    writer: Option<JoinHandle<()>>,
    /// Per thread, the file holding each turn's KV, with the position and tokens it was
    /// written with (a state entry replaced in place keeps its id: its tokens tell).
    saved: HashMap<(String, String), HashMap<u64, (usize, Vec<u32>, String, u64)>>,
    counter: u64,
}

fn hash16(parts: &[&str]) -> String {
    let mut h = blake3::Hasher::new_derive_key("engram 2026-11 ring files (owner, thread)");
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().to_hex()[..16].to_string()
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl RingStore {
    /// A store in `dir` (created if missing) for caches of `fingerprint`
    /// (`engram_kv::cache_fingerprint`). Errors: the directory or the writer thread.
    pub fn open(dir: impl Into<PathBuf>, fingerprint: &str) -> std::io::Result<RingStore> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        let (tx, rx) = channel::<Job>();
        let wdir = dir.clone();
        let writer = std::thread::Builder::new().name("engram-ring-writer".into()).spawn(move || {
            for job in rx {
                run(&wdir, job);
            }
        })?;
        Ok(RingStore { dir, fingerprint: fingerprint.to_string(), tx: Some(tx), writer: Some(writer), saved: HashMap::new(), counter: 0 })
    }

    fn owner_prefix(owner: &str) -> String {
        format!("ring-{}-", hash16(&[owner]))
    }

    fn thread_prefix(owner: &str, thread: &str) -> String {
        format!("{}{}", Self::owner_prefix(owner), hash16(&[owner, thread]))
    }

    /// The key of `owner`'s `thread` ring: the prefix of every file of it (a disk ledger's key).
    pub fn ring_key(owner: &str, thread: &str) -> String {
        Self::thread_prefix(owner, thread)
    }

    /// The rings a previous process left in the directory: per ring its key, its owner (from
    /// the manifest; rings whose manifest does not read are skipped, refused when loaded), the
    /// bytes of its files, and its manifest's modification time (seconds since the epoch).
    pub fn on_disk(&self) -> Vec<(String, String, u64, u64)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut sizes: HashMap<String, u64> = HashMap::new();
        let mut manifests = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            // ring-<16 hex>-<16 hex>: the key of every file of the ring.
            let Some(key) = name.get(..38).filter(|k| k.starts_with("ring-")) else { continue };
            let meta = e.metadata().ok();
            *sizes.entry(key.to_string()).or_default() += meta.as_ref().map_or(0, |m| m.len());
            if name.ends_with(".ring") {
                let modified = meta.and_then(|m| m.modified().ok()).and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                manifests.push((key.to_string(), e.path(), modified.map_or(0, |d| d.as_secs())));
            }
        }
        let owner_of = |path: &Path| -> Option<String> {
            let bytes = std::fs::read(path).ok()?;
            let nl = bytes.iter().position(|&b| b == b'\n')?;
            serde_json::from_slice::<Manifest>(&bytes[nl + 1..]).ok().map(|m| m.owner)
        };
        manifests.into_iter().filter_map(|(key, path, modified)| Some((key.clone(), owner_of(&path)?, sizes[&key], modified))).collect()
    }

    /// Deletes the ring whose key is `key` ([`RingStore::ring_key`]), after every write queued
    /// before (a ring evicted for the disk budget); its thread's next save writes it whole.
    pub fn discard_key(&mut self, key: &str) {
        self.saved.retain(|(o, t), _| Self::thread_prefix(o, t) != key);
        self.send(Job::DeletePrefix(key.to_string()));
    }

    /// The manifest's path of `owner`'s `thread`.
    pub fn manifest_path(&self, owner: &str, thread: &str) -> PathBuf {
        self.dir.join(format!("{}.ring", Self::thread_prefix(owner, thread)))
    }

    fn send(&self, job: Job) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
    }

    /// Queues `ring` of `owner`'s `thread` (with `carry`, the last answer's unfed token) for
    /// writing: the files of turns new or moved since the last save, then the manifest, then
    /// the deletion of files no turn uses any more. Returns at once; the engine thread only
    /// forks the turns' KV (blocks shared, not copied); a turn whose KV is on disk (masked) and
    /// needs a new file is read back for it. Returns the bytes the ring's files take once
    /// written (turn files and manifest); an error (such a turn's file unreadable) queues
    /// nothing and keeps the ring's last save.
    pub fn save(&mut self, owner: &str, thread: &str, ring: &TurnRing, carry: Option<u32>) -> Result<u64, String> {
        let prefix = Self::thread_prefix(owner, thread);
        let key = (owner.to_string(), thread.to_string());
        let old = self.saved.get(&key).cloned().unwrap_or_default();
        let mut now = HashMap::new();
        let (mut files, mut records) = (Vec::new(), Vec::new());
        for t in ring.turns() {
            let first = t.first_position();
            let (file, bytes) = match old.get(&t.id) {
                Some((pos, tokens, file, bytes)) if *pos == first && *tokens == t.tokens => (file.clone(), *bytes),
                _ => {
                    self.counter += 1;
                    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
                    let file = format!("{prefix}-{nanos:x}-{}.safetensors", self.counter);
                    let meta = EntryMeta {
                        fingerprint: self.fingerprint.clone(),
                        kind: EntryKind::Session,
                        owner: format!("{owner}/{thread}"),
                        tokens: t.tokens.clone(),
                        text: String::new(),
                        offsets: Vec::new(),
                        created_unix: now_unix(),
                    };
                    let kv = ring.kv_copy(t)?.fork_at_slot_positions();
                    let bytes = engram_kv::persist::encoded_len(&meta, &kv).unwrap_or(0);
                    files.push((self.dir.join(&file), meta, kv));
                    (file, bytes)
                }
            };
            records.push(TurnRecord {
                file: file.clone(),
                tokens: t.tokens.clone(),
                first_position: first,
                embedding: t.embedding.as_ref().map(|e| e.iter().map(|x| x.to_bits()).collect()),
                pinned: t.pinned,
                saved_unix: now_unix(),
            });
            now.insert(t.id, (first, t.tokens.clone(), file, bytes));
        }
        let keep = now.values().map(|(_, _, f, _)| f.clone()).collect();
        let turn_bytes: u64 = now.values().map(|(_, _, _, b)| b).sum();
        let manifest =
            Manifest { owner: owner.to_string(), thread: thread.to_string(), fingerprint: self.fingerprint.clone(), carry, turns: records };
        let json = serde_json::to_vec(&manifest).expect("manifests serialize");
        let body = engram_kv::envelope::seal(MAGIC, VERSION, &json);
        let total = turn_bytes + body.len() as u64;
        self.saved.insert(key, now);
        self.send(Job::Save { files, manifest: self.manifest_path(owner, thread), body, prefix, keep });
        Ok(total)
    }

    /// Reads back `owner`'s `thread`: `Ok(None)` without a manifest; an error naming what is
    /// wrong when anything of it cannot be trusted (the caller starts the thread with an
    /// empty ring, and its files are deleted). Each turn's KV is checked whole (checksum,
    /// model and format, owner, tokens) and sits at its saved positions.
    pub fn load(&mut self, owner: &str, thread: &str, pool: &KvPool, vocab: usize) -> Result<Option<RestoredRing>, String> {
        let result = self.open_ring(owner, thread, pool, vocab).and_then(|found| match found {
            Some((ring, unchecked)) => {
                unchecked.into_iter().try_for_each(UncheckedEntry::check).map_err(|e| e.to_string())?;
                Ok(Some(ring))
            }
            None => Ok(None),
        });
        if result.is_err() {
            self.discard(owner, thread);
        }
        result
    }

    /// [`RingStore::load`] with the turn files' checksums left running on a background thread
    /// (the caller prefills on the mapped turns meanwhile): every other check has passed. The
    /// caller waits for the returned check before it shows or keeps anything computed from the
    /// ring, and on `Err` drops the ring and calls [`RingStore::discard`].
    pub fn load_unverified(
        &mut self,
        owner: &str,
        thread: &str,
        pool: &KvPool,
        vocab: usize,
    ) -> Result<Option<(RestoredRing, ChecksumCheck)>, String> {
        let result = self.open_ring(owner, thread, pool, vocab).and_then(|found| match found {
            Some((ring, unchecked)) => {
                let check = check_in_background(self.manifest_path(owner, thread), unchecked).map_err(|e| e.to_string())?;
                Ok(Some((ring, check)))
            }
            None => Ok(None),
        });
        if result.is_err() {
            self.discard(owner, thread);
        }
        result
    }

    /// Forgets `owner`'s `thread` on disk (a ring that failed its checks): its files are deleted,
    /// after every write queued before.
    pub fn discard(&mut self, owner: &str, thread: &str) {
        self.saved.remove(&(owner.to_string(), thread.to_string()));
        self.send(Job::DeletePrefix(Self::thread_prefix(owner, thread)));
    }

    /// Reads the manifest and opens every turn file (all checks but the turn files' checksums).
    fn open_ring(&mut self, owner: &str, thread: &str, pool: &KvPool, vocab: usize) -> Result<Option<Opened>, String> {
        let path = &self.manifest_path(owner, thread);
        let size = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        if size > MAX_MANIFEST_BYTES {
            return Err(format!("{}: {size} bytes, over the {MAX_MANIFEST_BYTES}-byte limit", path.display()));
        }
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let bad = |why: &str| format!("{}: {why}", path.display());
        let body = engram_kv::envelope::open(&bytes, MAGIC, VERSION).map_err(|e| bad(&format!("not a sound ring manifest: {e}")))?;
        let m: Manifest = serde_json::from_slice(body).map_err(|e| bad(&format!("does not parse: {e}")))?;
        if m.owner != owner || m.thread != thread {
            return Err(bad("another thread's ring"));
        }
        if m.fingerprint != self.fingerprint {
            return Err(bad("made by another model or KV format"));
        }
        let prefix = Self::thread_prefix(owner, thread);
        let (mut turns, mut unchecked) = (Vec::with_capacity(m.turns.len()), Vec::with_capacity(m.turns.len()));
        for (i, r) in m.turns.iter().enumerate() {
            if !r.file.starts_with(&prefix) || r.file.contains('/') || r.tokens.is_empty() {
                return Err(bad(&format!("turn {i} names a file that is not this thread's")));
            }
            let (meta, mut kv, sum) =
                open_entry_unchecked(&self.dir.join(&r.file), pool, &self.fingerprint, vocab).map_err(|e| e.to_string())?;
            unchecked.push(sum);
            if meta.tokens != r.tokens || meta.owner != format!("{owner}/{thread}") || kv.len() != r.tokens.len() {
                return Err(bad(&format!("turn {i}'s file holds another turn")));
            }
            let positions: Vec<u32> = (r.first_position..r.first_position + kv.len()).map(|p| p as u32).collect();
            engram_model::KvCache::place(&mut kv, 0, &positions).map_err(|e| bad(&e))?;
            turns.push(RestoredTurn {
                tokens: r.tokens.clone(),
                kv,
                embedding: r.embedding.as_ref().map(|e| e.iter().map(|&b| f32::from_bits(b)).collect()),
                pinned: r.pinned,
            });
        }
        // Turn ids are the ring's, given again when the turns are pushed: the next save
        // writes them under their new ids (and deletes these files once its manifest is in).
        Ok(Some((RestoredRing { turns, carry: m.carry }, unchecked)))
    }

    /// Queues the deletion of every ring file of `owner`.
    pub fn forget_owner(&mut self, owner: &str) {
        self.saved.retain(|(o, _), _| o != owner);
        self.send(Job::DeletePrefix(Self::owner_prefix(owner)));
    }

    /// Waits until everything queued so far is on disk (or deleted).
    pub fn flush(&self) {
        let (tx, rx) = channel();
        self.send(Job::Flush(tx));
        let _ = rx.recv();
    }
}

impl Drop for RingStore {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Carries out one job on the writer thread. A failed turn file leaves the thread without a
/// manifest (never one naming a file that is not there): it starts empty after a restart.
fn run(dir: &Path, job: Job) {
    match job {
        Job::Save { files, manifest, body, prefix, keep } => {
            for (path, meta, kv) in files {
                if let Err(e) = write_entry(&path, &meta, &kv) {
                    tracing::warn!("a ring turn is not saved, the thread's ring will not survive a restart: {e}");
                    let _ = std::fs::remove_file(&manifest);
                    return;
                }
            }
            let written = engram_kv::persist::atomic_write(&manifest, |w| std::io::Write::write_all(w, &body));
            if let Err(e) = written {
                tracing::warn!("{}: the ring manifest is not saved: {e}", manifest.display());
                let _ = std::fs::remove_file(&manifest);
                return;
            }
            delete_files(dir, &prefix, &keep, true);
        }
        Job::DeletePrefix(prefix) => delete_files(dir, &prefix, &[], false),
        Job::Flush(done) => {
            let _ = done.send(());
        }
    }
}

/// Deletes the files in `dir` whose names start with `prefix`, but for the turn files `keep`
/// and, with `keep_manifest`, the thread's manifest `<prefix>.ring`.
fn delete_files(dir: &Path, prefix: &str, keep: &[String], keep_manifest: bool) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let manifest = format!("{prefix}.ring");
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let is_manifest = keep_manifest && name == manifest;
        if name.starts_with(prefix) && !is_manifest && !keep.contains(&name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
