//! The HTTP side of the engine: [`EngineHandle`] starts the engine thread through
//! [`engram_engine::EngineHandle`] (the scheduler batches, admits, samples and streams),
//! holds each account's quota, and hands each request's events to its handler over a tokio
//! channel, with engine failures turned into [`ApiError`]s.
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

use std::sync::Arc;

#[cfg(test)]
use engram_engine::scheduler::Command;
use engram_engine::scheduler::{self as engine, EventSink, JobError, JobErrorKind};
use engram_engine::SubmitError;
use engram_kv::KvPool;
use engram_model::Model;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::quota::{Quota, Slot};

pub use engram_engine::scheduler::{Job, SchedulerConfig};

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

/// A cheap, cloneable handle to the engine thread ([`engram_engine::EngineHandle`], which
/// starts it and counts its jobs) with the per-account quota and the request's tokio channel.
/// The thread exits when the last handle is dropped and the running requests have finished.
#[derive(Clone)]
pub struct EngineHandle {
    inner: engram_engine::EngineHandle,
    /// Requests queued or running per account (`quota.rs`).
    quota: Arc<Quota>,
    pub metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Starts the engine thread with the context policy the server built (the session store,
    /// or dual-stream contexts, with any layers on top).
    pub fn start_with(
        model: Arc<Model>,
        pool: KvPool,
        config: SchedulerConfig,
        policy: Box<dyn engram_engine::ContextPolicy>,
        metrics: Arc<Metrics>,
    ) -> (EngineHandle, std::thread::JoinHandle<()>) {
        let quota = Quota::new(config.pending_per_tenant());
        let (inner, thread) = engram_engine::EngineHandle::start(model, pool, config, metrics.clone(), move |_, _| policy);
        (EngineHandle { inner, quota, metrics }, thread)
    }

    /// Starts the engine thread running `body` (a test's stand-in that dies, say) with the job
    /// counter and the command channel; `per_account` requests queued or running per account.
    #[cfg(test)]
    pub(crate) fn spawn(
        max_pending: usize,
        per_account: usize,
        metrics: Arc<Metrics>,
        body: impl FnOnce(Arc<std::sync::atomic::AtomicUsize>, std::sync::mpsc::Receiver<Command>) + Send + 'static,
    ) -> (EngineHandle, std::thread::JoinHandle<()>) {
        let (inner, thread) = engram_engine::EngineHandle::spawn(max_pending, metrics.clone(), body);
        (EngineHandle { inner, quota: Quota::new(per_account), metrics }, thread)
    }

    /// Whether the engine thread is still running (false after it died of a panic).
    pub fn is_alive(&self) -> bool {
        self.inner.is_alive()
    }

    /// Queues a request; its events arrive on the returned receiver. Dropping
    /// the receiver cancels the request.
    pub fn submit(&self, job: Job) -> Result<UnboundedReceiver<Event>, ApiError> {
        if !self.is_alive() {
            return Err(engine_down());
        }
        let slot = self.quota.take(job.owner.as_str())?;
        let (tx, rx) = unbounded_channel();
        match self.inner.submit(job, Box::new(Sink(tx, slot))) {
            Ok(()) => Ok(rx),
            Err(SubmitError::EngineDown) => Err(engine_down()),
            Err(e @ SubmitError::Full { .. }) => Err(ApiError::overloaded(e.to_string())),
        }
    }

    /// Drops the idle sessions of a tenant key.
    pub fn forget(&self, owner: engram_engine::OwnerKey) {
        self.inner.forget(owner)
    }

    /// Tells the engine its policy may have background work (`Command::Wake`): the idle hook
    /// runs once nothing waits.
    pub fn wake(&self) {
        self.inner.wake()
    }

    /// Sends a message to the context policy that takes its type (`Command::Control`: a
    /// dual-stream turn's anchors, facts and state entry), applied before any request submitted
    /// after it.
    pub fn control(&self, msg: engram_engine::PolicyControl) {
        self.inner.control(msg)
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
        let job = Job::from_tokens("t".into(), vec![1], Default::default());
        let e = handle.submit(job).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.code, Some("engine_down"));
        assert!(e.message.contains("engine thread has stopped"), "{}", e.message);
        assert_eq!(handle.inner.pending(), 0);
    }

    #[test]
    fn a_running_engine_is_alive() {
        let (handle, thread) = EngineHandle::spawn(4, 4, Arc::new(Metrics::default()), |_, rx| while rx.recv().is_ok() {});
        assert!(handle.is_alive());
        drop(handle);
        thread.join().unwrap();
    }
}
