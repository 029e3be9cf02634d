//! A user's persistent stream prefilled by the engine, not the policy: anchors and facts set
//! through the policy's messages queue a job that holds every request of the user; the stream's
//! KV it hands back — a fact superseded (tombstoned, hidden from the new tokens) and another
//! appended — gives views whose logits equal a cold run over the live stream, and the same
//! logits as a stream the admission prefilled itself; through the scheduler a turn is admitted
//! only once the job ended, on a stream it no longer has to prefill; a state entry set while the
//! stream is being prefilled is set once it is.

use crate::common;
use common::{assert_close, cold, fact, ids, on_view, tiny, Collect};

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use engram_dual::{DualControl, DualStream};
use engram_engine::{drain_background, run_engine, AdmitRequest, Command, ContextPolicy, Job, Metrics, PolicyControl, PolicyLayer};
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

    // The same changes with the admissions prefilling (no engine): the same logits.
    let mut q = DualStream::new(m.clone(), pool.clone(), 256);
    q.set_anchors("u", base);
    q.set_facts("u", vec![fact(&m, 1, "Ann keeps bees"), fact(&m, 2, "Ann lives in Oslo")]);
    drop(q.admit_tokens("u", Some("warm"), &prompt, tok).unwrap());
    q.set_facts("u", vec![fact(&m, 1, "Ann keeps bees"), fact(&m, 3, "Ann keeps wasps")]);
    let c = q.admit_tokens("u", Some("t"), &prompt, tok).unwrap();
    assert!(q.next_background().is_none(), "prefilled by the admission: its job dropped");
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
