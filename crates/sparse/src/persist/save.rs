//! Saving a sparse state in two parts, so that the slow part runs off the thread that decodes:
//! [`SparseKv::snapshot_state`] takes what the state holds in RAM — copies of the parts bounded
//! by the RAM budget (the RAM tail, sinks, last selections) and shared references to the parts
//! that grow with the history (the index and the position → file row tables, copy on write:
//! `crate::shared`) — and opens a second handle on the live offload file, and
//! [`StateSnapshot::write`] does the I/O (the offload file's data synced, its saved rows hashed
//! and linked into the folder, the state file streamed and renamed into place, older KV files
//! removed). [`SparseKv::save_state`] is both at once.
//!
//! Invariant: a snapshot describes the cache exactly as it was when taken, whatever the cache
//! does afterwards: the index and the row tables it shares are copied by the cache before the
//! cache changes them; the live file is append-only (the append layout; rows are never
//! rewritten, a truncation never happens to a live file), so its first `rows` rows stay the
//! snapshot's, and the snapshot's handle keeps the file readable even once the cache is dropped
//! and its name removed. The file linked into the folder is checked to be that same file
//! (device and inode) and copied from the handle otherwise; the state names the rows and their
//! BLAKE3, so a resume never uses rows the state did not hash.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use engram_kv::envelope;

use super::codec::Enc;
use super::{rows_hash_with, save_method, StateError, StateMeta, MAGIC, STATE_FILE, VERSION};
use crate::offload::file::{RowReader, HEADER};
use crate::offload::Layout;
use crate::shared::SharedIndex;
use crate::SparseKv;

/// A new KV file name (process, time and a counter: never one a folder already holds).
fn kv_name() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let h = blake3::hash(format!("{}-{t}-{n}", std::process::id()).as_bytes());
    format!("kv-{}", &h.to_hex()[..16])
}

/// Whether `path` names the same file as `file` (device and inode).
fn same_file(path: &Path, file: &File) -> bool {
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// `to` as a new name of the live file `reader` reads (a hard link of `from`, its name), or a
/// copy of its first `bytes` read through the handle where the two are on different file
/// systems or `from` no longer names that file; `to` appears whole or not at all.
fn link_or_copy(reader: &RowReader, from: &Path, to: &Path, bytes: u64) -> io::Result<()> {
    let dir = to.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.link", to.file_name().and_then(|n| n.to_str()).unwrap_or("kv")));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(from, &tmp).is_ok() {
        if same_file(&tmp, reader.file()) {
            let r = std::fs::rename(&tmp, to).and_then(|()| File::open(dir)?.sync_all());
            if r.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            return r;
        }
        let _ = std::fs::remove_file(&tmp);
    }
    engram_kv::persist::atomic_write(to, |w| {
        let mut buf = vec![0u8; 4 << 20];
        let mut at = 0;
        while at < bytes {
            let n = (bytes - at).min(buf.len() as u64) as usize;
            reader.file().read_exact_at(&mut buf[..n], at)?;
            w.write_all(&buf[..n])?;
            at += n as u64;
        }
        Ok(())
    })
}

/// The live offload file's part of a snapshot: a handle on it and how many rows are saved.
struct KvPart {
    reader: RowReader,
    rows: u64,
}

/// Elements of a row table encoded per piece of the body (64 KiB).
const TABLE_PIECE: usize = 16 << 10;

/// A sparse state taken from its cache, to be written to `dir` (module doc). What it copies
/// is bounded by the cache's RAM budget (identity, shape, the RAM tail, the sinks, each head's
/// last selection); what grows with the history — the index and the position → file row
/// tables — it shares with the cache copy on write (`crate::shared`), so taking a snapshot
/// allocates nothing in proportion to the history, and neither does writing it (one head's
/// index at a time, row tables in pieces).
pub struct StateSnapshot {
    dir: PathBuf,
    /// The state file's body up to the row tables (identity, shape, RAM tail, and for an
    /// offloaded state its sinks).
    head: Vec<u8>,
    /// Offloaded: the position → file row tables, shared with the cache.
    slots: Vec<Arc<Vec<u32>>>,
    /// Offloaded: the body between the row tables and the offload file's name (bytes
    /// written, the model fingerprint).
    mid: Vec<u8>,
    /// The offload file's part (`None`: the state is all in RAM).
    kv: Option<KvPart>,
    /// Per head: its index, shared with the cache, and its last selection (a copy).
    index: Vec<(SharedIndex, Vec<u32>)>,
    /// Bytes a copy of the shared parts would take: the index's and the tables' encodings.
    shared_bytes: usize,
    tokens: usize,
}

impl StateSnapshot {
    /// The folder the state goes to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Tokens the state holds.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Bytes of RAM the snapshot may hold: its own copies (RAM tail, sinks, last selections)
    /// plus the shared index and row tables, which cost nothing more unless the cache changes
    /// them before the snapshot is written (then up to a copy of each). An upper bound, for
    /// the KV pool's charge.
    pub fn ram_bytes(&self) -> usize {
        self.head.len() + self.mid.len() + self.index.iter().map(|(_, s)| s.len() * 4).sum::<usize>() + self.shared_bytes
    }

    /// Bytes the snapshot copied out of its cache (identity, shape, RAM tail, sinks, last
    /// selections): bounded by the cache's RAM budget, whatever the history.
    pub fn copied_bytes(&self) -> usize {
        self.head.len() + self.mid.len() + self.index.iter().map(|(_, s)| s.len() * 4).sum::<usize>()
    }

    /// Emits the state file's body piece by piece (`kv_tail`: the offload file's name, rows
    /// and checksum, empty when all in RAM), the same bytes every call.
    fn emit(&self, kv_tail: &[u8], out: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        out(&self.head)?;
        let mut piece = Vec::new();
        for table in &self.slots {
            piece.clear();
            Enc(&mut piece).len(table.len());
            out(&piece)?;
            for part in table.chunks(TABLE_PIECE) {
                piece.clear();
                part.iter().for_each(|v| piece.extend_from_slice(&v.to_le_bytes()));
                out(&piece)?;
            }
        }
        out(&self.mid)?;
        out(kv_tail)?;
        let mut blob = Vec::new();
        for (index, selection) in &self.index {
            blob.clear();
            index.save(&mut blob);
            piece.clear();
            Enc(&mut piece).len(blob.len());
            out(&piece)?;
            out(&blob)?;
            piece.clear();
            Enc(&mut piece).u32s(selection);
            out(&piece)?;
        }
        Ok(())
    }

    /// Writes the state to its folder (created if missing), replacing a state saved there
    /// before (module doc of `persist`: the KV file first under a new name, then the state
    /// file atomically, then older KV files removed). Returns the bytes of the state file
    /// plus the offload file's saved rows.
    pub fn write(self) -> Result<u64, StateError> {
        let dir = &self.dir;
        let state = dir.join(STATE_FILE);
        std::fs::create_dir_all(dir).map_err(|e| StateError::io(dir, e))?;
        let mut linked = None;
        let mut kv_tail = Vec::new();
        if let Some(KvPart { reader, rows }) = &self.kv {
            let live = reader.path().to_path_buf();
            reader.file().sync_data().map_err(|e| StateError::io(&live, e))?;
            let sum =
                rows_hash_with(reader.row_bytes(), *rows, |at, buf| reader.read_rows(at, buf)).map_err(|e| StateError::io(&live, e))?;
            let name = kv_name();
            let to = dir.join(&name);
            let bytes = HEADER + rows * reader.row_bytes() as u64;
            link_or_copy(reader, &live, &to, bytes).map_err(|e| StateError::io(&to, e))?;
            let mut e = Enc(&mut kv_tail);
            e.str(&name);
            e.u64(*rows);
            e.bytes(&sum);
            linked = Some((name, bytes));
        }
        // The body is emitted twice (checksum, then write), never built whole in RAM.
        let body_bytes = Cell::new(0u64);
        envelope::write_sealed_with(&state, MAGIC, VERSION, |out| {
            body_bytes.set(0);
            self.emit(&kv_tail, &mut |p| {
                body_bytes.set(body_bytes.get() + p.len() as u64);
                out(p)
            })
        })
        .map_err(|e| StateError::io(&state, e))?;
        // The new pair is in place: older KV files go (and any left by a crashed save).
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let n = entry.file_name();
                let n = n.to_string_lossy();
                let ours = linked.as_ref().is_some_and(|(k, _)| *k == n);
                if !ours && (n.starts_with("kv-") || (n.starts_with(".kv-") && n.ends_with(".link"))) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(body_bytes.get() + linked.map_or(0, |(_, b)| b))
    }
}

impl SparseKv {
    /// Saves this cache (index built, the prefill over) with `meta` to the folder `dir`
    /// (created if missing; module doc of `persist`), replacing a state saved there before.
    /// Returns the bytes of the state file plus the offload file's saved rows. The cache is
    /// unchanged and keeps decoding; a later save replaces this one.
    pub fn save_state(&self, dir: &Path, meta: &StateMeta) -> Result<u64, StateError> {
        self.snapshot_state(dir, meta)?.write()
    }

    /// What [`SparseKv::save_state`] would write to `dir`, taken now, to be written later
    /// (by another thread) with [`StateSnapshot::write`]: no file is written or read here
    /// (the live offload file gets a second handle), and what is copied is bounded by the RAM
    /// budget (the index and row tables are shared copy on write; [`StateSnapshot`]). Errors
    /// as `save_state`'s for a cache that cannot be saved.
    pub fn snapshot_state(&self, dir: &Path, meta: &StateMeta) -> Result<StateSnapshot, StateError> {
        let state = dir.join(STATE_FILE);
        let unsavable = |reason: &str| StateError::Unsavable { path: state.clone(), reason: reason.to_string() };
        let cfg = self.cfg.ok_or_else(|| unsavable("an exact cache has no sparse state (save its KV as a cache entry)"))?;
        if !self.built || self.streaming() {
            return Err(unsavable("the index is not built yet (save after the prefill)"));
        }
        if let Some(e) = self.offload_failure() {
            return Err(unsavable(&e));
        }
        if meta.tokens.len() != self.len() {
            return Err(unsavable(&format!("{} tokens named for {} stored", meta.tokens.len(), self.len())));
        }
        // Sized up front (identity, shape, the tokens, the RAM tail, the sinks, each list's
        // length): one allocation, no transient of a growing buffer.
        let (held, sinks) =
            ((0..self.layers).map(|l| self.lens[l] - self.origin[l]).sum::<usize>(), self.off.as_deref().map_or(0, |o| o.sinks));
        let mut head = Vec::with_capacity(
            256 + meta.fingerprint.len()
                + meta.owner.len()
                + 4 * meta.tokens.len()
                + 4 * (held + sinks * self.layers) * self.heads * self.dim
                + 32 * self.layers * (self.heads + 1),
        );
        let mut e = Enc(&mut head);
        e.str(&meta.fingerprint);
        e.str(&meta.owner);
        e.u32s(&meta.tokens);
        for v in [self.layers, self.heads, self.dim] {
            e.len(v);
        }
        save_method(&mut e, cfg.method);
        for v in [cfg.budget, cfg.sinks, cfg.recent] {
            e.len(v);
        }
        e.lens(&self.lens);
        e.lens(&self.origin);
        let d = self.dim;
        for l in 0..self.layers {
            let held = self.lens[l] - self.origin[l];
            for h in 0..self.heads {
                let at = h * self.cap * d;
                e.f16s(&self.keys[l][at..at + held * d]);
                e.f16s(&self.values[l][at..at + held * d]);
            }
        }
        let mut kv = None;
        let (mut slots, mut mid) = (Vec::new(), Vec::new());
        e.bool(self.off.is_some());
        if let Some(off) = self.off.as_deref() {
            if off.cfg.layout != Layout::Append {
                return Err(unsavable("the dual-head layout rewrites rows in place: only the append layout is saved"));
            }
            let live = off.file.path();
            let reader = off.file.reader().map_err(|e| StateError::io(live, e))?;
            e.len(off.sinks);
            for l in 0..self.layers {
                e.f16s(&off.sink_k[l]);
                e.f16s(&off.sink_v[l]);
            }
            slots = off.slots.clone();
            let mut e = Enc(&mut mid);
            e.u64(off.written);
            e.u64(off.cfg.model_fingerprint);
            kv = Some(KvPart { reader, rows: off.file.rows() });
        }
        let index: Vec<(SharedIndex, Vec<u32>)> = self
            .index
            .iter()
            .map(|i| {
                let i = i.lock().expect("index lock");
                (i.0.clone(), i.1.clone())
            })
            .collect();
        let shared_bytes =
            slots.iter().map(|s| 8 + s.len() * 4).sum::<usize>() + index.iter().map(|(i, _)| 8 + i.saved_len()).sum::<usize>();
        Ok(StateSnapshot { dir: dir.to_path_buf(), head, slots, mid, kv, index, shared_bytes, tokens: meta.tokens.len() })
    }
}
