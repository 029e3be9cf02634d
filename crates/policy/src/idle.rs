//! [`IdleInterrupt`]: how background work learns that a job is waiting.
//!
//! Invariant: [`IdleInterrupt::requested`] only reads counters (one relaxed load each); it
//! never blocks and never changes what the work computes, only where it stops.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// What idle work asks between its own small steps (a decode step, a prefill chunk, a file):
/// whether a job was submitted since the idle hook began. When it says yes, the work stops at
/// that step boundary, keeps what it finished (or drops the unfinished rest whole) and returns,
/// so the job waits for at most one step of it, not a whole slice.
#[derive(Clone, Debug, Default)]
pub struct IdleInterrupt {
    counters: Vec<Arc<AtomicUsize>>,
}

impl IdleInterrupt {
    /// Never requested (benches and tools that run idle work alone).
    pub fn never() -> IdleInterrupt {
        IdleInterrupt::default()
    }

    /// Requested while `submitted` (jobs submitted and not yet finished; the engine's
    /// `pending` count, which is 0 whenever the idle hook starts) is above zero.
    pub fn on_submitted(submitted: Arc<AtomicUsize>) -> IdleInterrupt {
        IdleInterrupt { counters: vec![submitted] }
    }

    /// Also requested while `waiters` is above zero (e.g. request handlers waiting for a lock
    /// the idle work holds, counted by the policy that owns the lock).
    pub fn or_while(mut self, waiters: Arc<AtomicUsize>) -> IdleInterrupt {
        self.counters.push(waiters);
        self
    }

    /// Whether someone waits for the engine: stop at the next step boundary.
    pub fn requested(&self) -> bool {
        self.counters.iter().any(|c| c.load(Relaxed) > 0)
    }
}
