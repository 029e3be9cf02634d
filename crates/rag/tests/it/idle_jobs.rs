//! Idle-time population as the engine's background work, on a real engine thread
//! (pycode-7m, f16 KV): while requests keep arriving, RAG idle units that need the model
//! (chunk prefills, answers) still progress within the background share, and do not at share
//! 0; a unit whose job faults fails alone — the engine goes on serving and the fault is
//! counted as the unit's error.

use crate::common;
use common::{Cold, Sink};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engram_engine::{run_engine, Command, Event, EventSink, Job, Metrics, SamplingParams, SchedulerConfig};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_policy::OwnerKey;
use engram_rag::idle::budget::{FixedLoad, LoadSample};
use engram_rag::idle::predict::PredictConfig;
use engram_rag::synth::{self, Step, SynthConfig};
use engram_rag::{IdleConfig, IdleCounters, IdleTenants, KnowledgeBank, Library, PerCache, QaBank, RagConfig, SegmentRegistry, TreePolicy};

/// An engine thread running `TreePolicy` over a tenant with idle population on; `tree_pool` is
/// the pool the tree policy (and so its idle jobs' KV) uses.
struct Engine {
    tx: mpsc::Sender<Command>,
    pending: Arc<AtomicUsize>,
    counters: Arc<IdleCounters>,
    metrics: Arc<Metrics>,
    model: Arc<Model>,
    /// The tenant's library and its idle registry, added by [`Engine::wake_tenant`].
    tenant: (IdleTenants, Arc<Mutex<Library>>),
    thread: std::thread::JoinHandle<()>,
}

fn engine(dir: &std::path::Path, share: f32, tree_pool: Option<KvPool>) -> Engine {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 256 << 20);
    let mut bank = KnowledgeBank::open(&dir.join("bank"), common::words()).unwrap();
    let users = synth::generate(&SynthConfig { users: 1, topics_per_user: 2, ..SynthConfig::default() });
    for s in &users[0].steps {
        if let Step::Ingest(d) = s {
            bank.ingest_text(&d.id, d.kind, &d.text).unwrap();
        }
    }
    let mut config = RagConfig::default();
    config.params.max_tokens = 4;
    let mut lib = Library::new(model.clone(), bank, QaBank::in_memory(1 << 20), config);
    let cfg = IdleConfig { predict: PredictConfig { stride: 4, ..PredictConfig::default() }, ..IdleConfig::default() };
    lib.enable_idle(PerCache::in_memory(cfg)).unwrap();
    // A quiet machine: the idle budget never rests (the background share is what is tested).
    let tenants = IdleTenants::with_load_source(Box::new(FixedLoad(LoadSample { load1: Some(0.0), cores: Some(2), battery: None })));
    let counters = tenants.counters();
    let tree_pool = tree_pool.unwrap_or_else(|| pool.clone());
    let policy = TreePolicy::new(Box::new(Cold(pool.clone())), SegmentRegistry::default(), tree_pool, model.clone(), 16 << 20)
        .with_idle(tenants.clone());
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let metrics = Arc::new(Metrics::default());
    let config = SchedulerConfig { background_share: share, ..SchedulerConfig::default() };
    let thread = {
        let (model, pending, metrics) = (model.clone(), pending.clone(), metrics.clone());
        std::thread::spawn(move || run_engine(&model, pool, config, Box::new(policy), metrics, pending, rx))
    };
    Engine { tx, pending, counters, metrics, model, tenant: (tenants, Arc::new(Mutex::new(lib))), thread }
}

impl Engine {
    /// Submits a request of `max_tokens` tokens (end of sequence ignored).
    fn submit(&self, owner: &str, max_tokens: usize) -> Sink {
        let prompt = self.model.tokenizer.encode("def parse_args(argv):\n    ", true).unwrap().ids;
        let params = SamplingParams { max_tokens, ignore_eos: true, ..SamplingParams::default() };
        let sink = Sink::default();
        self.pending.fetch_add(1, Relaxed);
        self.tx
            .send(Command::Submit(Job::from_tokens(OwnerKey::parse(owner), prompt, params), Box::new(sink.clone()), Instant::now()))
            .unwrap();
        sink
    }

    /// Registers the tenant's library with idle population and wakes the engine.
    fn wake_tenant(&self) {
        self.tenant.0.add("t", self.tenant.1.clone(), None);
        self.tx.send(Command::Wake).unwrap();
    }

    fn stop(self) {
        drop(self.tx);
        self.thread.join().unwrap();
    }
}

/// Units that ran the model (answers and chunk prefills stored).
fn model_units(c: &IdleCounters) -> u64 {
    c.qa_populated.load(Relaxed) + c.kv_populated.load(Relaxed)
}

/// Keeps three staggered requests running (a new one as each ends), waking the tenant once
/// they are all under way, until `until` says stop or `limit` passes; returns the requests
/// that finished and the model units counted at the end while the load still ran. The batch is
/// never without a request: when one ends the other two still run.
fn under_load(e: &Engine, limit: Duration, until: impl Fn() -> bool) -> (usize, u64) {
    // Long enough that the batch stays busy while this thread waits for a core on a loaded
    // machine (all three ending before it replaces one would leave the engine idle).
    let lengths = [200, 265, 335];
    let mut running: Vec<Sink> = lengths.iter().map(|&n| e.submit("user", n)).collect();
    let started = |s: &Sink| s.0.lock().unwrap().iter().any(|e| matches!(e, Event::Started { .. }));
    while !running.iter().all(started) {
        std::thread::sleep(Duration::from_micros(200));
    }
    e.wake_tenant();
    let t = Instant::now();
    let mut finished = 0;
    while t.elapsed() < limit && !until() {
        for (i, s) in running.iter_mut().enumerate() {
            if s.ended() {
                assert!(s.finished(), "a request failed under load");
                finished += 1;
                *s = e.submit("user", lengths[i]);
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let units = model_units(&e.counters);
    while running.iter().any(|s| !s.ended()) {
        std::thread::sleep(Duration::from_millis(1));
    }
    (finished, units)
}

#[test]
fn idle_units_progress_under_constant_load_within_the_share_and_not_at_share_0() {
    // Share 0: while requests keep the batch busy, no unit's model work runs.
    let tmp = tempfile::tempdir().unwrap();
    let e = engine(tmp.path(), 0.0, None);
    // The tenant is woken only once the requests run.
    let (served, units) = under_load(&e, Duration::from_secs(4), || false);
    let c = e.counters.clone();
    assert!(served > 0);
    assert_eq!(units, 0, "share 0: no idle model work under constant load ({served} requests served)");
    // Idle again: the units run.
    let t = Instant::now();
    while model_units(&c) == 0 {
        assert!(t.elapsed() < Duration::from_secs(120), "no unit ran once the load stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    e.stop();

    // Share 25%: units that need the model finish while the requests never stop, and they
    // yielded to requests on the way (sat out steps past the share).
    let tmp = tempfile::tempdir().unwrap();
    let e = engine(tmp.path(), 0.25, None);
    let c = e.counters.clone();
    let (served, units) = under_load(&e, Duration::from_secs(120), || model_units(&c) >= 2);
    assert!(units >= 2, "share 25%: idle model work progressed under load ({served} requests served)");
    assert!(c.interrupted.load(Relaxed) >= 1, "units yielded to requests");
    assert_eq!(c.errors.load(Relaxed), 0);
    assert!(e.metrics.background_rows.load(Relaxed) > 0);
    e.stop();
}

#[test]
fn a_faulting_idle_unit_fails_alone_and_the_engine_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let model = Model::load(&common::pycode()).unwrap();
    assert!(model.config.num_layers > 1, "the fault needs a second layer to write");
    // The tree policy's pool holds one layer: an idle job's KV, made there, faults in the
    // forward pass writing its second layer.
    let bad = KvPool::new(KvLayout { num_layers: 1, ..KvLayout::of(&model.config) }, KvFormat::F16, 64 << 20);
    let e = engine(tmp.path(), 0.1, Some(bad));
    e.wake_tenant();
    let c = e.counters.clone();
    let t = Instant::now();
    while c.errors.load(Relaxed) == 0 {
        assert!(t.elapsed() < Duration::from_secs(120), "the faulting unit never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(e.metrics.step_faults.load(Relaxed) >= 1, "the fault was the engine's, contained to its step");
    assert_eq!(model_units(&c), 0, "nothing of the faulted unit was stored");
    // The engine goes on: a request is served in full.
    let s = e.submit("user", 8);
    let t = Instant::now();
    while !s.ended() {
        assert!(t.elapsed() < Duration::from_secs(60), "the request never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(s.finished(), "a request after the fault is served");
    e.stop();
}

/// A request's token arrival times.
#[derive(Clone, Default)]
struct Timed(Arc<Mutex<(Vec<Instant>, bool)>>);

impl EventSink for Timed {
    fn send(&self, event: Event) -> bool {
        let mut g = self.0.lock().unwrap();
        match event {
            Event::Text(_) => g.0.push(Instant::now()),
            Event::Finished { .. } | Event::Failed(_) => g.1 = true,
            _ => {}
        }
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// Foreground decode latency under constant load with RAG idle work waiting, at background
/// shares 0, 10% and 25% (rounds alternate, so machine noise spreads over all three): p50 and
/// p95 of the gap between two streamed tokens of a request, and the idle model units done.
/// Run: `cargo test --release -p engram-rag --test it idle_jobs::decode_latency -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement (prints a table), not a check"]
fn decode_latency_under_load_by_background_share() {
    let shares = [0.0f32, 0.1, 0.25];
    let rounds = 3;
    let window = Duration::from_secs(6);
    let mut gaps: Vec<Vec<f64>> = vec![Vec::new(); shares.len()];
    let mut units = vec![0u64; shares.len()];
    for _ in 0..rounds {
        for (k, &share) in shares.iter().enumerate() {
            let tmp = tempfile::tempdir().unwrap();
            let e = engine(tmp.path(), share, None);
            let prompt = e.model.tokenizer.encode("def parse_args(argv):\n    ", true).unwrap().ids;
            let submit = |n: usize| {
                let t = Timed::default();
                let params = SamplingParams { max_tokens: n, ignore_eos: true, ..SamplingParams::default() };
                e.pending.fetch_add(1, Relaxed);
                let job = Job::from_tokens(OwnerKey::parse("user"), prompt.clone(), params);
                e.tx.send(Command::Submit(job, Box::new(t.clone()), Instant::now())).unwrap();
                t
            };
            let lengths = [40, 53, 67];
            let mut running: Vec<Timed> = lengths.iter().map(|&n| submit(n)).collect();
            while running.iter().any(|t| t.0.lock().unwrap().0.is_empty()) {
                std::thread::sleep(Duration::from_micros(200));
            }
            e.wake_tenant();
            let start = Instant::now();
            let before = model_units(&e.counters);
            let mut done: Vec<Timed> = Vec::new();
            while start.elapsed() < window {
                for (i, t) in running.iter_mut().enumerate() {
                    if t.0.lock().unwrap().1 {
                        done.push(std::mem::replace(t, submit(lengths[i])));
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            units[k] += model_units(&e.counters) - before;
            for t in done {
                let g = t.0.lock().unwrap();
                gaps[k].extend(g.0.windows(2).filter(|w| w[0] >= start).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3));
            }
            while running.iter().any(|t| !t.0.lock().unwrap().1) {
                std::thread::sleep(Duration::from_millis(1));
            }
            e.stop();
        }
    }
    println!("| background share | tokens | p50 ms/token | p95 ms/token | idle model units |");
    println!("|---|---|---|---|---|");
    for (k, share) in shares.iter().enumerate() {
        let g = &mut gaps[k];
        g.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| g[((g.len() - 1) as f64 * p).round() as usize];
        println!("| {:.0}% | {} | {:.3} | {:.3} | {} |", share * 100.0, g.len(), q(0.5), q(0.95), units[k]);
    }
}
