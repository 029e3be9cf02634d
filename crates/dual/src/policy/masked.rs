//! [`DualStream`]'s masked turns on disk (`--masked-turns disk`): a turn a request's mask
//! leaves out (below the relevance threshold, not among the last `keep_last`) has its KV
//! written to a file by a background writer; once written, the ring drops its RAM copy (the
//! blocks go back to the pool). When a later message's mask keeps the turn again, its file is
//! read back (every entry check, checksum included) and its recorded moves replayed before the
//! view is built, so the request attends exactly what it would have attended with the turn in
//! RAM.
//!
//! ```text
//!  admit: mask ─▶ kept turns on disk read back (a bad or missing file: the turn dropped, logged)
//!         ─▶ view ─▶ masked turns in RAM queued for writing
//!  admit / retire / idle: finished writes taken ─▶ those turns' RAM dropped
//! ```
//! Two modes: with [`DualStream::with_masked_turns`] every masked turn is written at once (as
//! above); with [`DualStream::with_masked_turns_under_pressure`] masked turns stay in RAM and are
//! written only when RAM runs short (`make_room`, `policy/pressure.rs`). Either way a written
//! file is charged to the disk budget like the rings and streams (`policy/budget.rs`): past the
//! budget or its tenant's share, the least recently used masked files go, each dropping its turn
//! from the ring as a whole-turn eviction would.
//!
//! Invariant: answers with masked turns on disk equal answers with them in RAM, token for token
//! and logit for logit (`crates/dual/tests/it/masked_disk.rs`, `masked_pressure.rs`,
//! `dual_fuzz.rs`); a turn whose file cannot be read is dropped from its ring with a warning —
//! never attended with other bytes.

use std::collections::HashMap;
use std::time::Instant;

use engram_policy::{GaugeKind, PolicyGauge};

use super::DualStream;
use crate::masked_store::MaskedStore;
use crate::TurnMask;

/// The masked turns' writer, what each write in flight is for, and the files written.
pub(super) struct MaskedTurns {
    pub(super) store: MaskedStore,
    /// Ticket → (owner, thread, turn id, written to make room in RAM).
    pub(super) tickets: HashMap<u64, (String, String, u64, bool)>,
    /// Every masked turn written at once (`with_masked_turns`); otherwise only under RAM
    /// pressure.
    eager: bool,
    /// File name → (owner, thread, turn id) of every file a turn holds now (charged to the
    /// disk budget when there is one).
    pub(super) files: HashMap<String, (String, String, u64)>,
}

impl DualStream {
    /// Writes masked turns' KV to files in `dir` and drops their RAM copy, reading them back when
    /// a later message wants them (see the module doc). Only relevance masks mask turns, so this
    /// saves RAM only with [`DualStream::with_relevance`]. Errors: the directory or the writer
    /// thread.
    pub fn with_masked_turns(mut self, dir: impl Into<std::path::PathBuf>) -> std::io::Result<DualStream> {
        self.set_masked_turns(dir)?;
        Ok(self)
    }

    /// [`DualStream::with_masked_turns`] on a policy already built; on error masked turns stay
    /// in RAM.
    pub fn set_masked_turns(&mut self, dir: impl Into<std::path::PathBuf>) -> std::io::Result<()> {
        self.open_masked(dir.into(), true)
    }

    /// Keeps masked turns in RAM until RAM runs short: then [`ContextPolicy::make_room`]
    /// writes the masked-out turns of idle threads to files in `dir` (least recently admitted
    /// threads first) and drops their RAM copy before anything else is refused; they are read
    /// back, exactly, when a later message wants them. Errors as [`DualStream::with_masked_turns`].
    ///
    /// [`ContextPolicy::make_room`]: engram_policy::ContextPolicy::make_room
    pub fn with_masked_turns_under_pressure(mut self, dir: impl Into<std::path::PathBuf>) -> std::io::Result<DualStream> {
        self.set_masked_turns_under_pressure(dir)?;
        Ok(self)
    }

    /// [`DualStream::with_masked_turns_under_pressure`] on a policy already built; on error
    /// masked turns stay in RAM.
    pub fn set_masked_turns_under_pressure(&mut self, dir: impl Into<std::path::PathBuf>) -> std::io::Result<()> {
        self.open_masked(dir.into(), false)
    }

    /// Opens the masked turns' store in `dir`; `eager`: every masked turn written at once.
    fn open_masked(&mut self, dir: std::path::PathBuf, eager: bool) -> std::io::Result<()> {
        let store = MaskedStore::open(dir, &self.fingerprint(), &self.pool, self.model.config.vocab)?;
        self.masked = Some(MaskedTurns { store, tickets: HashMap::new(), eager, files: HashMap::new() });
        Ok(())
    }

    /// Whether masked turns go to disk (at once, or under RAM pressure).
    pub fn masks_on_disk(&self) -> bool {
        self.masked.is_some()
    }

    /// Waits for every masked turn's write queued so far, drops the RAM copies of those
    /// written and charges their files to the disk budget (tests, benches).
    pub fn flush_masked(&mut self) {
        if let Some(m) = &self.masked {
            m.store.flush();
        }
        self.adopt_masked();
        self.enforce_disk_budget();
    }

    /// Takes the finished writes: each written turn still waiting for its write leaves RAM and
    /// its file is charged to the disk budget (enforced by the caller); a failed write is a
    /// warning (the turn stays in RAM).
    pub(super) fn adopt_masked(&mut self) {
        let Some(m) = self.masked.as_mut() else { return };
        let reader = m.store.reader();
        for w in m.store.try_results() {
            let Some((owner, thread, id, pressure)) = m.tickets.remove(&w.ticket) else { continue };
            let file = match w.result {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!("thread {thread:?} of {owner:?}: a masked turn stays in RAM, its file is not written: {e}");
                    continue;
                }
            };
            let (bytes, name) = (file.bytes, file.name());
            let key = (owner, thread);
            let Some(t) = self.threads.get_mut(&key) else { continue };
            let ram = t.ring.turns().find(|x| x.id == id).and_then(|x| x.kv()).map_or(0, |kv| kv.num_bytes());
            if t.ring.finish_offload(id, w.ticket, file, reader.clone()) {
                self.stats.turns_offloaded += 1;
                self.stats.masked_bytes_written += bytes;
                if pressure {
                    self.stats.turns_offloaded_for_ram += 1;
                    self.stats.ram_bytes_offloaded += ram as u64;
                }
                if let Some(ledger) = self.ledger.as_mut() {
                    ledger.charge(&name, engram_policy::OwnerKey::tenant_of(&key.0), bytes, true);
                }
                m.files.insert(name, (key.0, key.1, id));
            }
        }
    }

    /// Stops charging the masked files deleted since the last call (their turns restored,
    /// evicted with their ring's oldest turns, or forgotten).
    pub(super) fn take_gone_masked(&mut self) {
        let Some(m) = self.masked.as_mut() else { return };
        for name in m.store.take_gone() {
            m.files.remove(&name);
            if let Some(ledger) = self.ledger.as_mut() {
                ledger.remove(&name);
            }
        }
    }

    /// Reads back the turns of `owner`'s `thread` that `mask` keeps and whose KV is on disk; a
    /// turn whose file is missing or damaged is dropped from the ring with a warning.
    pub(super) fn restore_masked(&mut self, owner: &str, thread: &str, mask: &TurnMask) {
        if self.masked.is_none() {
            return;
        }
        let key = (owner.to_string(), thread.to_string());
        let Some(t) = self.threads.get_mut(&key) else { return };
        for id in t.ring.wanted_on_disk(mask) {
            // Room for its blocks first: other idle threads' masked turns leave RAM if short.
            let len = self.threads[&key].ring.turns().find(|x| x.id == id).map_or(0, |x| x.tokens.len());
            self.free_ram(self.pool.bytes_for(len), Some(&key));
            let Some(t) = self.threads.get_mut(&key) else { return };
            let t0 = Instant::now();
            let bytes = t.ring.turns().find(|x| x.id == id).and_then(|x| x.kv_file_bytes()).unwrap_or(0);
            match t.ring.restore(id) {
                Ok(()) => {
                    self.stats.masked_turns_restored += 1;
                    self.stats.masked_restore_us += t0.elapsed().as_micros() as u64;
                    self.stats.masked_bytes_restored += bytes;
                }
                Err(e) => {
                    self.stats.masked_restore_failures += 1;
                    tracing::warn!("thread {thread:?} of {owner:?}: a masked turn's KV cannot be read back, the turn is dropped: {e}");
                    if let Err(e) = t.ring.remove(id) {
                        tracing::warn!("thread {thread:?} of {owner:?}: {e}");
                    }
                }
            }
        }
    }

    /// Queues the `masked` turns of `owner`'s `thread` that are in RAM for writing (none while
    /// the thread's ring restored from disk is unverified).
    pub(super) fn offload_masked(&mut self, owner: &str, thread: &str, masked: &[u64]) {
        if self.masked.as_ref().is_some_and(|m| m.eager) {
            self.queue_offloads(owner, thread, masked, false);
        }
    }

    /// Queues those of `ids` of `owner`'s `thread` that are in RAM, unpinned and not being
    /// written for writing (`pressure`: to make room in RAM); their KV bytes in RAM. Nothing
    /// while the thread's ring restored from disk is unverified.
    pub(super) fn queue_offloads(&mut self, owner: &str, thread: &str, ids: &[u64], pressure: bool) -> usize {
        let Some(m) = self.masked.as_mut() else { return 0 };
        let Some(t) = self.threads.get_mut(&(owner.to_string(), thread.to_string())) else { return 0 };
        // A ring restored from disk whose checksums are unverified: nothing of it is written.
        if t.pending.is_some() {
            return 0;
        }
        let mut bytes = 0;
        for &id in ids {
            let ticket = m.store.next_ticket();
            let Some((tokens, kv)) = t.ring.begin_offload(id, ticket) else { continue };
            bytes += kv.num_bytes();
            m.store.queue(ticket, owner, thread, tokens, kv);
            m.tickets.insert(ticket, (owner.to_string(), thread.to_string(), id, pressure));
        }
        bytes
    }

    /// `/metrics`' numbers of masked turns: on disk now (turns, bytes), turns' KV bytes in RAM,
    /// written and read back so far, failed reads.
    pub(super) fn masked_gauges(&self) -> Vec<PolicyGauge> {
        let (mut on_disk, mut disk_bytes, mut ram_bytes) = (0u64, 0u64, 0u64);
        for t in self.threads.values() {
            let (n, b) = t.ring.on_disk();
            on_disk += n as u64;
            disk_bytes += b;
            ram_bytes += t.ring.resident_bytes() as u64;
        }
        let gauge = |name, help, value| PolicyGauge { name, help, kind: GaugeKind::Gauge, value };
        let counter = |name, help, value| PolicyGauge { name, help, kind: GaugeKind::Counter, value };
        let s = &self.stats;
        vec![
            gauge("engram_ring_turn_bytes_in_ram", "Bytes of dual-stream ring turns' KV in RAM (blocks per turn).", ram_bytes),
            gauge("engram_masked_turns_on_disk", "Masked dual-stream turns whose KV is on disk, not in RAM.", on_disk),
            gauge("engram_masked_turn_bytes_on_disk", "Bytes of the files of masked dual-stream turns on disk.", disk_bytes),
            counter("engram_masked_turns_offloaded_total", "Masked dual-stream turns whose KV left RAM for disk.", s.turns_offloaded),
            counter(
                "engram_masked_turns_restored_total",
                "Masked dual-stream turns read back from disk when a later message wanted them.",
                s.masked_turns_restored,
            ),
            counter(
                "engram_masked_turn_restore_failures_total",
                "Masked dual-stream turns whose file could not be read back (the turn dropped from its ring).",
                s.masked_restore_failures,
            ),
            counter(
                "engram_masked_turns_evicted_for_disk_total",
                "Masked dual-stream turns dropped from their ring because their file was deleted to keep within the disk budget.",
                s.masked_turns_evicted_for_disk,
            ),
            counter(
                "engram_masked_turns_offloaded_for_ram_total",
                "Masked dual-stream turns of idle threads written to disk to make room in RAM.",
                s.turns_offloaded_for_ram,
            ),
        ]
    }
}
