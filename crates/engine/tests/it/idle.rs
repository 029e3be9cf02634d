//! The idle hook: a policy's background work runs in slices while nothing waits, and a job
//! that arrives meanwhile waits at most one slice — counted, not timed: the slices that run
//! between a submission and its admission are at most one. The measured wait is printed.

use crate::common;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engram_context::{Checkout, SessionStore};
use engram_engine::{
    run_engine, Command, ContextPolicy, Event, EventSink, IdleInterrupt, Job, Metrics, Retired, SamplingParams, SchedulerConfig,
};
use engram_engine::{AdmitRequest, PolicyLayer};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

const SLICE: Duration = Duration::from_millis(15);

/// The default policy plus endless background work in `SLICE`-long slices, counted.
struct Busy {
    inner: SessionStore,
    slices: Arc<AtomicUsize>,
    /// The slice count when each job was admitted.
    admitted_at: Arc<Mutex<Vec<usize>>>,
}

impl PolicyLayer for Busy {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.admitted_at.lock().unwrap().push(self.slices.load(SeqCst));
        self.inner.admit(req)
    }
    fn retire(&mut self, r: Retired) {
        self.inner.retire(r)
    }
    fn idle_slice(&mut self, _interrupt: &engram_engine::IdleInterrupt) -> bool {
        let t = Instant::now();
        while t.elapsed() < SLICE {
            std::hint::spin_loop();
        }
        self.slices.fetch_add(1, SeqCst);
        true
    }
}

/// Records when `Started` arrives.
struct Started(Arc<Mutex<Option<Instant>>>, Arc<AtomicUsize>);

impl EventSink for Started {
    fn send(&self, e: Event) -> bool {
        match e {
            Event::Started { .. } => *self.0.lock().unwrap() = Some(Instant::now()),
            Event::Finished { .. } | Event::Failed(_) => {
                self.1.fetch_add(1, SeqCst);
            }
            Event::Text(_) | Event::Logprob(_) => {}
        }
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// The tiny fixture's model and a 64 MiB f32 pool for it (the tempdir holds its files).
fn tiny() -> (tempfile::TempDir, Arc<Model>, KvPool) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20);
    (dir, model, pool)
}

/// An engine thread over `policy`; returns its command sender and `pending` count.
fn start(
    model: &Arc<Model>,
    pool: KvPool,
    policy: impl ContextPolicy + 'static,
) -> (mpsc::Sender<Command>, Arc<AtomicUsize>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending) = (model.clone(), pending.clone());
        std::thread::spawn(move || {
            run_engine(&model, pool, SchedulerConfig::default(), Box::new(policy), Arc::new(Metrics::default()), pending, rx)
        })
    };
    (tx, pending, engine)
}

/// Submits a 2-token job for "t" (counted in `pending`); returns when it was sent.
fn submit(model: &Model, tx: &mpsc::Sender<Command>, pending: &AtomicUsize, sink: Started) -> Instant {
    let prompt = model.tokenizer.encode("def f(x):", true).unwrap().ids;
    let params = SamplingParams { max_tokens: 2, ignore_eos: true, ..Default::default() };
    let job = Job { add_special: true, ..common::job("t", &prompt, &params) };
    pending.fetch_add(1, SeqCst);
    let submitted = Instant::now();
    tx.send(Command::Submit(job, Box::new(sink), submitted)).unwrap();
    submitted
}

#[test]
fn a_job_arriving_during_idle_work_waits_at_most_one_slice() {
    let (_dir, model, pool) = tiny();
    let slices = Arc::new(AtomicUsize::new(0));
    let admitted_at = Arc::new(Mutex::new(Vec::new()));
    let policy =
        Busy { inner: SessionStore::new(pool.clone(), model.fingerprint), slices: slices.clone(), admitted_at: admitted_at.clone() };
    let (tx, pending, engine) = start(&model, pool, policy);
    let done = Arc::new(AtomicUsize::new(0));
    let mut waits = Vec::new();
    for round in 0..6 {
        // Let background work run, then arrive at some point inside a slice.
        std::thread::sleep(SLICE * 3 + Duration::from_millis(round * 4));
        let before = slices.load(SeqCst);
        assert!(before > 0, "background work ran while idle");
        let started = Arc::new(Mutex::new(None));
        let submitted = submit(&model, &tx, &pending, Started(started.clone(), done.clone()));
        // Counted from once the job is in the channel: slices that end while this thread is
        // still building the job (or is descheduled before the send) are not the job's wait.
        let sent = slices.load(SeqCst);
        while done.load(SeqCst) <= round as usize {
            std::thread::sleep(Duration::from_millis(1));
        }
        let at = *admitted_at.lock().unwrap().last().unwrap();
        let waited = at.saturating_sub(sent);
        assert!(waited <= 1, "round {round}: {waited} slices ran between the submission and the admission");
        waits.push(started.lock().unwrap().expect("started").duration_since(submitted));
    }
    drop(tx);
    // The engine keeps slicing while idle; with the sender gone it stops at the next pass.
    engine.join().unwrap();
    let worst = waits.iter().max().unwrap();
    eprintln!("slice {SLICE:?}: submission to Started, worst of {}: {worst:?} (all: {waits:?})", waits.len());
}

/// The default policy plus one slice of background work that would run for a minute, but
/// checks the interrupt between its 1 ms steps.
struct Long {
    inner: SessionStore,
    /// Slices begun, and slices that stopped because the interrupt was requested.
    entered: Arc<AtomicUsize>,
    interrupted: Arc<AtomicUsize>,
}

impl PolicyLayer for Long {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.inner.admit(req)
    }
    fn retire(&mut self, r: Retired) {
        self.inner.retire(r)
    }
    fn idle_slice(&mut self, interrupt: &IdleInterrupt) -> bool {
        self.entered.fetch_add(1, SeqCst);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if interrupt.requested() {
                self.interrupted.fetch_add(1, SeqCst);
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

#[test]
fn a_long_slice_stops_at_its_next_step_when_a_job_is_submitted() {
    let (_dir, model, pool) = tiny();
    let (entered, interrupted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let policy =
        Long { inner: SessionStore::new(pool.clone(), model.fingerprint), entered: entered.clone(), interrupted: interrupted.clone() };
    let (tx, pending, engine) = start(&model, pool, policy);
    let done = Arc::new(AtomicUsize::new(0));
    for round in 0..3 {
        // Wait until the engine is inside this round's long slice.
        while entered.load(SeqCst) <= round {
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = Arc::new(Mutex::new(None));
        let submitted = submit(&model, &tx, &pending, Started(started.clone(), done.clone()));
        while done.load(SeqCst) <= round {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Without the interrupt the job would wait out the minute-long slice.
        assert_eq!(interrupted.load(SeqCst), round + 1, "round {round}: the slice stopped for the job");
        eprintln!("round {round}: submission to Started {:?}", started.lock().unwrap().expect("started").duration_since(submitted));
    }
    drop(tx);
    // Nothing is submitted now: the last slice runs its minute unless the engine is dropped
    // first; the engine thread is detached rather than joined.
    drop(engine);
}

/// `LoneSequence::generate_until`: asked before every engine step (each prefill chunk, each
/// decode step); never stopped it is `generate`; stopped at the k-th ask it returns `None`
/// with the cache holding exactly the whole steps before it.
#[test]
fn a_generation_stops_at_the_step_its_hook_says() {
    let (_dir, model) = common::tiny();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20);
    let prompt = common::ids(&model, "def main(argv):\n    parser = build_parser()\n    args = parser.parse_args(argv)\n");
    let params = SamplingParams { max_tokens: 6, ..SamplingParams::default() };
    let full = engram_engine::LoneSequence::new(&model, &pool).generate(&prompt, &params, &mut |_| true).unwrap();
    let mut asks = 0;
    let mut g = engram_engine::LoneSequence::new(&model, &pool).with_prefill_chunk(8);
    let same = g
        .generate_until(&prompt, &params, &mut |_| true, &mut || {
            asks += 1;
            false
        })
        .unwrap()
        .expect("never stopped");
    assert_eq!(same.tokens, full.tokens);
    let chunks = prompt.len().div_ceil(8);
    assert_eq!(asks, chunks + full.tokens.len() - 1, "one ask per prefill chunk and per decode step after the first token");
    for k in 1..=asks {
        let mut n = 0;
        let mut g = engram_engine::LoneSequence::new(&model, &pool).with_prefill_chunk(8);
        let r = g
            .generate_until(&prompt, &params, &mut |_| true, &mut || {
                n += 1;
                n >= k
            })
            .unwrap();
        assert!(r.is_none(), "stopped at ask {k}");
        let held = if k <= chunks { ((k - 1) * 8).min(prompt.len()) } else { prompt.len() + (k - 1 - chunks) };
        assert_eq!((g.tokens().len(), g.kv().len()), (held, held), "ask {k}");
        assert_eq!(&g.tokens()[..held.min(prompt.len())], &prompt[..held.min(prompt.len())]);
    }
}
