//! Masked turns' files: a ring turn masked out of attention has its KV written, by a
//! background thread, as an `engram-kv` entry file (checksummed, fingerprinted, owner =
//! `owner/thread`, the turn's tokens), so the ring can drop its RAM copy; the file is read back,
//! with every check, when a later message's mask keeps the turn again.
//!
//! ```text
//!  <dir>/masked-<n>-<nanos>.safetensors     one turn's KV at its slots (positions: the ring's)
//!  queue(kv) ─▶ writer: temp file, fsync, rename ─▶ try_results: (ticket, file) ─▶ ring drops RAM
//!  read(file, tokens): map, every check (checksum too), blocks copied into RAM
//! ```
//! The files are a cache of RAM for this process only: [`MaskedStore::open`] deletes any a
//! previous process left (its rings are restored from the ring files, `RingStore`), and a file
//! is deleted when the turn that owns it is restored, evicted or forgotten; its name then comes
//! back from [`MaskedStore::take_gone`], so the disk budget stops charging it.
//!
//! Invariant: [`MaskedStore::read`] returns exactly the bytes written for that turn (same
//! owner and tokens, checksum passed) or an error naming the file; never other bytes.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use engram_kv::{read_entry, write_entry, EntryKind, EntryMeta, KvPool, SeqKv};

use crate::ring::TurnReader;
use crate::turn_kv::MaskedFile;

/// The start of every masked turn's file name (and of its temp file after a dot).
pub(crate) const FILE_PREFIX: &str = "masked-";

/// A write the writer thread finished: its ticket and the file (or why it failed).
pub(crate) struct Written {
    pub(crate) ticket: u64,
    pub(crate) result: Result<MaskedFile, String>,
}

enum Job {
    Write { ticket: u64, path: PathBuf, meta: EntryMeta, kv: SeqKv },
    Flush(Sender<()>),
}

/// The masked turns' directory and its writer thread. See the module doc.
pub(crate) struct MaskedStore {
    dir: PathBuf,
    fingerprint: String,
    pool: KvPool,
    vocab: usize,
    tx: Option<Sender<Job>>,
    done: Receiver<Written>,
    /// Names of this store's files deleted since the last `take_gone`.
    gone: Receiver<String>,
    writer: Option<JoinHandle<()>>,
    next: u64,
    /// Writes queued and not yet taken by `try_results`.
    pub(crate) in_flight: usize,
}

impl MaskedStore {
    /// A store in `dir` (created; files a previous process left deleted) for caches of
    /// `fingerprint` in `pool`, token ids below `vocab`. Errors: the directory or the thread.
    pub(crate) fn open(dir: impl Into<PathBuf>, fingerprint: &str, pool: &KvPool, vocab: usize) -> std::io::Result<MaskedStore> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        for e in std::fs::read_dir(&dir)?.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with(FILE_PREFIX) || name.strip_prefix('.').is_some_and(|n| n.starts_with(FILE_PREFIX)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let (tx, rx) = channel::<Job>();
        let (done_tx, done) = channel();
        let (gone_tx, gone) = channel();
        let writer = std::thread::Builder::new().name("engram-masked-writer".into()).spawn(move || {
            for job in rx {
                match job {
                    Job::Write { ticket, path, meta, kv } => {
                        let owner = meta.owner.clone();
                        let gone = Some(gone_tx.clone());
                        let result =
                            write_entry(&path, &meta, &kv).map(|bytes| MaskedFile { path, bytes, owner, gone }).map_err(|e| e.to_string());
                        // Its blocks go back to the pool before the policy hears of the file.
                        drop(kv);
                        if done_tx.send(Written { ticket, result }).is_err() {
                            return;
                        }
                    }
                    Job::Flush(ack) => {
                        let _ = ack.send(());
                    }
                }
            }
        })?;
        Ok(MaskedStore {
            dir,
            fingerprint: fingerprint.to_string(),
            pool: pool.clone(),
            vocab,
            tx: Some(tx),
            done,
            gone,
            writer: Some(writer),
            next: 0,
            in_flight: 0,
        })
    }

    /// The directory the files are in.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// A ticket for the next write (unique in this store).
    pub(crate) fn next_ticket(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Queues `kv` (a turn's `tokens` at slot positions) of `owner`'s `thread` for writing
    /// under `ticket` ([`MaskedStore::next_ticket`]). The engine thread only hands over the fork.
    pub(crate) fn queue(&mut self, ticket: u64, owner: &str, thread: &str, tokens: Vec<u32>, kv: SeqKv) {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path = self.dir.join(format!("{FILE_PREFIX}{ticket}-{nanos:x}.safetensors"));
        let meta = EntryMeta {
            fingerprint: self.fingerprint.clone(),
            kind: EntryKind::Session,
            owner: format!("{owner}/{thread}"),
            tokens,
            text: String::new(),
            offsets: Vec::new(),
            created_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        };
        if let Some(tx) = &self.tx {
            if tx.send(Job::Write { ticket, path, meta, kv }).is_ok() {
                self.in_flight += 1;
            }
        }
    }

    /// The writes finished since the last call.
    pub(crate) fn try_results(&mut self) -> Vec<Written> {
        let out: Vec<Written> = self.done.try_iter().collect();
        self.in_flight = self.in_flight.saturating_sub(out.len());
        out
    }

    /// Names of the files deleted since the last call (their turns restored, evicted or dropped).
    pub(crate) fn take_gone(&self) -> Vec<String> {
        self.gone.try_iter().collect()
    }

    /// Waits until every write queued so far is finished (its result then in `try_results`).
    pub(crate) fn flush(&self) {
        let (ack, wait) = channel();
        if let Some(tx) = &self.tx {
            if tx.send(Job::Flush(ack)).is_ok() {
                let _ = wait.recv();
            }
        }
    }

    /// How the ring reads a turn's file back (see [`MaskedStore::read`]).
    pub(crate) fn reader(&self) -> TurnReader {
        let (pool, fingerprint, vocab) = (self.pool.clone(), self.fingerprint.clone(), self.vocab);
        Arc::new(move |file: &MaskedFile, tokens: &[u32]| read(&file.path, &pool, &fingerprint, vocab, &file.owner, tokens))
    }
}

/// Reads the turn in `path` back: every entry check (checksum, model and format, token ids)
/// passed, its owner `owner` and its tokens `tokens`; the KV at its slot positions, its blocks
/// copied into RAM (charged to `pool`).
pub(crate) fn read(path: &Path, pool: &KvPool, fingerprint: &str, vocab: usize, owner: &str, tokens: &[u32]) -> Result<SeqKv, String> {
    let (meta, kv) = read_entry(path, pool, fingerprint, vocab).map_err(|e| e.to_string())?;
    if meta.owner != owner || meta.tokens != tokens || kv.len() != tokens.len() {
        return Err(format!("{}: holds another turn", path.display()));
    }
    Ok(kv)
}

impl Drop for MaskedStore {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        // Files written after their turn was gone: nothing owns them.
        for w in self.done.try_iter() {
            drop(w);
        }
    }
}
