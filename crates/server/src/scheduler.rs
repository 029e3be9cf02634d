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

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Instant;

use engram_engine::scheduler::{self as engine, Command, EventSink, JobError, JobErrorKind};
use engram_kv::KvPool;
use engram_model::Model;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;
use crate::metrics::Metrics;

pub use engram_engine::scheduler::{DiskConfig, Job, SchedulerConfig};

/// What a request hears back, in order: `Started`, any number of `Text`,
/// then `Finished` — or a single `Failed` (as an [`ApiError`]) before `Started`.
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

/// One request's channel, as the engine sees it.
struct Sink(UnboundedSender<Event>);

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
    pub metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn start(
        model: Arc<Model>,
        pool: KvPool,
        config: SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> (EngineHandle, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let handle = EngineHandle { tx, pending: pending.clone(), max_pending: config.max_pending, metrics: metrics.clone() };
        let thread = std::thread::Builder::new()
            .name("engram-engine".into())
            .spawn(move || engine::run_engine(&model, pool, config, metrics, pending, rx))
            .expect("spawning the engine thread");
        (handle, thread)
    }

    /// Queues a request; its events arrive on the returned receiver. Dropping
    /// the receiver cancels the request.
    pub fn submit(&self, job: Job) -> Result<UnboundedReceiver<Event>, ApiError> {
        if self.pending.fetch_add(1, Relaxed) >= self.max_pending {
            self.pending.fetch_sub(1, Relaxed);
            return Err(ApiError::overloaded(format!("{} requests are already queued or running; retry later", self.max_pending)));
        }
        let (tx, rx) = unbounded_channel();
        if self.tx.send(Command::Submit(job, Box::new(Sink(tx)), Instant::now())).is_err() {
            self.pending.fetch_sub(1, Relaxed);
            return Err(ApiError::unavailable("the engine is shutting down"));
        }
        Ok(rx)
    }

    /// Drops the idle sessions of a tenant key.
    pub fn forget(&self, tenant: String) {
        let _ = self.tx.send(Command::Forget(tenant));
    }
}
