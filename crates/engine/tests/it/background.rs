//! Background jobs: forward work a policy asks the engine for runs through the engine's own
//! step — its result equals a request's with the same prompt, a prefill's KV equals a cold
//! prefill's, low-priority work stays within its share of the rows while requests run (and
//! still advances), a blocking job holds its session's next request, and a forgotten owner's
//! jobs end with an error.

use crate::common::{self, Collect};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use engram_context::SessionStore;
use engram_engine::ContextPolicy;
use engram_engine::{
    run_engine, AdmitRequest, BackgroundDone, BackgroundJob, BackgroundPriority, Checkout, Command, Event, EventSink, MatchKind, Metrics,
    OwnerKey, PolicyLayer, SamplingParams, SchedulerConfig,
};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

/// What a finished job handed back (tokens, generated text, the KV) or its error.
type Done = (u64, Result<(Vec<u32>, String, SeqKv), String>);

/// The session store plus a queue of background jobs; records each job's end and, in order,
/// the admissions and ends it sees.
struct Asker {
    inner: SessionStore,
    queue: VecDeque<BackgroundJob>,
    done: Arc<Mutex<Vec<Done>>>,
    log: Arc<Mutex<Vec<String>>>,
}

impl PolicyLayer for Asker {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.log.lock().unwrap().push(format!("admit {}", req.session.unwrap_or("-")));
        self.inner.admit(req)
    }
    fn next_background(&mut self) -> Option<BackgroundJob> {
        self.queue.pop_front()
    }
    fn background_done(&mut self, d: BackgroundDone) {
        self.log.lock().unwrap().push(format!("done {}", d.tag));
        self.done.lock().unwrap().push((d.tag, d.outcome.map(|o| (o.tokens, o.text, o.kv))));
    }
}

/// A background job for "bg" that starts from nothing.
fn job(pool: &KvPool, tag: u64, prompt: &[u32], max_tokens: usize, priority: BackgroundPriority, session: &str) -> BackgroundJob {
    let n = prompt.len();
    BackgroundJob {
        owner: OwnerKey::parse("bg"),
        tag,
        start: Checkout::own(session.into(), MatchKind::Miss, prompt.to_vec(), vec![0; n], 0, SeqKv::new(pool)),
        max_tokens,
        stop: Vec::new(),
        priority,
        hidden: Vec::new(),
    }
}

/// An engine over an [`Asker`]: built first, so commands can be queued before its thread
/// starts (its first pass then sees them together), then run.
struct Engine {
    tx: mpsc::Sender<Command>,
    pending: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    done: Arc<Mutex<Vec<Done>>>,
    log: Arc<Mutex<Vec<String>>>,
    start: Option<Box<dyn FnOnce() + Send>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Engine {
    fn new(model: &Arc<Model>, pool: &KvPool, config: SchedulerConfig, queue: Vec<BackgroundJob>) -> Engine {
        let (tx, rx) = mpsc::channel();
        let (pending, metrics) = (Arc::new(AtomicUsize::new(0)), Arc::new(Metrics::default()));
        let (done, log) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let policy =
            Asker { inner: SessionStore::new(pool.clone(), model.fingerprint), queue: queue.into(), done: done.clone(), log: log.clone() };
        let start = {
            let (model, pool, pending, metrics) = (model.clone(), pool.clone(), pending.clone(), metrics.clone());
            Box::new(move || run_engine(&model, pool, config, Box::new(policy), metrics, pending, rx)) as Box<dyn FnOnce() + Send>
        };
        Engine { tx, pending, metrics, done, log, start: Some(start), thread: None }
    }

    fn run(mut self) -> Engine {
        let start = self.start.take().expect("started once");
        self.thread = Some(std::thread::spawn(start));
        self
    }

    fn submit(&self, owner: &str, session: Option<&str>, prompt: &[u32], params: &SamplingParams, sink: impl EventSink + 'static) {
        let job = engram_engine::Job { session: session.map(String::from), ..common::job(owner, prompt, params) };
        self.pending.fetch_add(1, Relaxed);
        self.tx.send(Command::Submit(job, Box::new(sink), Instant::now())).unwrap();
    }

    /// Waits for the engine to finish everything, then returns what the policy heard.
    fn finish(self) -> (Vec<Done>, Vec<String>, Arc<Metrics>) {
        drop(self.tx);
        self.thread.expect("running").join().unwrap();
        let done = std::mem::take(&mut *self.done.lock().unwrap());
        let log = self.log.lock().unwrap().clone();
        (done, log, self.metrics)
    }
}

fn pool_for(model: &Model) -> KvPool {
    KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20)
}

#[test]
fn a_background_generation_equals_a_request_with_the_same_prompt() {
    let (_dir, model) = common::tiny();
    let pool = pool_for(&model);
    let prompt = model.tokenizer.encode("def add(a, b):", true).unwrap().ids;
    let bg = job(&pool, 7, &prompt, 12, BackgroundPriority::Low, "summary");
    let engine = Engine::new(&model, &pool, SchedulerConfig::default(), vec![bg]);
    let sink = Collect::default();
    let params = SamplingParams { max_tokens: 12, ..Default::default() };
    engine.submit("user", None, &prompt, &params, sink.clone());
    let (done, _, metrics) = engine.run().finish();
    let (text, _) = sink.outcome();
    assert_eq!(done.len(), 1);
    let (tag, outcome) = &done[0];
    let (tokens, bg_text, kv) = outcome.as_ref().expect("the job succeeded");
    assert_eq!(*tag, 7);
    assert_eq!(bg_text, &text, "greedy background generation = the request's answer");
    assert_eq!(kv.len(), tokens.len());
    assert!(tokens.len() > prompt.len(), "tokens generated and fed");
    let m = &metrics;
    assert_eq!(m.background_jobs.load(Relaxed), 1);
    assert_eq!(m.background_failed.load(Relaxed), 0);
    assert!(m.background_rows.load(Relaxed) >= tokens.len() as u64);
    // Requests' own counters do not include the background job's.
    assert_eq!(m.tokens_computed.load(Relaxed), prompt.len() as u64);
}

#[test]
fn a_prefill_job_hands_back_the_kv_a_cold_prefill_computes() {
    let (_dir, model) = common::tiny();
    let pool = pool_for(&model);
    let prompt = model.tokenizer.encode("class Stack:\n    def push(self, x):", true).unwrap().ids;
    // Chunked by the engine (a 4-token prefill chunk) while a request runs beside it.
    let config = SchedulerConfig { prefill_chunk: 4, ..Default::default() };
    let engine = Engine::new(&model, &pool, config, vec![job(&pool, 1, &prompt, 0, BackgroundPriority::Blocking, "s")]);
    let params = SamplingParams { max_tokens: 6, ignore_eos: true, ..Default::default() };
    engine.submit("user", None, &common::ids(&model, "import os"), &params, Collect::default());
    let (done, _, _) = engine.run().finish();
    let (_, outcome) = done.into_iter().next().expect("one job ended");
    let (tokens, text, mut kv) = outcome.expect("the prefill succeeded");
    assert_eq!(tokens, prompt);
    assert!(text.is_empty(), "nothing sampled");
    assert_eq!(kv.len(), prompt.len());
    // The next token's logits over the job's KV = over a cold prefill's.
    let next = common::ids(&model, " return")[0];
    kv.reserve(1).unwrap();
    let over_job = model.forward(&mut [SeqStep::new(&[next], prompt.len(), &mut kv, Logits::Last)]).unwrap().remove(0);
    let mut cold = SeqKv::new(&pool);
    let all: Vec<u32> = prompt.iter().copied().chain([next]).collect();
    cold.reserve(all.len()).unwrap();
    let cold_logits = model.forward(&mut [SeqStep::new(&all, 0, &mut cold, Logits::Last)]).unwrap().remove(0);
    let diff = over_job.iter().zip(&cold_logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-4, "max logit difference {diff}");
}

/// Runs one long request beside a long low-priority job with `share`; returns the job's rows
/// computed while the request ran (from its admission to its end) and the request's rows.
fn rows_beside_a_request(share: f32) -> (u64, u64) {
    let (_dir, model) = common::tiny();
    let pool = pool_for(&model);
    let bg_prompt = model.tokenizer.encode("def long_function(x):", true).unwrap().ids;
    let config = SchedulerConfig { background_share: share, ..Default::default() };
    let engine = Engine::new(&model, &pool, config, vec![job(&pool, 3, &bg_prompt, 400, BackgroundPriority::Low, "summary")]);
    /// Reads the background rows when the request starts and when it finishes.
    struct Rows(Arc<Metrics>, Arc<Mutex<Vec<u64>>>);
    impl EventSink for Rows {
        fn send(&self, e: Event) -> bool {
            if let Event::Started { .. } | Event::Finished { .. } = e {
                self.1.lock().unwrap().push(self.0.background_rows.load(Relaxed));
            }
            true
        }
        fn is_closed(&self) -> bool {
            false
        }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let prompt = model.tokenizer.encode("import sys", true).unwrap().ids;
    let params = SamplingParams { max_tokens: 60, ignore_eos: true, ..Default::default() };
    engine.submit("user", None, &prompt, &params, Rows(engine.metrics.clone(), seen.clone()));
    let (done, _, _) = engine.run().finish();
    assert!(done[0].1.is_ok(), "the job finished after the request");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "started and finished");
    (seen[1] - seen[0], (prompt.len() + 60) as u64)
}

#[test]
fn low_priority_work_stays_within_its_share_while_requests_run() {
    for share in [0.0f32, 0.1, 0.25] {
        let (bg, fg) = rows_beside_a_request(share);
        let bound = (share as f64 * fg as f64).ceil() as u64 + 2;
        eprintln!("share {share}: background rows {bg} beside {fg} request rows (bound {bound})");
        assert!(bg <= bound, "share {share}: {bg} background rows beside {fg} request rows");
        if share > 0.0 {
            assert!(bg * 2 >= (share as f64 * fg as f64) as u64, "share {share}: the job advanced ({bg} rows beside {fg})");
        }
    }
}

#[test]
fn a_blocking_job_holds_its_sessions_next_request_and_a_forgotten_owner_ends_its_jobs() {
    let (_dir, model) = common::tiny();
    let pool = pool_for(&model);
    let prompt = model.tokenizer.encode("x = [i * i for i in range(10)]", true).unwrap().ids;
    let config = SchedulerConfig { prefill_chunk: 2, ..Default::default() };
    let engine = Engine::new(&model, &pool, config.clone(), vec![job(&pool, 1, &prompt, 0, BackgroundPriority::Blocking, "t")]);
    let params = SamplingParams { max_tokens: 2, ignore_eos: true, ..Default::default() };
    // The same owner and session as the job: admitted only once the job has ended.
    engine.submit("bg", Some("t"), &common::ids(&model, "y = 1"), &params, Collect::default());
    let (done, log, _) = engine.run().finish();
    assert!(done[0].1.is_ok());
    let job_end = log.iter().position(|l| l == "done 1").expect("the job ended");
    let admitted = log.iter().position(|l| l == "admit t").expect("the request was admitted");
    assert!(job_end < admitted, "the request waited for the job on its session: {log:?}");

    // The owner forgotten while its job runs (started on the engine's first pass, the Forget
    // read right after): it ends with an error, nothing handed back.
    let engine = Engine::new(&model, &pool, config, vec![job(&pool, 2, &prompt, 0, BackgroundPriority::Low, "t")]);
    engine.tx.send(Command::Forget(OwnerKey::parse("bg"))).unwrap();
    let (done, _, metrics) = engine.run().finish();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].1.as_ref().err().map(String::as_str), Some("its owner was forgotten"));
    assert_eq!(metrics.background_failed.load(Relaxed), 1);
}
