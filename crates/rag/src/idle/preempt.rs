//! [`StepClock`]: how an idle unit yields to user requests at once. A unit
//! asks the clock before every model step — each prefill chunk and each decode step, through
//! [`engram_engine::Generator::generate_until`] — and stops when the caller's `stop` says a
//! request is waiting; the clock also measures the longest stretch between two asks, which is
//! the longest a request could have waited for the unit.
//!
//! ```text
//!  unit:  plan (embed, retrieve) │ prefill chunk │ prefill chunk │ decode │ decode │ … │ store
//!  asks:                         ▲               ▲               ▲        ▲        ▲
//!  stop() true at an ask ─► the unit drops its unfinished KV and answer whole, stores nothing,
//!                           and is put back to run again later
//! ```
//! Invariant: asking never changes what a unit computes, only whether it finishes; a stopped
//! unit leaves the QA bank, the chunk KV tree and the unit queue as they were before it
//! (`tests/it/idle.rs::an_interrupted_unit_leaves_the_caches_as_before`).

use std::time::Instant;

/// Asks `stop` between a unit's steps and times the steps. See the module doc.
pub struct StepClock<'a> {
    stop: &'a mut dyn FnMut() -> bool,
    last: Instant,
    longest_ms: f64,
    stopped: bool,
}

impl<'a> StepClock<'a> {
    /// A clock whose unit starts now.
    pub fn new(stop: &'a mut dyn FnMut() -> bool) -> StepClock<'a> {
        StepClock { stop, last: Instant::now(), longest_ms: 0.0, stopped: false }
    }

    /// Ends the step running since the last ask and asks whether to stop (once it said yes,
    /// it keeps saying yes without asking again).
    pub fn should_stop(&mut self) -> bool {
        self.lap();
        if !self.stopped {
            self.stopped = (self.stop)();
        }
        self.stopped
    }

    /// Whether the unit was told to stop.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Ends the last step (the unit is done) and returns the longest step in milliseconds.
    pub fn finish(&mut self) -> f64 {
        self.lap();
        self.longest_ms
    }

    fn lap(&mut self) {
        let now = Instant::now();
        self.longest_ms = self.longest_ms.max((now - self.last).as_secs_f64() * 1e3);
        self.last = now;
    }
}
