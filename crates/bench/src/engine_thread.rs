//! `EngineThread`: the engine on its own thread for the benchmarks that drive the scheduler in
//! process one job at a time (`bench context`, `bench facts`' stall rounds). Dropping it lets the
//! engine finish and joins its thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use engram_engine::scheduler::Job;
use engram_engine::{ContextPolicy, EngineHandle, Metrics, SchedulerConfig};
use engram_kv::KvPool;
use engram_model::Model;

use crate::timed_sink::{Timed, TimedSink};

/// The engine running `policy` with the default scheduler configuration.
pub struct EngineThread {
    handle: Option<EngineHandle>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EngineThread {
    /// Starts the engine thread on `model` and `pool` with `policy`.
    pub fn start(model: &Arc<Model>, pool: &KvPool, policy: Box<dyn ContextPolicy>) -> EngineThread {
        let (handle, thread) =
            EngineHandle::start(model.clone(), pool.clone(), SchedulerConfig::default(), Arc::new(Metrics::default()), move |_, _| policy);
        EngineThread { handle: Some(handle), thread: Some(thread) }
    }

    /// The running engine's handle.
    pub fn handle(&self) -> &EngineHandle {
        self.handle.as_ref().expect("running until dropped")
    }

    /// Submits `job` and waits for its end: when it was submitted and what its events said (the
    /// engine thread's own timestamps). A failed job is an error.
    pub fn run(&self, job: Job) -> Result<(Instant, Timed)> {
        let sink = TimedSink::default();
        let submitted = Instant::now();
        self.handle().submit(job, Box::new(sink.clone()))?;
        loop {
            let t = sink.get();
            if let Some(e) = t.failed {
                bail!("a turn failed: {e}");
            }
            if t.end.is_some() {
                return Ok((submitted, t));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.handle.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
