//! A user's persistent stream prefilled by the engine, not the policy: anchors and facts set
//! through the policy's messages queue a job that holds every request of the user; the stream's
//! KV it hands back — a fact superseded (tombstoned, hidden from the new tokens) and another
//! appended — gives views whose logits equal a cold run over the live stream, and the same
//! logits as the stream `admit_tokens` gets by running that job itself; through the scheduler a
//! turn is admitted only once the job ended, on a stream it no longer has to prefill; a state
//! entry set while the stream is being prefilled is set once it is. An admission never prefills:
//! it defers to the engine's job (`prepare`), and a job that failed is the turn's error, the
//! next turn asking again.

use crate::common;
use common::{assert_close, cold, fact, ids, on_view, tiny, Collect};

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use engram_dual::{DualControl, DualStream};
use engram_engine::{drain_background, run_engine, AdmitRequest, Command, ContextPolicy, Job, Metrics, PolicyControl, PolicyLayer};
use engram_engine::{Event, OwnerKey, Readiness};
use engram_engine::{SamplingParams, SchedulerConfig};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_policy::{BackgroundDone, BackgroundPriority, Checkout};

#[test]
fn the_engine_prefills_the_stream_with_tombstones_hidden_as_a_cold_run_sees_it() {
    let (_d, m) = tiny();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let tok = &m.tokenizer;
    let base = tok.encode("System: answer in one line.", true).unwrap().ids;
    let prompt = ids(&m, " User: who am I? Assistant:");
    let mut p = DualStream::new(m.clone(), pool.clone(), 256);
    p.set_anchors("u", base.clone());
    p.set_facts("u", vec![fact(&m, 1, "Ann keeps bees"), fact(&m, 2, "Ann lives in Oslo")]);
    // One job for the latest stream (the anchors' own job was replaced before it ran).
    let job = p.next_background().expect("the stream's prefill, for the engine");
    assert_eq!(job.priority, BackgroundPriority::BlockingOwner);
    assert!(p.next_background().is_none(), "one job: the one for the stream as it now is");
    assert_eq!(p.persistent("u").unwrap().prefilled_len(), 0, "the policy computed nothing");
    let mut requeue = common::Requeue { inner: p, first: Some(job) };
    assert_eq!(drain_background(&m, pool.clone(), &mut requeue), 1);
    let mut p = requeue.inner;
    let stream = p.persistent("u").unwrap();
    assert_eq!((stream.prefilled_len(), p.dual_stats().anchors_prefilled), (stream.len(), 1));
    let c = p.admit_tokens("u", Some("t0"), &prompt, tok).unwrap();
    let (logits, _, first) = on_view(&m, &pool, &c);
    assert_close(&logits, &cold(&m, &pool, p.persistent("u").unwrap(), &prompt, first), "base + facts 1 and 2");

    // Fact 2 superseded: tombstoned (kept, hidden), fact 3 appended after it by a second job.
    // (The last fact, so the live stream's every token is what a cold run computes: a live
    // fact after a tombstone keeps the KV it computed while the tombstoned one was live.)
    p.set_facts("u", vec![fact(&m, 1, "Ann keeps bees"), fact(&m, 3, "Ann keeps wasps")]);
    let job = p.next_background().expect("the appended fact's prefill");
    assert_eq!(job.hidden, p.persistent("u").unwrap().masked_ranges());
    assert!(!job.hidden.is_empty());
    let mut requeue = common::Requeue { inner: p, first: Some(job) };
    drain_background(&m, pool.clone(), &mut requeue);
    let mut p = requeue.inner;
    let c = p.admit_tokens("u", Some("t"), &prompt, tok).unwrap();
    let (logits, _, first) = on_view(&m, &pool, &c);
    let stream = p.persistent("u").unwrap();
    assert_eq!(p.dual_stats().anchors_prefilled, 2, "the admissions found the stream complete");
    assert_close(&logits, &cold(&m, &pool, stream, &prompt, first), "base + fact 1 + fact 3, fact 2 hidden");

    // The same changes driven through `admit_tokens` (which runs the stream's job itself, on
    // this thread): the same logits.
    let mut q = DualStream::new(m.clone(), pool.clone(), 256);
    q.set_anchors("u", base);
    q.set_facts("u", vec![fact(&m, 1, "Ann keeps bees"), fact(&m, 2, "Ann lives in Oslo")]);
    drop(q.admit_tokens("u", Some("warm"), &prompt, tok).unwrap());
    q.set_facts("u", vec![fact(&m, 1, "Ann keeps bees"), fact(&m, 3, "Ann keeps wasps")]);
    let c = q.admit_tokens("u", Some("t"), &prompt, tok).unwrap();
    assert!(q.next_background().is_none(), "run by admit_tokens: no job left");
    let (same, _, _) = on_view(&m, &pool, &c);
    assert_close(&logits, &same, "engine-prefilled vs admission-prefilled stream");
}

/// Records, in order, each admission (with whether the user's stream was complete then) and
/// each background job's end.
struct Watch {
    inner: DualStream,
    log: Arc<Mutex<Vec<String>>>,
}

impl PolicyLayer for Watch {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        let ready = self.inner.persistent(req.owner.as_str()).is_some_and(|s| s.prefilled_len() == s.len() && !s.is_empty());
        self.log.lock().unwrap().push(format!("admit {} ready={ready}", req.session.unwrap_or("-")));
        self.inner.admit(req)
    }
    fn background_done(&mut self, done: BackgroundDone) {
        self.log.lock().unwrap().push(format!("done {}", if done.outcome.is_ok() { "ok" } else { "failed" }));
        self.inner.background_done(done);
    }
}

#[test]
fn through_the_scheduler_a_turn_waits_for_its_stream_and_a_state_entry_follows_it() {
    let (_d, m) = tiny();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let log = Arc::new(Mutex::new(Vec::new()));
    let watch = Watch { inner: DualStream::new(m.clone(), pool.clone(), 256), log: log.clone() };
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let metrics = Arc::new(Metrics::default());
    // The turn's message and its request are queued before the engine starts, so its first
    // pass sees both at once: the job must still go first.
    let anchors = m.tokenizer.encode("System: answer in one line.", true).unwrap().ids;
    let facts = Some(vec![fact(&m, 1, "Ann keeps bees")]);
    let state = Some(("t".to_string(), ids(&m, " State: running, km 3.")));
    tx.send(Command::Control(PolicyControl::new(DualControl::Turn { user: "u".into(), anchors, facts, state }))).unwrap();
    let sink = Collect::default();
    let params = SamplingParams { max_tokens: 3, ignore_eos: true, ..Default::default() };
    let job = Job { session: Some("t".into()), ..common::job("u", &ids(&m, " User: hi. Assistant:"), &params) };
    pending.fetch_add(1, SeqCst);
    tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
    let engine = {
        let (model, pending, pool, metrics) = (m.clone(), pending.clone(), pool.clone(), metrics.clone());
        std::thread::spawn(move || run_engine(&model, pool, SchedulerConfig::default(), Box::new(watch), metrics, pending, rx))
    };
    let t = Instant::now();
    while sink.outcome().1.is_none() {
        assert!(t.elapsed() < Duration::from_secs(60), "the turn ends");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(tx);
    engine.join().unwrap();
    let log = log.lock().unwrap().clone();
    // The stream's job, then the state entry's (deferred until the stream was there), then the
    // turn, on a complete stream.
    assert_eq!(log, vec!["done ok", "done ok", "admit t ready=true"], "{log:?}");
    assert_eq!(metrics.background_jobs.load(SeqCst), 2);
}

#[test]
fn an_admission_defers_to_the_engines_prefill_and_a_failed_one_is_the_turns_error() {
    let (_d, m) = tiny();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let tok = &m.tokenizer;
    let prompt = ids(&m, " User: who am I? Assistant:");
    let mut p = DualStream::new(m.clone(), pool.clone(), 256);
    p.set_anchors("u", tok.encode("System: answer in one line.", true).unwrap().ids);
    p.set_facts("u", vec![fact(&m, 1, "Ann keeps bees")]);
    let owner = OwnerKey::parse("u");
    let req =
        AdmitRequest { owner: &owner, session: Some("t"), text: None, add_special: false, tokens: &prompt, tok, long_context_after: None };
    assert_eq!(p.prepare(&req), Readiness::AfterBackground, "the stream holds no KV: the engine's job first");
    let job = p.next_background().expect("the stream's prefill");
    assert_eq!(job.priority, BackgroundPriority::BlockingOwner);

    // The job fails (as a model error or a full budget would): the admission says why and
    // computes nothing itself.
    p.background_done(BackgroundDone { owner: owner.clone(), tag: job.tag, outcome: Err("an injected failure".into()) });
    assert_eq!(p.prepare(&req), Readiness::Now, "after a failure: admitted, to fail with its error");
    let e = p.admit(&req).err().expect("no stream KV: the turn fails");
    assert!(e.contains("persistent stream") && e.contains("an injected failure"), "{e}");
    assert_eq!(p.persistent("u").unwrap().prefilled_len(), 0, "the policy computed nothing");

    // The next request asks for the prefill again; once the engine ran it, it is admitted.
    assert_eq!(p.prepare(&req), Readiness::AfterBackground);
    assert_eq!(drain_background(&m, pool.clone(), &mut p), 1);
    assert_eq!(p.prepare(&req), Readiness::Now);
    let c = p.admit(&req).unwrap();
    let (logits, _, first) = on_view(&m, &pool, &c);
    assert_close(&logits, &cold(&m, &pool, p.persistent("u").unwrap(), &prompt, first), "base + fact 1, after a retry");
}

/// Fails the first background job's outcome (as a model error would), then forwards.
struct FailFirst {
    inner: DualStream,
    failed: bool,
}

impl PolicyLayer for FailFirst {
    common::inner_layer!();
    fn background_done(&mut self, mut done: BackgroundDone) {
        if !self.failed {
            self.failed = true;
            done.outcome = Err("an injected model error".into());
        }
        self.inner.background_done(done);
    }
}

#[test]
fn through_the_scheduler_a_failed_stream_prefill_fails_its_turn_and_the_next_turn_prefills_again() {
    let (_d, m) = tiny();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let policy = FailFirst { inner: DualStream::new(m.clone(), pool.clone(), 256), failed: false };
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let metrics = Arc::new(Metrics::default());
    let anchors = m.tokenizer.encode("System: answer in one line.", true).unwrap().ids;
    let turn = DualControl::Turn { user: "u".into(), anchors, facts: Some(vec![fact(&m, 1, "Ann keeps bees")]), state: None };
    tx.send(Command::Control(PolicyControl::new(turn))).unwrap();
    let params = SamplingParams { max_tokens: 3, ignore_eos: true, ..Default::default() };
    let prompt = ids(&m, " User: hi. Assistant:");
    let submit = |sink: &Collect| {
        let job = Job { session: Some("t".into()), ..common::job("u", &prompt, &params) };
        pending.fetch_add(1, SeqCst);
        tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
    };
    let ended = |sink: &Collect| {
        let t = Instant::now();
        loop {
            let events = sink.0.lock().unwrap();
            if let Some(e) = events.iter().find_map(|e| if let Event::Failed(e) = e { Some(e.to_string()) } else { None }) {
                return Err(e);
            }
            if events.iter().any(|e| matches!(e, Event::Finished { .. })) {
                return Ok(());
            }
            drop(events);
            assert!(t.elapsed() < Duration::from_secs(60), "the turn ends");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let (first, second) = (Collect::default(), Collect::default());
    submit(&first);
    let engine = {
        let (model, pending, pool, metrics) = (m.clone(), pending.clone(), pool.clone(), metrics.clone());
        std::thread::spawn(move || run_engine(&model, pool, SchedulerConfig::default(), Box::new(policy), metrics, pending, rx))
    };
    let e = ended(&first).expect_err("the stream's prefill failed: so does the turn");
    assert!(e.contains("persistent stream") && e.contains("an injected model error"), "{e}");
    submit(&second);
    ended(&second).expect("the next turn waits for a new prefill and answers");
    assert_eq!(second.outcome().1.map(|f| f.as_str()), Some("length"));
    drop(tx);
    engine.join().unwrap();
    assert_eq!(metrics.background_jobs.load(SeqCst), 2, "the failed prefill and the one the next turn asked for");
}
