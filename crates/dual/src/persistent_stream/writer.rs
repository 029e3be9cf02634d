//! The persistent streams' file writer: a background thread that writes each
//! stream's file ([`StreamSnapshot::write_and_read_back`]) and hands the KV read back from it
//! (checked) to the engine thread, which never waits for a write, an fsync or a read-back; the
//! stream keeps its own KV until the caller adopts that one ([`crate::PersistentStream::adopt_read_back`]).
//!
//! ```text
//!  engine thread:  snapshot (fork) ─▶ queue ─▶ writer: write temp, fsync, rename, read back, check
//!                  try_results() ◀──────────────────── StreamWritten { id, KV read back | error }
//! ```
//! Invariant: jobs are carried out in the order queued (a deletion after a write leaves no
//! file); a write superseded by a later write or deletion of the same path queued before it
//! started is skipped (reported as such), so a burst of facts costs one write; each file is
//! replaced atomically, so a crash leaves the old file or none, and a torn one never passes the
//! restore's checks. [`StreamWriter::flush`] returns once everything queued is done.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use engram_kv::{KvPool, SeqKv};

use super::{StreamFileError, StreamSnapshot};

/// One stream file to write: the caller's `id` for it, where, and what.
pub struct StreamWrite {
    /// Chosen by the caller to match the result to its request.
    pub id: u64,
    pub path: PathBuf,
    pub snapshot: StreamSnapshot,
}

/// What became of a [`StreamWrite`]: its id, its snapshot's generation and tokens, and the
/// bytes written and the file's mapped KV, or why not (`Ok(None)`: superseded, not written).
pub struct StreamWritten {
    pub id: u64,
    pub generation: u64,
    pub tokens: Vec<u32>,
    pub result: Result<Option<(u64, SeqKv)>, StreamFileError>,
}

enum Job {
    Write(StreamWrite),
    Delete(PathBuf),
    Flush(Sender<()>),
}

/// The writer thread and its channels. See the module doc.
pub struct StreamWriter {
    tx: Option<Sender<Job>>,
    done: Receiver<StreamWritten>,
    writer: Option<JoinHandle<()>>,
}

impl StreamWriter {
    /// Starts the writer for caches of `pool` and token ids below `vocab`. Errors: the thread.
    pub fn start(pool: KvPool, vocab: usize) -> std::io::Result<StreamWriter> {
        let (tx, rx) = channel::<Job>();
        let (done_tx, done) = channel();
        let writer = std::thread::Builder::new().name("engram-stream-writer".into()).spawn(move || {
            while let Ok(first) = rx.recv() {
                // Everything queued now, so a write that a later job supersedes is skipped.
                let mut batch = vec![first];
                batch.extend(rx.try_iter());
                run_batch(batch, &pool, vocab, &done_tx);
            }
        })?;
        Ok(StreamWriter { tx: Some(tx), done, writer: Some(writer) })
    }

    /// Queues a write; returns at once.
    pub fn write(&self, job: StreamWrite) {
        self.send(Job::Write(job));
    }

    /// Queues the deletion of `path`, after every write queued before.
    pub fn delete(&self, path: PathBuf) {
        self.send(Job::Delete(path));
    }

    /// The writes finished since the last call, in order (never waits).
    pub fn try_results(&self) -> Vec<StreamWritten> {
        self.done.try_iter().collect()
    }

    /// Waits until everything queued so far is done (its results then in [`Self::try_results`]).
    pub fn flush(&self) {
        let (tx, rx) = channel();
        self.send(Job::Flush(tx));
        let _ = rx.recv();
    }

    fn send(&self, job: Job) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Carries out `batch` in order, skipping writes a later write or deletion of the same path
/// supersedes before the next flush.
fn run_batch(batch: Vec<Job>, pool: &KvPool, vocab: usize, done: &Sender<StreamWritten>) {
    let path_of = |j: &Job| match j {
        Job::Write(w) => Some(w.path.clone()),
        Job::Delete(p) => Some(p.clone()),
        Job::Flush(_) => None,
    };
    let paths: Vec<Option<PathBuf>> = batch.iter().map(path_of).collect();
    for (i, job) in batch.into_iter().enumerate() {
        match job {
            Job::Write(w) => {
                // Not past a flush: what was queued before it is done when it returns.
                let superseded = paths[i + 1..].iter().take_while(|p| p.is_some()).any(|p| p.as_ref() == Some(&w.path));
                let (id, generation, tokens) = (w.id, w.snapshot.generation, w.snapshot.meta.tokens.clone());
                let result = if superseded { Ok(None) } else { w.snapshot.write_and_read_back(&w.path, pool, vocab).map(Some) };
                let _ = done.send(StreamWritten { id, generation, tokens, result });
            }
            Job::Delete(p) => {
                let _ = std::fs::remove_file(p);
            }
            Job::Flush(tx) => {
                let _ = tx.send(());
            }
        }
    }
}
