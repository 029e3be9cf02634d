//! One job submitted to the engine, seen from Python: its events arrive on a channel, and
//! every wait on it releases the GIL (other Python threads run, and their jobs batch with this
//! one in the engine) and wakes every [`SIGNAL_POLL`] to let Python handle signals: Ctrl-C
//! raises `KeyboardInterrupt` in the waiting thread and cancels the job.
//!
//! ```text
//!  Python thread --submit(Job)--> EngineHandle --> engine thread
//!        ^ recv (GIL released)                         | Sink::send(Event)
//!        +-------------- std channel ------------------+
//! ```
//! Invariant: once a [`Pending`] is dropped or cancelled, its sink reports closed, so the
//! engine stops the job before its next step (what it computed stays cached in its session).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engram_engine::{EngineHandle, Event, EventSink, FinishReason, Job, JobError, JobErrorKind, SubmitError, TokenLogprob};
use pyo3::prelude::*;

use crate::errors::{self, EngramError};

/// How often a wait wakes to run Python's signal handlers.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The engine's end of one job's channel.
struct Sink {
    tx: Sender<Event>,
    closed: Arc<AtomicBool>,
}

impl EventSink for Sink {
    fn send(&self, event: Event) -> bool {
        !self.closed.load(Relaxed) && self.tx.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }
}

/// A submitted job's events, in order: `Started`, `Text`s, then `Finished` (or one `Failed`).
pub struct Pending {
    rx: Mutex<Receiver<Event>>,
    closed: Arc<AtomicBool>,
    submitted: Instant,
}

/// A finished job: its text and counts.
pub struct Done {
    pub text: String,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Each generated token's log-probabilities (when the job asked for them).
    pub logprobs: Vec<TokenLogprob>,
    /// Milliseconds from the submission to the first text (`None`: no text).
    pub ttft_ms: Option<f64>,
}

impl Pending {
    /// Queues `job` on `engine`.
    pub fn submit(engine: &EngineHandle, job: Job) -> PyResult<Pending> {
        let (tx, rx) = mpsc::channel();
        let closed = Arc::new(AtomicBool::new(false));
        match engine.submit(job, Box::new(Sink { tx, closed: closed.clone() })) {
            Ok(()) => Ok(Pending { rx: Mutex::new(rx), closed, submitted: Instant::now() }),
            Err(e @ SubmitError::EngineDown) => Err(EngramError::new_err(format!("{e}; create a new Engine"))),
            Err(e @ SubmitError::Full { .. }) => Err(EngramError::new_err(e.to_string())),
        }
    }

    /// Stops the job before the engine's next step.
    pub fn cancel(&self) {
        self.closed.store(true, Relaxed);
    }

    /// The next event, waiting with the GIL released; `None` once the engine has dropped the
    /// job (after its last event). A signal handler's exception (`KeyboardInterrupt`) cancels
    /// the job and is returned.
    pub fn next(&self, py: Python<'_>) -> PyResult<Option<Event>> {
        let mut guard = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            // A `&mut` to the receiver crosses into the GIL-free closure (`Receiver` is `Send`,
            // not `Sync`).
            let rx: &mut Receiver<Event> = &mut guard;
            match py.detach(move || rx.recv_timeout(SIGNAL_POLL)) {
                Ok(e) => return Ok(Some(e)),
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
                Err(RecvTimeoutError::Timeout) => self.check_signals(py)?,
            }
        }
    }

    /// Waits for the whole job: its text and counts, or its failure as a Python exception.
    pub fn collect(&self, py: Python<'_>) -> PyResult<Done> {
        let mut guard = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let mut done = Done {
            text: String::new(),
            finish: FinishReason::Stop,
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            logprobs: Vec::new(),
            ttft_ms: None,
        };
        loop {
            let rx: &mut Receiver<Event> = &mut guard;
            let d = &mut done;
            let submitted = self.submitted;
            // Every event until the end, for at most `SIGNAL_POLL` per GIL release: a steady
            // stream of tokens must not keep Ctrl-C from being seen until the job ends.
            let until = std::time::Instant::now() + SIGNAL_POLL;
            let step = py.detach(move || loop {
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                match rx.recv_timeout(left) {
                    Ok(Event::Started { prompt_tokens, cached_tokens, .. }) => {
                        d.prompt_tokens = prompt_tokens;
                        d.cached_tokens = cached_tokens;
                    }
                    Ok(Event::Text(t)) => {
                        d.ttft_ms.get_or_insert_with(|| submitted.elapsed().as_secs_f64() * 1e3);
                        d.text.push_str(&t);
                    }
                    Ok(Event::Logprob(l)) => d.logprobs.push(l),
                    Ok(Event::Finished { finish, completion_tokens, .. }) => {
                        d.finish = finish;
                        d.completion_tokens = completion_tokens;
                        return Ok(true);
                    }
                    Ok(Event::Failed(e)) => return Err(e),
                    Err(RecvTimeoutError::Timeout) => return Ok(false),
                    Err(RecvTimeoutError::Disconnected) => return Err(dropped()),
                }
            });
            match step {
                Ok(true) => return Ok(done),
                Ok(false) => self.check_signals(py)?,
                Err(e) => return Err(errors::from_job(e)),
            }
        }
    }

    /// Runs Python's signal handlers; an exception from one cancels the job.
    fn check_signals(&self, py: Python<'_>) -> PyResult<()> {
        py.check_signals().inspect_err(|_| self.cancel())
    }
}

/// What a job the engine dropped without finishing it reports.
pub fn dropped() -> JobError {
    JobError { kind: JobErrorKind::Internal, message: "the engine stopped before the job finished".into() }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.cancel();
    }
}
