//! A panic in a step is contained. A policy hands one owner's sequence a
//! cache from a pool laid out for fewer layers than the model has, so the forward pass panics
//! writing its second layer. That job ends with an Internal "engine fault" error, nothing it
//! computed is checked into the session store, and the engine goes on: a job submitted
//! afterwards generates what a cold `LoneSequence` run does.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common;
use common::job;
use common::Collect;
use engram_context::{Checkout, SessionStore};
use engram_engine::{
    run_engine, Command, ContextPolicy, Event, JobErrorKind, LoneSequence, Metrics, Retired, SamplingParams, SchedulerConfig,
};
use engram_engine::{AdmitRequest, PolicyLayer};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::Model;

/// The default policy, except that owner `faulty` gets a cache of `bad_pool` (one layer only),
/// and every retired sequence's owner is recorded.
struct FaultyCache {
    inner: SessionStore,
    bad_pool: KvPool,
    retired: Arc<Mutex<Vec<String>>>,
}

impl PolicyLayer for FaultyCache {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        let mut c = self.inner.admit(req)?;
        if req.owner.as_str() == "faulty" {
            c.kv = SeqKv::new(&self.bad_pool);
            c.reused = 0;
        }
        Ok(c)
    }
    fn retire(&mut self, r: Retired) {
        self.retired.lock().unwrap().push(r.owner.as_str().to_string());
        self.inner.retire(r)
    }
}

/// Waits until `sink` holds a terminal event (Finished or Failed).
fn wait_done(sink: &Collect) {
    let start = Instant::now();
    while !sink.0.lock().unwrap().iter().any(|e| matches!(e, Event::Finished { .. } | Event::Failed(_))) {
        assert!(start.elapsed() < Duration::from_secs(60), "the job never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_panicking_step_fails_its_sequences_and_the_engine_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    assert!(model.config.num_layers > 1, "the fault needs a second layer to write");
    let layout = KvLayout::of(&model.config);
    let pool = KvPool::new(layout, KvFormat::F32, 64 << 20);
    let bad_pool = KvPool::new(KvLayout { num_layers: 1, ..layout }, KvFormat::F32, 64 << 20);
    let prompt = model.tokenizer.encode("def parse_args(argv):", true).unwrap().ids;
    let params = SamplingParams { max_tokens: 12, ignore_eos: true, ..Default::default() };
    let want = LoneSequence::new(&model, &pool).generate(&prompt, &params, &mut |_| true).unwrap().text;

    let retired = Arc::new(Mutex::new(Vec::new()));
    let policy = FaultyCache { inner: SessionStore::new(pool.clone(), model.fingerprint), bad_pool, retired: retired.clone() };
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending, pool, metrics) = (model.clone(), pending.clone(), pool.clone(), metrics.clone());
        let config = SchedulerConfig { prefill_chunk: 4, ..SchedulerConfig::default() };
        std::thread::spawn(move || run_engine(&model, pool, config, Box::new(policy), metrics, pending, rx))
    };
    let submit = |owner: &str, sink: &Collect| {
        pending.fetch_add(1, Relaxed);
        tx.send(Command::Submit(job(owner, &prompt, &params), Box::new(sink.clone()), Instant::now())).unwrap();
    };

    let faulty = Collect::default();
    submit("faulty", &faulty);
    wait_done(&faulty);
    let err = faulty.0.lock().unwrap().iter().find_map(|e| if let Event::Failed(e) = e { Some(e.clone()) } else { None });
    let err = err.expect("the faulty job failed");
    assert_eq!(err.kind, JobErrorKind::Internal);
    assert!(err.message.starts_with("engine fault: "), "{}", err.message);

    let plain = Collect::default();
    submit("plain", &plain);
    wait_done(&plain);
    drop(tx);
    engine.join().expect("the engine thread survived the fault");

    assert_eq!(plain.outcome(), (want, Some(engram_engine::FinishReason::Length)), "the job after the fault vs a cold lone run");
    assert_eq!(*retired.lock().unwrap(), ["plain"], "the faulted sequence is never checked into the session store");
    assert_eq!(metrics.step_faults.load(Relaxed), 1);
    assert_eq!(pending.load(Relaxed), 0);
}
