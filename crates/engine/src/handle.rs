//! [`EngineHandle`]: the one way to run the engine on its own thread — the server, the
//! scenario runner and the benchmarks all start it here.
//!
//! ```text
//!  callers --submit(Job, sink)--> EngineHandle --Command--> engine thread (scheduler::run_engine)
//!             pending += 1                                     pending -= 1 as each job ends
//! ```
//! Invariants: `pending` counts the jobs submitted and not yet ended, incremented here and
//! decremented by the engine, so no caller keeps it by hand; a submission past `max_pending`
//! or to an engine thread that has ended (returned or panicked) is refused without queuing
//! anything; the thread ends once every handle is dropped and the running jobs have finished.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use engram_kv::KvPool;
use engram_model::Model;
use engram_policy::{ContextPolicy, OwnerKey, PolicyControl};

use crate::metrics::Metrics;
use crate::scheduler::{run_engine, Command, EventSink, Job, SchedulerConfig};

/// Why a submission was refused (nothing was queued).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The engine thread has ended (after a fault); it does not come back without a restart.
    EngineDown,
    /// `max_pending` jobs are already queued or running.
    Full { max_pending: usize },
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::EngineDown => write!(f, "the engine thread has stopped"),
            SubmitError::Full { max_pending } => write!(f, "{max_pending} requests are already queued or running; retry later"),
        }
    }
}

impl std::error::Error for SubmitError {}

/// A cheap, cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    pending: Arc<AtomicUsize>,
    max_pending: usize,
    /// False once the engine thread has ended (returned or panicked).
    alive: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

/// Held by the engine thread: marks the engine stopped when the thread ends, by return or by
/// unwinding from a panic.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Relaxed);
        if std::thread::panicking() {
            tracing::error!("the engine thread panicked; new requests are refused");
        }
    }
}

impl EngineHandle {
    /// Starts the engine thread on `model` with the context policy `policy` builds there from
    /// the model and the pool (a policy crate's constructor, a wrapper of it, or a policy of
    /// the caller's moved in).
    pub fn start(
        model: Arc<Model>,
        pool: KvPool,
        config: SchedulerConfig,
        metrics: Arc<Metrics>,
        policy: impl FnOnce(&Model, &KvPool) -> Box<dyn ContextPolicy> + Send + 'static,
    ) -> (EngineHandle, JoinHandle<()>) {
        let max_pending = config.max_pending;
        let m = metrics.clone();
        Self::spawn(max_pending, metrics, move |pending, rx| {
            let policy = policy(&model, &pool);
            run_engine(&model, pool, config, policy, m, pending, rx)
        })
    }

    /// Starts the engine thread running `body` (the engine loop, or a test's stand-in) with the
    /// job counter and the command channel.
    pub fn spawn(
        max_pending: usize,
        metrics: Arc<Metrics>,
        body: impl FnOnce(Arc<AtomicUsize>, Receiver<Command>) + Send + 'static,
    ) -> (EngineHandle, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let alive = Arc::new(AtomicBool::new(true));
        let handle = EngineHandle { tx, pending: pending.clone(), max_pending, alive: alive.clone(), metrics };
        let thread = std::thread::Builder::new()
            .name("engram-engine".into())
            .spawn(move || {
                let _alive = AliveGuard(alive);
                body(pending, rx)
            })
            .expect("spawning the engine thread");
        (handle, thread)
    }

    /// Whether the engine thread is still running (false after it died of a panic).
    pub fn is_alive(&self) -> bool {
        self.alive.load(Relaxed)
    }

    /// Jobs submitted and not yet ended.
    pub fn pending(&self) -> usize {
        self.pending.load(Relaxed)
    }

    /// The engine's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Queues `job`; its events go to `sink` (a sink that reports closed cancels it).
    pub fn submit(&self, job: Job, sink: Box<dyn EventSink>) -> Result<(), SubmitError> {
        if !self.is_alive() {
            return Err(SubmitError::EngineDown);
        }
        if self.pending.fetch_add(1, Relaxed) >= self.max_pending {
            self.pending.fetch_sub(1, Relaxed);
            return Err(SubmitError::Full { max_pending: self.max_pending });
        }
        if self.tx.send(Command::Submit(job, sink, Instant::now())).is_err() {
            self.pending.fetch_sub(1, Relaxed);
            // The receiver is gone only once the engine thread has ended.
            return Err(SubmitError::EngineDown);
        }
        Ok(())
    }

    /// Drops everything cached for `owner` (`Command::Forget`).
    pub fn forget(&self, owner: OwnerKey) {
        let _ = self.tx.send(Command::Forget(owner));
    }

    /// Tells the engine its policy may have background work (`Command::Wake`).
    pub fn wake(&self) {
        let _ = self.tx.send(Command::Wake);
    }

    /// Sends a message to the context policy that takes its type (`Command::Control`), applied
    /// before any job submitted after it.
    pub fn control(&self, msg: PolicyControl) {
        let _ = self.tx.send(Command::Control(msg));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Event;

    struct Quiet;

    impl EventSink for Quiet {
        fn send(&self, _event: Event) -> bool {
            true
        }
        fn is_closed(&self) -> bool {
            false
        }
    }

    fn job() -> Job {
        Job::from_tokens("t".into(), vec![1], Default::default())
    }

    #[test]
    fn submissions_past_max_pending_are_refused_and_not_counted() {
        let (keep, hold) = mpsc::channel::<()>();
        let (handle, thread) = EngineHandle::spawn(2, Arc::new(Metrics::default()), move |_, rx| {
            let _ = hold.recv();
            drop(rx);
        });
        assert_eq!(handle.submit(job(), Box::new(Quiet)), Ok(()));
        assert_eq!(handle.submit(job(), Box::new(Quiet)), Ok(()));
        assert_eq!(handle.submit(job(), Box::new(Quiet)), Err(SubmitError::Full { max_pending: 2 }));
        assert_eq!(handle.pending(), 2, "the refused one is not counted");
        drop(keep);
        thread.join().unwrap();
    }

    #[test]
    fn an_ended_engine_thread_refuses_jobs() {
        let (handle, thread) = EngineHandle::spawn(4, Arc::new(Metrics::default()), |_, _rx| panic!("injected engine fault"));
        assert!(thread.join().is_err());
        assert!(!handle.is_alive());
        assert_eq!(handle.submit(job(), Box::new(Quiet)), Err(SubmitError::EngineDown));
        assert_eq!(handle.pending(), 0);
    }
}
