//! The admission seam's two answers about forward work (`ContextPolicy::prepare`, the
//! checkout's `repair`), on a real engine thread with the tiny fixture:
//! - a policy that answers `AfterBackground` once and queues a `BlockingOwner` job is admitted
//!   after the job ends (its answer unchanged), while another owner's request is not held;
//!   one that defers without queuing gets the engine's error;
//! - a checkout whose reused KV holds a chunk computed elsewhere and moved into place is
//!   repaired in the engine's step (ratio 1: the cold answer, token for token); a repair that
//!   fails fails its sequence alone, with its error, and the request beside it completes.

use crate::common::{self, parts, prefill, Collect};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use engram_context::SessionStore;
use engram_engine::{
    run_engine, AdmitRequest, BackgroundDone, BackgroundJob, BackgroundPriority, Checkout, Command, ContextPolicy, Event, MatchKind,
    Metrics, PolicyLayer, Readiness, Repair, Retired, SamplingParams, SchedulerConfig,
};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::Model;

/// The session store, with owner "waits" deferred once (queuing a prefill job of its own when
/// `queue_job`), checkouts handed out as given for the owners in `checkouts`, and a log of
/// what it saw, in order.
struct Seam {
    inner: SessionStore,
    pool: KvPool,
    queue_job: bool,
    deferred: bool,
    queue: VecDeque<BackgroundJob>,
    checkouts: HashMap<String, Checkout>,
    log: Arc<Mutex<Vec<String>>>,
}

impl PolicyLayer for Seam {
    common::inner_layer!();
    fn prepare(&mut self, req: &AdmitRequest<'_>) -> Readiness {
        let owner = req.owner.as_str().to_string();
        if owner != "waits" || self.deferred {
            self.log.lock().unwrap().push(format!("prepare {owner} now"));
            return Readiness::Now;
        }
        self.deferred = true;
        if self.queue_job {
            let n = req.tokens.len();
            self.queue.push_back(BackgroundJob {
                owner: req.owner.clone(),
                tag: 1,
                start: Checkout::own("stream".into(), MatchKind::Miss, req.tokens.to_vec(), vec![0; n], 0, SeqKv::new(&self.pool)),
                max_tokens: 0,
                stop: Vec::new(),
                priority: BackgroundPriority::BlockingOwner,
                hidden: Vec::new(),
            });
        }
        self.log.lock().unwrap().push(format!("prepare {owner} after"));
        Readiness::AfterBackground
    }
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.log.lock().unwrap().push(format!("admit {}", req.owner.as_str()));
        match self.checkouts.remove(req.owner.as_str()) {
            Some(c) => Ok(c),
            None => self.inner.admit(req),
        }
    }
    fn retire(&mut self, r: Retired) {
        self.log.lock().unwrap().push(format!("retire {}", r.owner.as_str()));
        self.inner.retire(r)
    }
    fn next_background(&mut self) -> Option<BackgroundJob> {
        self.queue.pop_front()
    }
    fn background_done(&mut self, d: BackgroundDone) {
        self.log.lock().unwrap().push(format!("done {} {}", d.tag, if d.outcome.is_ok() { "ok" } else { "failed" }));
    }
}

/// Runs `requests` (owner, prompt), submitted together before the engine starts, through a
/// [`Seam`] to the end; each request's sink, the policy's log and the metrics.
fn run(
    model: &Arc<Model>,
    pool: &KvPool,
    queue_job: bool,
    checkouts: HashMap<String, Checkout>,
    requests: &[(&str, Vec<u32>)],
) -> (Vec<Collect>, Vec<String>, Arc<Metrics>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let policy = Seam {
        inner: SessionStore::new(pool.clone(), model.fingerprint),
        pool: pool.clone(),
        queue_job,
        deferred: false,
        queue: VecDeque::new(),
        checkouts,
        log: log.clone(),
    };
    let (tx, rx) = mpsc::channel();
    let (pending, metrics) = (Arc::new(AtomicUsize::new(0)), Arc::new(Metrics::default()));
    let params = SamplingParams { max_tokens: 8, ignore_eos: true, ..SamplingParams::default() };
    let sinks: Vec<Collect> = requests.iter().map(|_| Collect::default()).collect();
    for ((owner, prompt), sink) in requests.iter().zip(&sinks) {
        pending.fetch_add(1, Relaxed);
        tx.send(Command::Submit(common::job(owner, prompt, &params), Box::new(sink.clone()), Instant::now())).unwrap();
    }
    drop(tx);
    let (model, pool, m) = (model.clone(), pool.clone(), metrics.clone());
    std::thread::spawn(move || run_engine(&model, pool, SchedulerConfig::default(), Box::new(policy), m, pending, rx)).join().unwrap();
    let log = log.lock().unwrap().clone();
    (sinks, log, metrics)
}

/// The failure a request's events end with, if any.
fn failure(sink: &Collect) -> Option<String> {
    sink.0.lock().unwrap().iter().find_map(|e| if let Event::Failed(e) = e { Some(e.message.clone()) } else { None })
}

fn pool_for(model: &Model) -> KvPool {
    KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20)
}

#[test]
fn a_request_deferred_to_a_job_it_waits_on_is_admitted_after_the_job_ends() {
    let (_dir, model) = common::tiny();
    let pool = pool_for(&model);
    let prompt = model.tokenizer.encode("def add(a, b):", true).unwrap().ids;
    let (sinks, log, metrics) = run(&model, &pool, true, HashMap::new(), &[("waits", prompt.clone()), ("other", prompt.clone())]);
    let at = |entry: &str| log.iter().position(|l| l == entry).unwrap_or_else(|| panic!("{entry:?} not in {log:?}"));
    assert!(at("prepare waits after") < at("done 1 ok"), "{log:?}");
    assert!(at("done 1 ok") < at("prepare waits now"), "prepared again once the job ended: {log:?}");
    assert!(at("prepare waits now") < at("admit waits"), "{log:?}");
    assert_eq!(log.iter().filter(|l| l.starts_with("admit waits")).count(), 1);
    assert_eq!(metrics.background_jobs.load(Relaxed), 1);
    assert_eq!(metrics.background_failed.load(Relaxed), 0);
    // Both answered, alike: the wait changes when a request runs, not what it computes.
    let (waited, finish) = sinks[0].outcome();
    assert!(finish.is_some(), "{:?}", failure(&sinks[0]));
    assert_eq!(waited, sinks[1].outcome().0);
}

#[test]
fn a_request_deferred_to_work_nobody_queued_fails_with_the_engines_error() {
    let (_dir, model) = common::tiny();
    let pool = pool_for(&model);
    let prompt = model.tokenizer.encode("def add(a, b):", true).unwrap().ids;
    let (sinks, log, metrics) = run(&model, &pool, false, HashMap::new(), &[("waits", prompt.clone()), ("other", prompt)]);
    assert_eq!(failure(&sinks[0]).as_deref(), Some("the context policy deferred the request to background work it did not queue"));
    assert!(!log.iter().any(|l| l == "admit waits"), "{log:?}");
    assert_eq!(metrics.background_jobs.load(Relaxed), 0);
    assert!(sinks[1].outcome().1.is_some(), "the other owner's request is served: {:?}", failure(&sinks[1]));
}

/// A checkout of sys + A + B + question whose KV holds sys + A as computed together and B as
/// computed alone after sys, moved behind A; the engine is asked to repair B with `ratio`.
fn moved_checkout(m: &Model, pool: &KvPool, ratio: f32) -> (Checkout, Vec<u32>) {
    let [sys, a, b, q] = parts(m);
    let mut sys_kv = SeqKv::new(pool);
    prefill(m, &mut sys_kv, &sys);
    let mut b_alone = sys_kv.fork(sys.len());
    prefill(m, &mut b_alone, &b);
    let mut kv = sys_kv.fork(sys.len());
    prefill(m, &mut kv, &a);
    kv.extend_shifted(&b_alone, sys.len()..sys.len() + b.len(), &m.config.rope).unwrap();
    let held = kv.len();
    let moved = sys.len() + a.len()..held;
    let prompt: Vec<u32> = [sys, a, b, q].concat();
    let n = prompt.len();
    let c = Checkout::own("blend".into(), MatchKind::Prefix, prompt.clone(), vec![0; n], held, kv);
    (Checkout { repair: Some(Repair { moved: vec![moved], ratio }), ..c }, prompt)
}

#[test]
fn moved_kv_repaired_in_the_step_at_ratio_one_answers_as_cold() {
    let (_dir, model) = common::tiny();
    let pool = pool_for(&model);
    let (c, prompt) = moved_checkout(&model, &pool, 1.0);
    let (sinks, _, metrics) =
        run(&model, &pool, true, HashMap::from([("blend".to_string(), c)]), &[("blend", prompt.clone()), ("cold", prompt)]);
    let (blended, finish) = sinks[0].outcome();
    assert!(finish.is_some(), "{:?}", failure(&sinks[0]));
    assert_eq!(blended, sinks[1].outcome().0, "ratio 1 recomputes every moved token: the cold answer");
    assert_eq!(metrics.step_faults.load(Relaxed), 0);
    // Without the repair (ratio 0) the moved chunk's stale KV shows in the answer.
    let (c, prompt) = moved_checkout(&model, &pool, 0.0);
    let (sinks, _, _) = run(&model, &pool, true, HashMap::from([("blend".to_string(), c)]), &[("blend", prompt.clone()), ("cold", prompt)]);
    assert_ne!(sinks[0].outcome().0, sinks[1].outcome().0, "ratio 0 is plain moved reuse: approximate");
}

#[test]
fn a_repair_that_fails_in_the_step_fails_its_sequence_alone() {
    let (_dir, model) = common::tiny();
    let pool = pool_for(&model);
    // A ratio outside [0, 1]: blend refuses it when the step runs the repair.
    let (c, prompt) = moved_checkout(&model, &pool, 2.0);
    let (sinks, log, metrics) =
        run(&model, &pool, true, HashMap::from([("bad".to_string(), c)]), &[("bad", prompt.clone()), ("good", prompt)]);
    let e = failure(&sinks[0]).expect("the bad repair fails its request");
    assert!(e.contains("repairing the reused KV") && e.contains("not in [0, 1]"), "{e}");
    assert!(sinks[0].0.lock().unwrap().iter().all(|e| !matches!(e, Event::Text(_))), "nothing generated over unrepaired KV");
    // Both were admitted before either ended: the failure was the batch's, and only one failed.
    let at = |entry: &str| log.iter().position(|l| l == entry).unwrap_or_else(|| panic!("{entry:?} not in {log:?}"));
    assert!(at("admit bad").max(at("admit good")) < at("retire bad"), "{log:?}");
    let (good, finish) = sinks[1].outcome();
    assert!(finish.is_some() && !good.is_empty(), "the request beside it completes: {:?}", failure(&sinks[1]));
    assert_eq!(metrics.step_faults.load(Relaxed), 0, "an error, not a panic");
}

#[test]
fn a_repair_of_kv_that_is_not_linear_is_refused_at_admission() {
    let (_dir, model) = common::tiny();
    let pool = pool_for(&model);
    let (c, prompt) = moved_checkout(&model, &pool, 1.0);
    let c = Checkout { own_first: Some(4), ..c };
    let (sinks, _, _) = run(&model, &pool, true, HashMap::from([("odd".to_string(), c)]), &[("odd", prompt)]);
    let e = failure(&sinks[0]).expect("refused");
    assert!(e.contains("not its own linear paged cache"), "{e}");
}
