//! The HTTP side of the engine: [`EngineHandle`] starts the engine thread
//! (`engram_engine::scheduler`, which batches, admits, samples and streams)
//! and hands each request's events to its handler over a tokio channel,
//! with engine failures turned into [`ApiError`]s.
//!
//! ```text
//!  handlers --Job--> EngineHandle --Command--> engine thread (engram-engine)
//!     ^                                              |
//!     +---- Event (Started, Text, Finished | Failed) +  per request, over its own channel
//! ```
//! Dropping a request's receiver cancels it before the engine's next step.
//!
//! The engine contains a panic in a step (its sequences fail, it goes on); should the thread
//! die anyway, [`EngineHandle::is_alive`] turns false, `/health` answers 503 and every new
//! request gets a 503 saying the engine has stopped.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use engram_engine::scheduler::{self as engine, Command, EventSink, JobError, JobErrorKind};
use engram_kv::KvPool;
use engram_model::Model;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::quota::{Quota, Slot};

pub use engram_engine::scheduler::{DiskConfig, Job, SchedulerConfig};

/// What a request hears back, in order: `Started`, any number of `Text`, then `Finished` or
/// `Failed` (as an [`ApiError`]: the KV budget ran out, the engine faulted) — or a single
/// `Failed` in place of `Started` when the request is refused.
pub type Event = engine::Event<ApiError>;

impl From<JobError> for ApiError {
    fn from(e: JobError) -> ApiError {
        match e.kind {
            JobErrorKind::BadRequest => ApiError::bad_request(e.message),
            JobErrorKind::NotFound => ApiError::not_found(e.message),
            JobErrorKind::Unavailable => ApiError::unavailable(e.message),
            JobErrorKind::Internal => ApiError::internal(e.message),
        }
    }
}

/// One request's channel, as the engine sees it, and its place in its account's quota
/// (given back when the engine drops the sink).
struct Sink(UnboundedSender<Event>, #[allow(dead_code)] Slot);

impl EventSink for Sink {
    fn send(&self, event: engine::Event) -> bool {
        self.0.send(event.map_err(ApiError::from)).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// A cheap, cloneable handle to the engine thread. The thread exits when the
/// last handle is dropped and the running requests have finished.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    pending: Arc<AtomicUsize>,
    max_pending: usize,
    /// Requests queued or running per account (`quota.rs`).
    quota: Arc<Quota>,
    /// False once the engine thread has ended (returned or panicked).
    alive: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
}

/// Held by the engine thread: marks the engine stopped when the thread ends, by return or
/// by unwinding from a panic.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Relaxed);
        if std::thread::panicking() {
            tracing::error!("the engine thread panicked; /health reports the engine down and new requests get 503");
        }
    }
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn start(
        model: Arc<Model>,
        pool: KvPool,
        config: SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> (EngineHandle, std::thread::JoinHandle<()>) {
        let (max_pending, per_account) = (config.max_pending, config.pending_per_tenant());
        Self::spawn(max_pending, per_account, metrics.clone(), move |pending, rx| {
            engine::run_engine(&model, pool, config, metrics, pending, rx)
        })
    }

    /// Starts the engine thread with a context policy of the caller's (dual-stream contexts).
    pub fn start_with(
        model: Arc<Model>,
        pool: KvPool,
        config: SchedulerConfig,
        policy: Box<dyn engram_engine::ContextPolicy>,
        metrics: Arc<Metrics>,
    ) -> (EngineHandle, std::thread::JoinHandle<()>) {
        let (max_pending, per_account) = (config.max_pending, config.pending_per_tenant());
        Self::spawn(max_pending, per_account, metrics.clone(), move |pending, rx| {
            engine::run_engine_with(&model, pool, config, policy, metrics, pending, rx)
        })
    }

    /// Starts the engine thread running `body` (the engine loop, or a test's stand-in that
    /// dies) with the job counter and the command channel; `per_account` requests queued or
    /// running per account.
    pub(crate) fn spawn(
        max_pending: usize,
        per_account: usize,
        metrics: Arc<Metrics>,
        body: impl FnOnce(Arc<AtomicUsize>, Receiver<Command>) + Send + 'static,
    ) -> (EngineHandle, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let alive = Arc::new(AtomicBool::new(true));
        let quota = Quota::new(per_account);
        let handle = EngineHandle { tx, pending: pending.clone(), max_pending, quota, alive: alive.clone(), metrics };
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

    /// Queues a request; its events arrive on the returned receiver. Dropping
    /// the receiver cancels the request.
    pub fn submit(&self, job: Job) -> Result<UnboundedReceiver<Event>, ApiError> {
        if !self.is_alive() {
            return Err(engine_down());
        }
        let slot = self.quota.take(&job.tenant)?;
        if self.pending.fetch_add(1, Relaxed) >= self.max_pending {
            self.pending.fetch_sub(1, Relaxed);
            return Err(ApiError::overloaded(format!("{} requests are already queued or running; retry later", self.max_pending)));
        }
        let (tx, rx) = unbounded_channel();
        if self.tx.send(Command::Submit(job, Box::new(Sink(tx, slot)), Instant::now())).is_err() {
            self.pending.fetch_sub(1, Relaxed);
            // The receiver is gone only once the engine thread has ended.
            return Err(engine_down());
        }
        Ok(rx)
    }

    /// Drops the idle sessions of a tenant key.
    pub fn forget(&self, tenant: String) {
        let _ = self.tx.send(Command::Forget(tenant));
    }

    /// Tells the engine its policy may have background work (`Command::Wake`): the idle hook
    /// runs once nothing waits.
    pub fn wake(&self) {
        let _ = self.tx.send(Command::Wake);
    }

    /// Sends a message to the context policy that takes its type (`Command::Control`: a
    /// dual-stream turn's anchors, facts and state entry), applied before any request submitted
    /// after it.
    pub fn control(&self, msg: engram_engine::PolicyControl) {
        let _ = self.tx.send(Command::Control(msg));
    }
}

/// What a request gets once the engine thread has died: a 503 that says so (not a KV-budget
/// "retry later": it will not come back without a restart).
fn engine_down() -> ApiError {
    ApiError {
        status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
        code: Some("engine_down"),
        retry_after: None,
        ..ApiError::internal("the engine thread has stopped after a fault; the server must be restarted")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_engine_thread_is_reported_and_refuses_jobs() {
        let (handle, thread) = EngineHandle::spawn(4, 4, Arc::new(Metrics::default()), |_, _rx| panic!("injected engine fault"));
        assert!(thread.join().is_err(), "the stand-in engine died");
        assert!(!handle.is_alive());
        let job = Job {
            tenant: "t".into(),
            session: None,
            text: None,
            add_special: false,
            prompt: vec![1],
            params: Default::default(),
            pinned: false,
        };
        let e = handle.submit(job).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.code, Some("engine_down"));
        assert!(e.message.contains("engine thread has stopped"), "{}", e.message);
        assert_eq!(handle.pending.load(Relaxed), 0);
    }

    #[test]
    fn a_running_engine_is_alive() {
        let (handle, thread) = EngineHandle::spawn(4, 4, Arc::new(Metrics::default()), |_, rx| while rx.recv().is_ok() {});
        assert!(handle.is_alive());
        drop(handle);
        thread.join().unwrap();
    }
}
