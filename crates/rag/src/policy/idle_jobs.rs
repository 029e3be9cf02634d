//! Idle-time population as the engine's background work: [`TreePolicy`] runs the woken
//! tenants' units ([`crate::IdleTenants`]) one at a time, and a unit's model work (a chunk
//! prefill, an answer, an LLM prediction, a real answer) is a low-priority background job, so
//! it is batched with requests, fault-contained like them, and progresses within the engine's
//! background share while they keep arriving (at share 0 only while none runs).
//!
//! ```text
//!  next_background ─► tenant (round robin) ─► try_lock(Library) ─► unit runs to its model work:
//!                     no model work (a skip) ─► counted, next unit
//!                     model work             ─► put back, nothing stored ─► Low job (greedy)
//!  background_done ─► result kept for the tenant ─► the unit runs again, takes the result
//!                     (same prompt, length, stop) and stores what it computed ─► counted
//!  job failed (engine fault, model error) ─► the unit fails: logged, counted, tenant sleeps
//! ```
//! The engine thread never blocks on a library: one a handler holds is tried again at the
//! next ask. A result its unit no longer wants (a real query changed the plan meanwhile) is
//! dropped after a few.
//!
//! Invariant: a unit stores only what its own model work computed for the prompt it plans now
//! (results are matched by prompt tokens, length and stop texts), so idle time stores what the
//! same unit run alone stores (`crates/rag/tests/it/idle_jobs.rs`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use engram_engine::{run_alone, SchedulerConfig, Timings};
use engram_policy::{BackgroundDone, BackgroundJob, IdleInterrupt, OwnerKey, OwnerKind};

use super::{idle_budget, is_rag, warn, TreePolicy, BUDGET_NAP};
use crate::idle::preempt::EngineWork;
use crate::idle::{UnitReport, DEFAULT_IDLE_PREFILL_CHUNK};
use crate::idle_tenants::{try_library, IdleTenants};
use crate::run::{self, Key, Ran};

/// NOTE: a job's wall time is split between its prefill and decode by this cost ratio of a
/// decoded token to a prefilled one (the idle population's starting estimate): the engine
/// reports no per-phase times for background jobs.
const DECODE_TO_PREFILL_COST: f64 = 10.0;

/// The idle units' jobs. See the module doc.
#[derive(Default)]
pub(super) struct Units {
    next_tag: u64,
    running: Option<Running>,
    /// Per tenant: results of its jobs, and the work its last unit wanted.
    work: HashMap<String, EngineWork>,
    /// Units whose job ended and who have yet to take its result (their library was busy).
    to_finish: Vec<Finish>,
}

/// The job in flight.
struct Running {
    tag: u64,
    tenant: String,
    tree_dir: Option<PathBuf>,
    key: Key,
    started: Instant,
    /// Prompt tokens computed, tokens at most generated.
    prefill_tokens: usize,
    max_tokens: usize,
    /// Milliseconds the unit took on the engine thread before its job.
    unit_ms: f64,
}

/// A unit to finish with its job's result.
struct Finish {
    tenant: String,
    tree_dir: Option<PathBuf>,
    job_ms: f64,
    unit_ms: f64,
    /// Engine steps the job sat out while requests ran.
    held_steps: u64,
}

impl TreePolicy {
    /// The next idle unit's model work as a Low job, after finishing units whose jobs ended;
    /// `None` while one runs, while the budget rests, or when no unit needs the model now.
    pub(super) fn next_unit_job(&mut self) -> Option<BackgroundJob> {
        let idle = self.idle.clone()?;
        self.finish_units(&idle);
        if self.units.running.is_some() || !idle.any_pending() || idle_budget(&idle).is_some() {
            return None;
        }
        // One unit per ask: one that needs no model (a skip) is counted, and the next ask
        // (the engine's next pass) runs the next unit.
        {
            let next = idle.next()?;
            // A handler is planning or recording a query: asked again at the next pass.
            let mut lib = try_library(&next.library)?;
            let pool = self.pool.clone();
            let mut work = self.units.work.remove(&next.tenant).unwrap_or_default();
            let before = lib.idle.as_ref().map_or(0, |p| p.stats().predicted);
            let t = self.tree(&next.tenant, next.tree_dir.as_deref());
            let r = lib.idle_unit_in_engine(&pool, &mut t.tree, &mut work);
            t.dirty |= matches!(&r, Ok(Some(r)) if !r.interrupted);
            let predicted = lib.idle.as_ref().map_or(0, |p| p.stats().predicted) - before;
            drop(lib);
            let wanted = work.wanted.take();
            self.units.work.insert(next.tenant.clone(), work);
            let c = idle.counters();
            match r {
                Ok(Some(r)) if r.interrupted => {
                    c.predicted.fetch_add(predicted, Relaxed);
                    let req = wanted?;
                    self.units.next_tag += 1;
                    let tag = self.units.next_tag;
                    self.units.running = Some(Running {
                        tag,
                        tenant: next.tenant.clone(),
                        tree_dir: next.tree_dir.clone(),
                        key: req.key(),
                        started: Instant::now(),
                        prefill_tokens: req.prompt.len() - req.reused.min(req.prompt.len()),
                        max_tokens: req.params.max_tokens,
                        unit_ms: r.ms,
                    });
                    let owner = OwnerKey::new(&next.tenant, OwnerKind::Rag, "idle");
                    return Some(run::job(&pool, req, owner, tag));
                }
                Ok(Some(r)) => counted(&idle, &r, predicted, r.ms),
                Ok(None) => idle.sleep(&next.tenant),
                Err(e) => failed(&idle, &next.tenant, &e.to_string()),
            }
        }
        None
    }

    /// A job of an idle unit ended: its result kept for the unit, which is finished now (or
    /// at the next ask if its library is busy). `Err(done)` hands back any other job.
    pub(super) fn unit_done(&mut self, done: BackgroundDone) -> Result<(), BackgroundDone> {
        let ours = is_rag(&done.owner) && self.units.running.as_ref().is_some_and(|r| r.tag == done.tag);
        if !ours {
            return Err(done);
        }
        let run = self.units.running.take().expect("checked");
        let job_ms = run.started.elapsed().as_secs_f64() * 1e3;
        let result = done.outcome.map(|out| {
            let decoded = out.generated.len().min(run.max_tokens);
            let cost = run.prefill_tokens as f64 + DECODE_TO_PREFILL_COST * decoded as f64;
            let prefill_ms = if cost > 0.0 { job_ms * run.prefill_tokens as f64 / cost } else { job_ms };
            let timings = Timings {
                prompt_tokens: run.key_prompt_len(),
                cached_tokens: run.key_prompt_len() - run.prefill_tokens,
                prefill_ms,
                ttft_ms: prefill_ms,
                decode_tokens: out.generated.len(),
                decode_ms: job_ms - prefill_ms,
            };
            Ran::from_output(out, timings)
        });
        let held_steps = result.as_ref().map_or(0, |r| r.held_steps);
        self.units.work.entry(run.tenant.clone()).or_default().put(run.key, result);
        self.units.to_finish.push(Finish { tenant: run.tenant, tree_dir: run.tree_dir, job_ms, unit_ms: run.unit_ms, held_steps });
        if let Some(idle) = self.idle.clone() {
            self.finish_units(&idle);
        }
        Ok(())
    }

    /// Finishes the units whose jobs ended (those whose library is free now).
    fn finish_units(&mut self, idle: &IdleTenants) {
        let pending = std::mem::take(&mut self.units.to_finish);
        for f in pending {
            let Some(library) = idle.library(&f.tenant) else { continue };
            let Some(mut lib) = try_library(&library) else {
                self.units.to_finish.push(f);
                continue;
            };
            let pool = self.pool.clone();
            let mut work = self.units.work.remove(&f.tenant).unwrap_or_default();
            let before = lib.idle.as_ref().map_or(0, |p| p.stats().predicted);
            let t = self.tree(&f.tenant, f.tree_dir.as_deref());
            let r = lib.idle_unit_in_engine(&pool, &mut t.tree, &mut work);
            t.dirty |= matches!(&r, Ok(Some(r)) if !r.interrupted);
            let predicted = lib.idle.as_ref().map_or(0, |p| p.stats().predicted) - before;
            drop(lib);
            // Work wanted now is asked for again at the next pass (the unit is put back).
            work.wanted = None;
            self.units.work.insert(f.tenant.clone(), work);
            let c = idle.counters();
            match r {
                Ok(Some(r)) if r.interrupted => {
                    c.predicted.fetch_add(predicted, Relaxed);
                }
                Ok(Some(mut r)) => {
                    let own_ms = f.unit_ms + r.ms;
                    r.ms = own_ms + f.job_ms;
                    if f.held_steps > 0 {
                        // It yielded to requests (sat out steps past the background share).
                        c.interrupted.fetch_add(1, Relaxed);
                    }
                    // NOTE: a job that yielded was kept within the engine's background share;
                    // the idle budget counts only the unit's own time on the engine thread then.
                    let budget_ms = if f.held_steps > 0 { own_ms } else { r.ms };
                    counted(idle, &r, predicted, budget_ms);
                }
                Ok(None) => idle.sleep(&f.tenant),
                Err(e) => failed(idle, &f.tenant, &e.to_string()),
            }
        }
    }

    /// The idle hook's part, while nothing runs: the next unit's job runs alone here through
    /// the engine's step until it ends or `interrupt` says a job arrived (then it is dropped
    /// whole, counted as interrupted, and runs again later); else, while some tenant still has
    /// work that cannot start yet (its budget resting, its library in a handler's hands), a
    /// short nap. Whether idle work remains.
    pub(super) fn idle_wait(&mut self, interrupt: &IdleInterrupt) -> bool {
        let Some(idle) = self.idle.clone() else { return false };
        self.finish_units(&idle);
        if self.units.running.is_some() {
            // The engine runs it (a caller that hands out jobs by hand runs it itself).
            return false;
        }
        if let Some(job) = self.next_unit_job() {
            self.run_unit_alone(job, &interrupt.clone().or_while(idle.waiters()), &idle);
            return true;
        }
        if !self.units.to_finish.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
            return true;
        }
        if !idle.any_pending() {
            return false;
        }
        let nap = idle_budget(&idle).map_or(std::time::Duration::from_millis(1), |rest| rest.min(BUDGET_NAP));
        std::thread::sleep(nap);
        true
    }

    /// Runs an idle unit's job alone through the engine's step on this (the engine's) thread.
    fn run_unit_alone(&mut self, job: BackgroundJob, interrupt: &IdleInterrupt, idle: &IdleTenants) {
        let config = SchedulerConfig {
            prefill_chunk: DEFAULT_IDLE_PREFILL_CHUNK,
            background_chunk: DEFAULT_IDLE_PREFILL_CHUNK,
            ..SchedulerConfig::default()
        };
        let model = self.model.clone();
        match run_alone(&model, self.pool.clone(), config, job, None, &mut || interrupt.requested()) {
            Some(run) => {
                if let Err(done) = self.unit_done(run.done) {
                    drop(done);
                }
            }
            None => {
                // Stopped for a request: nothing kept; the unit (put back) asks again later.
                self.units.running = None;
                let c = idle.counters();
                c.interrupted.fetch_add(1, Relaxed);
                if let Some(since) = idle.waiting_since() {
                    let us = since.elapsed().as_micros() as u64;
                    c.yield_us.fetch_add(us, Relaxed);
                    c.longest_yield_us.fetch_max(us, Relaxed);
                }
            }
        }
    }
}

impl Running {
    fn key_prompt_len(&self) -> usize {
        self.key.prompt_len()
    }
}

/// Counts a finished unit (its budget charged `budget_ms`).
fn counted(idle: &IdleTenants, r: &UnitReport, predicted: u64, budget_ms: f64) {
    let c = idle.counters();
    let rest = idle.throttle().ran(budget_ms);
    c.rest_us.fetch_add(rest.as_micros() as u64, Relaxed);
    c.count(r, predicted);
}

/// A unit that failed: logged, counted, and its tenant sleeps until its next wake.
fn failed(idle: &IdleTenants, tenant: &str, e: &str) {
    warn(&format!("idle-time RAG work for a tenant stopped until its next request: {e}"));
    idle.counters().errors.fetch_add(1, Relaxed);
    idle.sleep(tenant);
}
