//! [`StepClock`]: how an idle unit runs its model work and yields to user requests. A unit
//! hands its forward work to the clock ([`StepClock::run`]), which runs it one of two ways:
//!
//! - here (`Via::Here`): alone through the engine's step on this thread, asking the caller's
//!   `stop` before every model step — each prefill chunk and each decode step — and stopping
//!   when it says a request is waiting; the clock measures the longest stretch between two
//!   asks, the longest a request could have waited for the unit;
//! - in the engine (`Via::Engine`): the work's result is taken from [`EngineWork::ready`] when
//!   the engine has computed it; else the work is left in [`EngineWork::wanted`] (for the
//!   engine thread to run as a low-priority background job) and the unit stops as if told to,
//!   to be run again — the same work then finds its result — once the job has ended.
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

use engram_kv::KvPool;
use engram_model::Model;

use crate::error::{RagError, Result};
use crate::run::{self, Key, Ran, Request};

/// Where a unit's model work runs.
pub enum Via<'a> {
    /// Alone on this thread, `prefill_chunk` prompt tokens a step.
    Here { prefill_chunk: usize },
    /// As the engine thread's background job (see the module doc).
    Engine(&'a mut EngineWork),
}

/// Model work between a unit and the engine thread: results the engine computed, and the
/// work the last unit run wanted.
#[derive(Default)]
pub struct EngineWork {
    /// Results of earlier work (a failed job: why), oldest first.
    pub ready: Vec<(Key, std::result::Result<Ran, String>)>,
    /// The work a unit stopped for (at most one per run).
    pub wanted: Option<Request>,
}

/// Most results kept for units that did not come back for them.
const MAX_READY: usize = 4;

impl EngineWork {
    /// Keeps the result of work `key` (dropping the oldest past a few).
    pub fn put(&mut self, key: Key, result: std::result::Result<Ran, String>) {
        self.ready.retain(|(k, _)| *k != key);
        self.ready.push((key, result));
        if self.ready.len() > MAX_READY {
            drop(self.ready.remove(0));
        }
    }
}

/// Asks `stop` between a unit's steps and times the steps. See the module doc.
pub struct StepClock<'a> {
    stop: &'a mut dyn FnMut() -> bool,
    started: Instant,
    last: Instant,
    longest_ms: f64,
    stopped: bool,
    via: Via<'a>,
}

impl<'a> StepClock<'a> {
    /// A clock whose unit starts now and runs its work here, `prefill_chunk` tokens a step.
    pub fn new(stop: &'a mut dyn FnMut() -> bool, prefill_chunk: usize) -> StepClock<'a> {
        StepClock::via(stop, Via::Here { prefill_chunk })
    }

    /// A clock whose unit starts now and runs its work `via`.
    pub fn via(stop: &'a mut dyn FnMut() -> bool, via: Via<'a>) -> StepClock<'a> {
        let now = Instant::now();
        StepClock { stop, started: now, last: now, longest_ms: 0.0, stopped: false, via }
    }

    /// When the unit started (the clock's creation): its steps all lie after it.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Runs `req` (see the module doc); `None` when the unit must stop (told to, or waiting
    /// for the engine), having kept nothing.
    pub fn run(&mut self, model: &Model, pool: &KvPool, req: Request) -> Result<Option<Ran>> {
        if self.stopped {
            return Ok(None);
        }
        match &mut self.via {
            Via::Here { prefill_chunk } => {
                let chunk = *prefill_chunk;
                // The clock is lent to the run: it asks before every step.
                let mut ask = || self.should_stop();
                run::alone(model, pool, req, chunk, &mut ask)
            }
            Via::Engine(work) => {
                let key = req.key();
                if let Some(i) = work.ready.iter().position(|(k, _)| *k == key) {
                    return match work.ready.remove(i).1 {
                        Ok(ran) => Ok(Some(ran)),
                        Err(e) => Err(RagError::Model(e)),
                    };
                }
                work.wanted = Some(req);
                self.stopped = true;
                Ok(None)
            }
        }
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
