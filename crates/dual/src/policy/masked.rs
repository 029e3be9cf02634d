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
//! Invariant: answers with masked turns on disk equal answers with them in RAM, token for token
//! and logit for logit (`crates/dual/tests/it/masked_disk.rs`, `dual_fuzz.rs`); a turn whose file
//! cannot be read is dropped from its ring with a warning — never attended with other bytes.

use std::collections::HashMap;
use std::time::Instant;

use engram_policy::{GaugeKind, PolicyGauge};

use super::DualStream;
use crate::masked_store::MaskedStore;
use crate::TurnMask;

/// The masked turns' writer and what each write in flight is for.
pub(super) struct MaskedTurns {
    store: MaskedStore,
    /// Ticket → (owner, thread, turn id).
    tickets: HashMap<u64, (String, String, u64)>,
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
        let store = MaskedStore::open(dir, &self.fingerprint(), &self.pool, self.model.config.vocab)?;
        self.masked = Some(MaskedTurns { store, tickets: HashMap::new() });
        Ok(())
    }

    /// Whether masked turns go to disk.
    pub fn masks_on_disk(&self) -> bool {
        self.masked.is_some()
    }

    /// Waits for every masked turn's write queued so far and drops the RAM copies of those
    /// written (tests, benches).
    pub fn flush_masked(&mut self) {
        if let Some(m) = &self.masked {
            m.store.flush();
        }
        self.adopt_masked();
    }

    /// Takes the finished writes: each written turn still waiting for its write leaves RAM; a
    /// failed write is a warning (the turn stays in RAM).
    pub(super) fn adopt_masked(&mut self) {
        let Some(m) = self.masked.as_mut() else { return };
        let reader = m.store.reader();
        for w in m.store.try_results() {
            let Some((owner, thread, id)) = m.tickets.remove(&w.ticket) else { continue };
            let file = match w.result {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!("thread {thread:?} of {owner:?}: a masked turn stays in RAM, its file is not written: {e}");
                    continue;
                }
            };
            let bytes = file.bytes;
            let Some(t) = self.threads.get_mut(&(owner, thread)) else { continue };
            if t.ring.finish_offload(id, w.ticket, file, reader.clone()) {
                self.stats.turns_offloaded += 1;
                self.stats.masked_bytes_written += bytes;
            }
        }
    }

    /// Reads back the turns of `owner`'s `thread` that `mask` keeps and whose KV is on disk; a
    /// turn whose file is missing or damaged is dropped from the ring with a warning.
    pub(super) fn restore_masked(&mut self, owner: &str, thread: &str, mask: &TurnMask) {
        if self.masked.is_none() {
            return;
        }
        let Some(t) = self.threads.get_mut(&(owner.to_string(), thread.to_string())) else { return };
        for id in t.ring.wanted_on_disk(mask) {
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
        let Some(m) = self.masked.as_mut() else { return };
        let Some(t) = self.threads.get_mut(&(owner.to_string(), thread.to_string())) else { return };
        // A ring restored from disk whose checksums are unverified: nothing of it is written.
        if t.pending.is_some() {
            return;
        }
        for &id in masked {
            let ticket = m.store.next_ticket();
            let Some((tokens, kv)) = t.ring.begin_offload(id, ticket) else { continue };
            m.store.queue(ticket, owner, thread, tokens, kv);
            m.tickets.insert(ticket, (owner.to_string(), thread.to_string(), id));
        }
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
        ]
    }
}
