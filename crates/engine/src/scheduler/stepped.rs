//! [`SteppedJob`]: one background job run through the engine's own step a few steps at a
//! time, on a model the caller owns (a summarizer model of its own), for callers whose work
//! must give way between steps (an idle hook). The job's engine lives on a thread of its own
//! between calls, so what it computed is kept; each [`SteppedJob::advance`] runs on that
//! thread while the caller waits, so the caller's thread and the job never compute at once.
//!
//! ```text
//!  start ─► thread: Engine (model, pool, lone policy) + the job started
//!  advance(n, interrupt) ─► up to n steps, stopping before a step once interrupt is requested
//!                        ◄─ Pending (steps made, tokens so far) | Done (the job's end)
//!  drop ─► the thread ends; the job's KV goes back to its pool
//! ```
//! Invariant: however the job was cut into calls, it makes the forward calls one uninterrupted
//! [`run_alone`](super::run_alone) of it makes, in the same order, so its result is the same
//! bit for bit.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use engram_kv::KvPool;
use engram_model::Model;
use engram_policy::{BackgroundDone, BackgroundJob, IdleInterrupt};

use super::alone::lone_engine;
use super::SchedulerConfig;
use crate::sampling::SamplingParams;

/// How far a call took the job.
pub enum Stepped {
    /// Not done: `steps` engine steps were made by this call (0 when interrupted at once);
    /// `generated` tokens were sampled so far (0 while the prompt is prefilled).
    Pending { steps: usize, generated: usize },
    /// Done: the job's end as a policy would hear it, after `steps` steps of this call.
    Done { done: BackgroundDone, steps: usize },
}

/// A background job advanced by calls (module doc).
pub struct SteppedJob {
    tx: Option<Sender<(usize, IdleInterrupt)>>,
    rx: Receiver<Result<Stepped, String>>,
    thread: Option<JoinHandle<()>>,
    finished: bool,
}

impl SteppedJob {
    /// Starts `job` on `model` with `params` (greedy with the job's `max_tokens` and `stop`
    /// when `None`) and `config.prefill_chunk` prompt tokens a step; nothing is computed
    /// before the first [`SteppedJob::advance`].
    pub fn start(
        model: Arc<Model>,
        pool: KvPool,
        config: SchedulerConfig,
        job: BackgroundJob,
        params: Option<SamplingParams>,
    ) -> SteppedJob {
        let (tx, commands) = mpsc::channel::<(usize, IdleInterrupt)>();
        let (reports, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("engram-stepped-job".into())
            .spawn(move || {
                let (mut engine, done) = lone_engine(&model, pool, config, job, params);
                for (max_steps, interrupt) in commands {
                    let mut steps = 0;
                    while !engine.active.is_empty() && steps < max_steps && !interrupt.requested() {
                        engine.step();
                        steps += 1;
                    }
                    let report = match engine.active.first() {
                        Some(s) => Stepped::Pending { steps, generated: s.out.generated().len() },
                        None => match done.lock().unwrap_or_else(|e| e.into_inner()).take() {
                            Some(done) => Stepped::Done { done, steps },
                            None => {
                                let _ = reports.send(Err("the job ended without an outcome".into()));
                                return;
                            }
                        },
                    };
                    let report = Ok(report);
                    let last = matches!(report, Ok(Stepped::Done { .. }));
                    if reports.send(report).is_err() || last {
                        return;
                    }
                }
            })
            .expect("spawning a thread");
        SteppedJob { tx: Some(tx), rx, thread: Some(thread), finished: false }
    }

    /// Runs at most `max_steps` engine steps of the job, stopping before any step once
    /// `interrupt` is requested; `Done` once (a later call is an error), `Pending` before.
    /// Errors: the job's engine stopped (a panic in its step), or the job was already done.
    pub fn advance(&mut self, max_steps: usize, interrupt: &IdleInterrupt) -> Result<Stepped, String> {
        if self.finished {
            return Err("the job has already ended".into());
        }
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send((max_steps, interrupt.clone())).is_ok());
        match sent.then(|| self.rx.recv().ok()).flatten() {
            Some(report) => {
                self.finished = !matches!(report, Ok(Stepped::Pending { .. }));
                report
            }
            None => {
                self.finished = true;
                Err("the job's engine stopped (it panicked)".into())
            }
        }
    }
}

impl Drop for SteppedJob {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop; its engine drops the job's KV.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
