//! The thread that writes saved long conversations, so that a turn's end costs the engine
//! thread only a snapshot of the sparse state (`SparseKv::snapshot_state`): the offload
//! file's sync, the BLAKE3 of its rows, the link, the state and turn files and their fsyncs,
//! and the disk store's commit run here.
//!
//! ```text
//!  engine thread:  queue(Save | Remove) ──► [queue, per entry id: the newest operation's number] ──► writer thread
//!                  wait_for(owner)      ◄── notified as each operation ends
//! ```
//!
//! Invariant: operations on one entry are carried out in the order they were queued; a save
//! that a newer operation on the same entry replaced before it began writing (still queued, or
//! held at the start) is skipped, never half-written; the catalog of saved sessions gains an
//! entry only once its save committed, and only if no newer operation on it is pending, and
//! loses one as soon as its removal is queued; dropping the writer carries out every queued
//! operation first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use engram_kv::{DiskStore, PoolCharge};

use super::disk::{write_turn, Saved};
use crate::persist::StateSnapshot;

/// What an operation does to its entry.
pub(crate) enum Work {
    /// Writes the snapshot and the turn file into the entry's folder and commits it.
    Save {
        snapshot: StateSnapshot,
        saved: Saved,
        /// The pool charge of the snapshot's RAM, released when the save ends.
        charge: PoolCharge,
    },
    /// Deletes the entry.
    Remove,
}

/// One queued operation.
struct Op {
    number: u64,
    id: String,
    /// The entry's owner metadata (`<owner>/<session id>`).
    meta_owner: String,
    work: Work,
}

/// Counters of the writer since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SaveCounters {
    /// Saves asked for (every kept session's turn end): written, skipped, failed or pending.
    pub asked: u64,
    /// Saves committed to the disk store.
    pub saved: u64,
    /// Saves refused or failed (disk budget, tenant share, I/O, a cache that cannot be saved).
    pub failed: u64,
    /// Saves skipped because a newer save or a removal of the same entry replaced them first.
    pub skipped: u64,
    /// Turns that waited for an operation on their owner's saved sessions before resuming.
    pub waits: u64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Op>,
    /// Per entry id with an operation queued or running: the newest one's number and the
    /// owner (`OwnerKey::as_str`) and owner metadata of the entry.
    latest: HashMap<String, (u64, String, String)>,
    next: u64,
    /// Saved sessions, by entry id (module doc).
    catalog: HashMap<String, Saved>,
    holds: usize,
    closed: bool,
    counters: SaveCounters,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A view of the writer for whoever watches or pauses it (a test, an operator): what is
/// pending and what it did.
#[derive(Clone)]
pub struct SaveMonitor(Arc<Shared>);

/// While alive, the writer starts no operation's write (module doc of [`SaveMonitor::hold`]).
pub struct SaveHold(Arc<Shared>);

impl Drop for SaveHold {
    fn drop(&mut self) {
        self.0.lock().holds -= 1;
        self.0.changed.notify_all();
    }
}

impl SaveMonitor {
    /// Operations queued or running.
    pub fn pending(&self) -> usize {
        self.0.lock().latest.len()
    }

    /// The writer's counters.
    pub fn counters(&self) -> SaveCounters {
        self.0.lock().counters
    }

    /// Holds the writer: the operation it takes next waits, taken but not begun (a save in
    /// flight from the engine's view), until every hold is dropped or the writer closes.
    pub fn hold(&self) -> SaveHold {
        self.0.lock().holds += 1;
        SaveHold(self.0.clone())
    }

    /// Waits until no operation is queued or running.
    pub fn settle(&self) {
        let mut s = self.0.lock();
        while !s.latest.is_empty() {
            s = self.0.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The writer thread and its queue (module doc).
pub(crate) struct Writer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the writer over `store` with the saved sessions `catalog` already found there.
    /// `fingerprint` goes into each turn file written.
    pub fn start(store: Arc<Mutex<DiskStore>>, fingerprint: String, catalog: HashMap<String, Saved>) -> std::io::Result<Writer> {
        let shared = Arc::new(Shared { state: Mutex::new(State { catalog, ..State::default() }), changed: Condvar::new() });
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("engram-long-writer".into()).spawn(move || run(&s, &store, &fingerprint))?;
        Ok(Writer { shared, thread: Some(thread) })
    }

    /// The monitor of this writer.
    pub fn monitor(&self) -> SaveMonitor {
        SaveMonitor(self.shared.clone())
    }

    /// Runs `f` on the catalog of saved sessions.
    pub fn with_catalog<T>(&self, f: impl FnOnce(&mut HashMap<String, Saved>) -> T) -> T {
        f(&mut self.shared.lock().catalog)
    }

    /// Queues `work` on entry `id` of `owner` (`OwnerKey::as_str`) and owner metadata
    /// `meta_owner`. A save still queued for the entry is dropped (replaced); a removal takes
    /// the entry out of the catalog now.
    pub fn queue(&self, id: String, owner: &str, meta_owner: String, work: Work) {
        let mut s = self.shared.lock();
        let before = s.queue.len();
        s.queue.retain(|op| !(op.id == id && matches!(op.work, Work::Save { .. })));
        let replaced = (before - s.queue.len()) as u64;
        s.counters.skipped += replaced;
        if matches!(work, Work::Remove) {
            s.catalog.remove(&id);
        }
        s.next += 1;
        let number = s.next;
        s.latest.insert(id.clone(), (number, owner.to_string(), meta_owner.clone()));
        s.queue.push_back(Op { number, id, meta_owner, work });
        drop(s);
        self.shared.changed.notify_all();
    }

    /// Counts a save asked for, and whether it was refused before the writer (a failure).
    pub fn count_asked(&self, refused: bool) {
        let mut s = self.shared.lock();
        s.counters.asked += 1;
        s.counters.failed += u64::from(refused);
    }

    /// Entries with an operation pending, of `owner`: (id, owner metadata).
    pub fn pending_of(&self, owner: &str) -> Vec<(String, String)> {
        let s = self.shared.lock();
        s.latest.iter().filter(|(_, (_, o, _))| o == owner).map(|(id, (_, _, m))| (id.clone(), m.clone())).collect()
    }

    /// Waits until no operation on `owner`'s entries is pending; whether it had to wait
    /// (counted in [`SaveCounters::waits`]).
    pub fn wait_for(&self, owner: &str) -> bool {
        let mut s = self.shared.lock();
        let busy = |s: &State| s.latest.values().any(|(_, o, _)| o == owner);
        if !busy(&s) {
            return false;
        }
        s.counters.waits += 1;
        while busy(&s) {
            s = self.shared.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        true
    }

    /// Waits until no operation is queued or running.
    pub fn settle(&self) {
        self.monitor().settle()
    }

    /// Waits up to `timeout` for every operation to end; whether some are still pending.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let s = self.shared.lock();
        let (s, _) = self.shared.changed.wait_timeout_while(s, timeout, |s| !s.latest.is_empty()).unwrap_or_else(|e| e.into_inner());
        !s.latest.is_empty()
    }

    /// Operations queued or running.
    pub fn pending(&self) -> usize {
        self.shared.lock().latest.len()
    }

    /// The writer's counters.
    pub fn counters(&self) -> SaveCounters {
        self.shared.lock().counters
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The writer thread: takes each operation in order, carries it out unless replaced.
fn run(shared: &Shared, store: &Mutex<DiskStore>, fingerprint: &str) {
    loop {
        let op = {
            let mut s = shared.lock();
            loop {
                if let Some(op) = s.queue.pop_front() {
                    break op;
                }
                if s.closed {
                    return;
                }
                s = shared.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        let superseded = {
            let mut s = shared.lock();
            while s.holds > 0 && !s.closed {
                s = shared.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.latest.get(&op.id).is_none_or(|l| l.0 != op.number)
        };
        let Op { number, id, meta_owner, work } = op;
        let outcome = match work {
            Work::Save { .. } if superseded => Outcome::Skipped,
            Work::Save { snapshot, saved, charge } => {
                let r = save(store, fingerprint, &id, &meta_owner, snapshot, &saved);
                drop(charge);
                match r {
                    Ok(bytes) => {
                        tracing::debug!("saved a long conversation of {} tokens ({bytes} bytes on disk)", saved.history.tokens.len());
                        Outcome::Saved(Box::new(saved))
                    }
                    Err((e, committed_gone)) => {
                        tracing::warn!("a long conversation is not saved for a restart: {e}");
                        Outcome::Failed { gone: committed_gone }
                    }
                }
            }
            Work::Remove => {
                let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(e) = s.remove(&id, &meta_owner) {
                    tracing::warn!("deleting {id}: {e}");
                }
                let index = s.take_index();
                drop(s);
                if let Some(Err(e)) = index.map(engram_kv::IndexWrite::write) {
                    tracing::warn!("cache index not saved: {e}");
                }
                Outcome::Removed
            }
        };
        let mut s = shared.lock();
        let newest = s.latest.get(&id).is_some_and(|l| l.0 == number);
        match outcome {
            Outcome::Saved(saved) => {
                s.counters.saved += 1;
                if newest {
                    s.catalog.insert(id.clone(), *saved);
                }
            }
            Outcome::Failed { gone } => {
                s.counters.failed += 1;
                if gone {
                    s.catalog.remove(&id);
                }
            }
            Outcome::Skipped => s.counters.skipped += 1,
            Outcome::Removed => {}
        }
        if newest {
            s.latest.remove(&id);
        }
        drop(s);
        shared.changed.notify_all();
    }
}

enum Outcome {
    Saved(Box<Saved>),
    /// `gone`: the entry's folder was deleted (a commit the budget refused).
    Failed {
        gone: bool,
    },
    Skipped,
    Removed,
}

/// Writes one save into entry `id`'s folder and commits it; its bytes, or the error and
/// whether the entry is gone from the store.
fn save(
    store: &Mutex<DiskStore>,
    fingerprint: &str,
    id: &str,
    meta_owner: &str,
    snapshot: StateSnapshot,
    saved: &Saved,
) -> Result<u64, (String, bool)> {
    let lock = || store.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, existed) = {
        let mut s = lock();
        (s.begin_folder(id, meta_owner).map_err(|e| (e.to_string(), false))?, s.stats(id).is_some())
    };
    debug_assert_eq!(dir, snapshot.dir(), "a snapshot made for this entry's folder");
    let tokens = snapshot.tokens();
    let written = snapshot.write().map_err(|e| e.to_string()).and_then(|_| write_turn(&dir, fingerprint, saved));
    if let Err(e) = written {
        if !existed {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return Err((e, false));
    }
    let (bytes, index) = {
        let mut s = lock();
        let r = s.commit_folder(id, meta_owner, tokens);
        (r, s.take_index())
    };
    if let Some(Err(e)) = index.map(engram_kv::IndexWrite::write) {
        tracing::warn!("cache index not saved: {e}");
    }
    bytes.map_err(|e| (e.to_string(), true))
}
