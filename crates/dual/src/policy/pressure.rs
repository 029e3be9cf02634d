//! [`DualStream`] under RAM pressure: when the engine asks for room (`ContextPolicy::make_room`,
//! before it refuses or queues a request, and before a reservation fails) and the pool is short,
//! masked-out turns leave RAM for disk before anything else is given up.
//!
//! ```text
//!  make_room(bytes): fits? ─▶ writes already queued: taken, waited for ─▶ fits?
//!      ─▶ idle threads, least recently admitted first: the turns their last admission's mask
//!         left out, written (as many as the shortfall needs), waited for, RAM dropped ─▶ fits?
//! ```
//! Only threads with no turn running and no restore unverified give turns up, and only the turns
//! their last request did not attend: a running request never loses a block it reads, and a turn
//! written here is read back, exactly, when a later message's mask keeps it (`policy/masked.rs`).
//! Without a masked turns' directory (`with_masked_turns*`) nothing is freed: rings are bounded
//! by their capacity, and the answer is whether the bytes fit now.
//!
//! Invariant: answers after offloads under pressure equal answers with every turn in RAM, token
//! for token (`crates/dual/tests/it/masked_pressure.rs`).

use super::DualStream;

impl DualStream {
    /// Whether `bytes` more fit the pool's budget now.
    fn room_for(&self, bytes: usize) -> bool {
        self.pool.budget().saturating_sub(self.pool.used()) >= bytes
    }

    /// Frees RAM until `bytes` more fit the pool (see the module doc), never touching the
    /// thread `except` (the one being admitted); whether they fit. The files written are
    /// charged to the disk budget; the caller enforces it (after the admitted thread is marked
    /// running, so its own masked files are never the ones deleted).
    pub(super) fn free_ram(&mut self, bytes: usize, except: Option<&(String, String)>) -> bool {
        if self.room_for(bytes) || self.masked.is_none() {
            return self.room_for(bytes);
        }
        // Writes already queued: their turns' RAM goes once they land.
        self.adopt_masked();
        if self.masked.as_ref().is_some_and(|m| m.store.in_flight > 0) {
            self.flush_masked_writes();
        }
        // Rings queued for saving hold forks of their turns' blocks until written.
        if let Some(r) = &self.rings {
            r.flush();
        }
        if self.room_for(bytes) {
            return true;
        }
        let mut idle: Vec<(u64, (String, String))> = self
            .threads
            .iter()
            .filter(|(k, t)| Some(*k) != except && !self.running.contains_key(*k) && t.pending.is_none() && !t.last_masked.is_empty())
            .map(|(k, t)| (t.admitted, k.clone()))
            .collect();
        idle.sort();
        for (_, (owner, thread)) in idle {
            let short = bytes.saturating_sub(self.pool.budget().saturating_sub(self.pool.used()));
            let ids = self.threads[&(owner.clone(), thread.clone())].last_masked.clone();
            // Oldest turns first, as many as the shortfall needs.
            let mut queued = 0;
            for id in ids {
                if queued >= short {
                    break;
                }
                queued += self.queue_offloads(&owner, &thread, &[id], true);
            }
            if queued == 0 {
                continue;
            }
            self.flush_masked_writes();
            if self.room_for(bytes) {
                break;
            }
        }
        self.room_for(bytes)
    }

    /// Waits for the masked turns' writes queued so far and drops the RAM of those written.
    fn flush_masked_writes(&mut self) {
        if let Some(m) = &self.masked {
            m.store.flush();
        }
        self.adopt_masked();
    }
}
