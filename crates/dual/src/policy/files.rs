//! [`DualStream`]'s files (everything persisted survives a restart): each
//! user's persistent stream as an immutable entry file, written by a background writer and
//! mapped back; each thread's ring ([`RingStore`]), written as turns retire and restored at the
//! thread's first turn after a restart with its turn files' checksums running beside the
//! prefill ([`PendingRestore`], settled by `ContextPolicy::verify_restore`).
//!
//! ```text
//!  stream change ─▶ prefill (RAM) ─▶ snapshot queued ─▶ writer: temp file, fsync, rename, map back
//!                   threads fork the RAM KV ...           ... until adopted: every thread re-forks the map
//!  first turn after a restart: manifest + turn files opened (every check but the sums) ─▶ ring
//!                   view handed out with a PendingRestore ─▶ sums checked beside the prefill
//!                   ─▶ verify_restore: sound → kept; damaged → thread dropped, files deleted,
//!                      the job admitted again on an empty ring (a fresh thread's answer)
//! ```
//! Invariant: nothing computed on an unverified ring is kept (its ring is not saved until the
//! check passes; a failed check drops the thread and every turn computed on it), and a stream's
//! mapped KV replaces its RAM KV only when it is the same generation and tokens
//! (`crates/dual/tests/it/dual_persist.rs`, `dual_restore.rs`, `dual_files.rs`, `dual_fuzz.rs`).
//!
//! A state entry set (`DualStream::set_state`) on a thread whose restore is still being
//! verified by a running turn is remembered beside the ring: if the ring proves damaged, the
//! thread starts empty but for that state entry, set again on the fresh ring (the entry from
//! the damaged files is never kept); one set when no turn runs settles the restore itself first.

use std::ops::Range;

use crate::{stream_file_name, RingStore, StreamWrite, StreamWriter, TurnRing};
use engram_kv::{ChecksumCheck, SeqKv};
use engram_policy::PendingRestore;

use super::DualStream;

/// A thread's ring restored from disk at admission, its turn files' checksums still running:
/// what this policy puts in the [`PendingRestore`] it hands the scheduler. `id` tells this
/// restore from a later one of the same thread.
pub(super) struct RingRestore {
    pub(super) owner: String,
    pub(super) thread: String,
    pub(super) id: u64,
    pub(super) check: ChecksumCheck,
}

impl DualStream {
    /// Keeps each user's persistent stream as an immutable entry file in `dir`
    /// ([`crate::stream_file_name`]): written after every change by a background writer,
    /// then mapped back, so every thread attends one copy of it in the page cache (until the
    /// write lands, threads attend the stream in RAM); after a restart a stream is restored from
    /// its file (as far as it agrees with the stream's tokens) instead of prefilled. A damaged
    /// or foreign file is refused with a warning and the stream prefilled. Threads' rings are
    /// kept there too ([`RingStore`]): saved as their turns retire, restored at a thread's first
    /// turn after a restart. Errors: the directory cannot be created or a writer started.
    pub fn with_dir(mut self, dir: impl Into<std::path::PathBuf>) -> std::io::Result<DualStream> {
        self.set_dir(dir)?;
        Ok(self)
    }

    /// [`DualStream::with_dir`] on a policy already built; on error it stays in RAM only.
    pub fn set_dir(&mut self, dir: impl Into<std::path::PathBuf>) -> std::io::Result<()> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        let rings = RingStore::open(&dir, &self.fingerprint())?;
        let streams = StreamWriter::start(self.pool.clone(), self.model.config.vocab)?;
        (self.rings, self.streams, self.dir) = (Some(rings), Some(streams), Some(dir));
        Ok(())
    }

    /// Waits until every ring and stream queued for writing is on disk, and maps the written
    /// streams in (tests, benches, shutdown); the deletions the disk budget queues when they
    /// are charged land too.
    pub fn flush(&mut self) {
        for adopt in [true, false] {
            if let Some(r) = &self.rings {
                r.flush();
            }
            if let Some(w) = &self.streams {
                w.flush();
            }
            if adopt {
                self.adopt_written();
            }
        }
    }

    /// The cache fingerprint files of this policy carry (model and KV format).
    pub(super) fn fingerprint(&self) -> String {
        engram_kv::cache_fingerprint(self.model.fingerprint, self.pool.format())
    }

    /// Queues `owner`'s `thread` ring for writing (with `dir`), unless its restore is still
    /// unverified (nothing computed on it is kept before then; the turn that verifies it saves).
    pub(super) fn save_ring(&mut self, owner: &str, thread: &str) {
        let key = (owner.to_string(), thread.to_string());
        let (Some(rings), Some(t)) = (self.rings.as_mut(), self.threads.get(&key)) else { return };
        if t.pending.is_some() {
            return;
        }
        match rings.save(owner, thread, &t.ring, self.carry.get(&key).copied()) {
            Ok(bytes) => {
                self.stats.rings_saved += 1;
                self.charge_ring(owner, thread, bytes);
            }
            Err(e) => tracing::warn!("thread {thread:?} of {owner:?}: the ring is not saved (kept as last saved): {e}"),
        }
    }

    /// Puts the turns `owner`'s `thread` had before a restart into `ring` (fresh, on the
    /// current stream), moved to follow the stream if it changed length; returns the state
    /// entry's id and, when turns were restored, their count and the check of their files'
    /// checksums (still running). A refused ring is a warning and leaves `ring` empty.
    pub(super) fn restore_ring(
        &mut self,
        owner: &str,
        thread: &str,
        ring: &mut TurnRing,
        base: &SeqKv,
        masked: &[Range<usize>],
    ) -> (Option<u64>, Option<(usize, ChecksumCheck)>) {
        let Some(rings) = self.rings.as_mut() else { return (None, None) };
        let (restored, check) = match rings.load_unverified(owner, thread, &self.pool, self.model.config.vocab) {
            Ok(Some(r)) => r,
            Ok(None) => return (None, None),
            Err(e) => {
                self.stats.ring_files_refused += 1;
                tracing::warn!("thread {thread:?} of {owner:?}: its saved ring is not used, the thread starts empty: {e}");
                return (None, None);
            }
        };
        let (mut state, n) = (None, restored.turns.len());
        for t in restored.turns {
            let mut kv = t.kv;
            let next = ring.next_position();
            let pushed = if kv.position(0) != next { kv.move_slots(0..kv.len(), next, &self.model.config) } else { Ok(()) }
                .and_then(|_| ring.push(t.tokens, kv, t.embedding, t.pinned));
            if let Err(e) = pushed {
                tracing::warn!("thread {thread:?} of {owner:?}: its saved ring does not fit, the thread starts empty: {e}");
                // The checksum thread holds the turns' copy slots: let it finish before they go.
                let _ = check.wait();
                match self.open_ring(base, masked.to_vec()) {
                    Ok(empty) => *ring = empty,
                    Err(e) => tracing::warn!("thread {thread:?} of {owner:?}: {e}"),
                }
                return (None, None);
            }
            if t.pinned {
                state = ring.turns().last().map(|t| t.id);
            }
        }
        if let Some(c) = restored.carry {
            self.carry.insert((owner.to_string(), thread.to_string()), c);
        }
        (state, Some((n, check)))
    }

    /// Settles a ring restore handed out at admission: true when its turn files are sound (the
    /// thread keeps them and saves from now on); false when one is damaged: the thread is
    /// dropped with everything computed on it, its files deleted, and its next turn starts on an
    /// empty ring (never on the damaged one, even before the deletion lands).
    pub(super) fn settle_ring(&mut self, restore: PendingRestore) -> bool {
        // A session store's restore never comes from this policy: not ours to accept.
        let Ok(RingRestore { owner, thread, id, check }) = restore.into_inner::<RingRestore>() else { return false };
        let key = (owner, thread);
        let ours = self.threads.get(&key).and_then(|t| t.pending).filter(|(pending, _)| *pending == id);
        match (check.wait(), ours) {
            (Ok(()), Some((_, n))) => {
                let t = self.threads.get_mut(&key).expect("found above");
                (t.pending, t.state_while_pending) = (None, None);
                self.stats.rings_restored += 1;
                self.stats.turns_restored += n as u64;
                true
            }
            (Ok(()), None) => true,
            (Err(e), ours) => {
                tracing::warn!("thread {:?} of {:?}: its saved ring is damaged, the thread starts empty: {e}", key.1, key.0);
                self.stats.ring_files_refused += 1;
                if ours.is_some() {
                    let state = self.threads.remove(&key).and_then(|t| t.state_while_pending).filter(|s| !s.is_empty());
                    self.carry.remove(&key);
                    if let Some(r) = self.rings.as_mut() {
                        r.discard(&key.0, &key.1);
                    }
                    self.refused.insert(key.clone());
                    // The state entry set while the check ran: onto the fresh (empty) ring.
                    if let Some(tokens) = state {
                        if let Err(e) = self.set_state(&key.0, &key.1, tokens) {
                            tracing::warn!("thread {:?} of {:?}: the state entry is lost with the damaged ring: {e}", key.1, key.0);
                        }
                    }
                }
                false
            }
        }
    }

    /// Takes `user`'s stream KV from its file when the stream holds none (the first turn after
    /// a restart): the agreeing prefix mapped, the rest left to the prefill. A refused file is
    /// a warning (deleted when damaged); the stream is then prefilled. The file is read at most
    /// once a process (an admission and the prefill it waits on both ask).
    pub(super) fn restore_stream(&mut self, user: &str) {
        let Some(dir) = &self.dir else { return };
        let path = dir.join(stream_file_name(user));
        let fingerprint = self.fingerprint();
        let Some(u) = self.users.get_mut(user) else { return };
        if u.file_read || u.saved.is_some() || u.writing.is_some() || u.stream.kv().is_some() {
            return;
        }
        u.file_read = true;
        match u.stream.restore_from(&path, &self.pool, &fingerprint, user, self.model.config.vocab) {
            Ok(None) => {}
            Ok(Some(n)) => {
                self.stats.streams_restored += (n > 0) as u64;
                self.stats.stream_tokens_restored += n as u64;
                if n == u.stream.len() {
                    u.saved = Some(u.stream.generation());
                }
                let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
                self.charge_stream(user, bytes);
            }
            Err(e) => {
                self.stats.stream_files_refused += 1;
                tracing::warn!("{user:?}: the persistent stream's file is not used, the stream is prefilled: {e}");
                if e.is_corrupt() {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }

    /// Queues `user`'s stream for writing if its file does not hold (and is not being given)
    /// this generation yet: the engine thread only forks the KV; the writer writes, syncs and
    /// maps it back, and [`DualStream::adopt_written`] swaps the mapped KV in.
    pub(super) fn save_stream(&mut self, user: &str) {
        let (Some(dir), Some(writer)) = (&self.dir, &self.streams) else { return };
        let fingerprint = self.fingerprint();
        let Some(u) = self.users.get_mut(user) else { return };
        let generation = u.stream.generation();
        if u.stream.is_empty() || u.saved == Some(generation) || u.writing.is_some_and(|(_, g)| g == generation) {
            return;
        }
        let Some(snapshot) = u.stream.snapshot(&fingerprint, user) else { return };
        self.next_write += 1;
        u.writing = Some((self.next_write, generation));
        writer.write(StreamWrite { id: self.next_write, path: dir.join(stream_file_name(user)), snapshot });
        self.stats.streams_queued += 1;
    }

    /// Swaps in the streams the writer finished: a written file's mapped KV replaces its
    /// user's RAM KV when the stream is still that generation (its threads re-fork it at once);
    /// a failed write is a warning (the stream stays in RAM, written again at its next
    /// change).
    pub(super) fn adopt_written(&mut self) {
        let Some(writer) = &self.streams else { return };
        let (mut written, mut adopted) = (Vec::new(), Vec::new());
        for w in writer.try_results() {
            let Some((user, u)) = self.users.iter_mut().find(|(_, u)| u.writing.is_some_and(|(id, _)| id == w.id)) else { continue };
            match w.result {
                Ok(Some((bytes, mapped))) => {
                    u.writing = None;
                    if u.stream.adopt_read_back(w.generation, &w.tokens, mapped) {
                        u.saved = Some(w.generation);
                        self.stats.streams_saved += 1;
                        self.stats.stream_bytes_written += bytes;
                        adopted.push((user.clone(), w.generation));
                    }
                    written.push((user.clone(), bytes));
                }
                Ok(None) => u.writing = None,
                Err(e) => tracing::warn!("{user:?}: the persistent stream is not saved (kept in RAM): {e}"),
            }
        }
        // The user's threads on this generation re-fork the mapped stream now (the same tokens
        // and length: nothing moves), so the RAM copy is freed without waiting for their turns.
        for (user, generation) in adopted {
            let u = &self.users[&user];
            let (Some(kv), masked) = (u.stream.kv(), u.stream.masked_ranges()) else { continue };
            for ((o, thread), t) in self.threads.iter_mut().filter(|((o, _), t)| *o == user && t.generation == generation) {
                if let Err(e) = t.ring.rebase(kv.fork(kv.len()), masked.clone()) {
                    tracing::warn!("thread {thread:?} of {o:?}: still on the stream in RAM: {e}");
                }
            }
        }
        // The file holds what was written last, adopted or not.
        for (user, bytes) in written {
            self.charge_stream(&user, bytes);
        }
    }
}
