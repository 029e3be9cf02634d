//! A checkout may carry a cache that is not paged KV (`engram_kv::SeqCache`): here a sparse
//! cache over KV offloaded to disk (`engram_sparse::LongKv`). The scheduler batches it beside
//! exact sequences in the same forward calls: the exact sequence generates what it generates
//! alone, the sparse one decodes to its length, and its cache comes back at retirement holding
//! exactly its tokens; with a retrieval budget that covers the history it generates what exact
//! attention does.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use engram_context::{Checkout, SessionStore};
use engram_engine::{
    run_engine, AdmitRequest, Command, ContextPolicy, Event, EventSink, Job, LoneSequence, Metrics, PolicyLayer, Retired, SamplingParams,
    SchedulerConfig,
};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::Model;
use engram_sparse::{LongKv, Method, OffloadConfig, SparseConfig, SparseKv};

/// The session policy, except that owner `long` runs on a fresh sparse cache offloaded to
/// `dir`; what each sparse cache held at retirement, against its tokens, is recorded.
struct SparseFor {
    inner: SessionStore,
    pool: KvPool,
    model: Arc<Model>,
    sparse: SparseConfig,
    dir: std::path::PathBuf,
    retired: Arc<Mutex<Vec<(usize, usize, bool)>>>,
}

impl PolicyLayer for SparseFor {
    fn inner(&self) -> &dyn ContextPolicy {
        &self.inner
    }
    fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
        &mut self.inner
    }
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        let c = self.inner.admit(req)?;
        if req.owner.as_str() != "long" {
            return Ok(c);
        }
        let off = OffloadConfig { ram_budget: 8 << 10, cache_bytes: 4 << 10, flush: 16, ..OffloadConfig::new(self.dir.clone(), 7) };
        let cache = LongKv::new(SparseKv::new(&self.model.config, Some(self.sparse)), off, &self.pool).map_err(|e| e.to_string())?;
        Ok(Checkout { reused: 0, kv: SeqKv::new(&self.pool), cache: Some(Box::new(cache)), ..c })
    }
    fn retire(&mut self, mut r: Retired) {
        if let Some(cache) = r.cache.take() {
            let long = cache.into_any().downcast::<LongKv>().expect("the cache this policy made");
            let offloaded = long.sparse().is_offloaded();
            self.retired.lock().unwrap().push((long.sparse().len(), r.tokens.len(), offloaded));
            return;
        }
        self.inner.retire(r)
    }
}

/// Runs `long` on a sparse cache beside `plain` on exact KV (one engine, submitted together).
fn run_both(
    model: &Arc<Model>,
    sparse: SparseConfig,
    long: &[u32],
    plain: &[u32],
    params: &SamplingParams,
) -> (String, String, Vec<(usize, usize, bool)>) {
    let dir = tempfile::tempdir().unwrap();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20);
    let retired = Arc::new(Mutex::new(Vec::new()));
    let policy = SparseFor {
        inner: SessionStore::new(pool.clone(), model.fingerprint),
        pool: pool.clone(),
        model: model.clone(),
        sparse,
        dir: dir.path().to_path_buf(),
        retired: retired.clone(),
    };
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending, pool) = (model.clone(), pending.clone(), pool.clone());
        let config = SchedulerConfig { prefill_chunk: 16, ..SchedulerConfig::default() };
        std::thread::spawn(move || run_engine(&model, pool, config, Box::new(policy), Arc::new(Metrics::default()), pending, rx))
    };
    let sinks = [Collect::default(), Collect::default()];
    for (owner, tokens, sink) in [("long", long, &sinks[0]), ("plain", plain, &sinks[1])] {
        pending.fetch_add(1, Relaxed);
        tx.send(Command::Submit(Job::from_tokens(owner.into(), tokens.to_vec(), params.clone()), Box::new(sink.clone()), Instant::now()))
            .unwrap();
    }
    drop(tx);
    engine.join().unwrap();
    let (l, p) = (sinks[0].outcome(), sinks[1].outcome());
    assert!(l.1.is_some() && p.1.is_some(), "both jobs finished: {l:?} {p:?}");
    assert_eq!(pool.used(), 0, "every block and charge went back to the pool");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the offload file is removed with its cache");
    let r = retired.lock().unwrap().clone();
    (l.0, p.0, r)
}

#[test]
fn a_sparse_cache_decodes_beside_an_exact_sequence_which_is_unchanged() {
    let (_dir, model) = tiny();
    let long: Vec<u32> = (0..300u32).map(|i| 5 + (i * 7919 + i * i * 31) % 200).collect();
    let plain = ids(&model, "def parse_args(argv):");
    let params = SamplingParams { max_tokens: 12, ignore_eos: true, ..Default::default() };
    let exact_pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20);
    let want_plain = LoneSequence::new(&model, &exact_pool).generate(&plain, &params, &mut |_| true).unwrap().text;
    let want_long = LoneSequence::new(&model, &exact_pool).generate(&long, &params, &mut |_| true).unwrap().text;

    // Sparse for real: 8 keys retrieved of ~300, besides 4 sinks and 16 recent.
    let sparse = SparseConfig { budget: 8, sinks: 4, recent: 16, ..SparseConfig::new(Method::DYNAKV) };
    let (_, got_plain, retired) = run_both(&model, sparse, &long, &plain, &params);
    assert_eq!(got_plain, want_plain, "the exact sequence batched beside a sparse one = alone");
    assert_eq!(retired.len(), 1, "the sparse cache came back once");
    let (held, tokens, offloaded) = retired[0];
    assert_eq!(held, tokens, "the sparse cache holds exactly the retired tokens");
    assert_eq!(tokens, long.len() + params.max_tokens - 1, "prompt + every fed token (the last sampled is not fed)");
    assert!(offloaded, "its older KV went to the file (8 KiB of RAM for ~80 KiB of KV)");

    // A budget covering the history: sparse attention attends every key, so it answers as
    // exact attention over the same f16 KV does.
    let covering = SparseConfig { budget: 4096, sinks: 4, recent: 16, ..SparseConfig::new(Method::DYNAKV) };
    let (got_long, got_plain, _) = run_both(&model, covering, &long, &plain, &params);
    assert_eq!(got_plain, want_plain);
    assert_eq!(got_long, want_long, "a covering budget over offloaded KV = exact attention");
}

/// The `tiny` fixture (random weights) from its HF folder; keep the folder alive.
fn tiny() -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let shape = engram_fixture::Shape::Tiny;
    let files = engram_fixture::generate(shape, engram_fixture::DEFAULT_SEED, dir.path(), &[engram_fixture::GgufFormat::Q8_0], &mut |_| {})
        .unwrap();
    (dir, Arc::new(Model::load(&files.hf_dir).unwrap()))
}

/// `text`'s token ids, no special tokens.
fn ids(m: &Model, text: &str) -> Vec<u32> {
    m.tokenizer.encode(text, false).unwrap().ids
}

/// Collects a job's events.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<Event>>>);

impl EventSink for Collect {
    fn send(&self, event: Event) -> bool {
        self.0.lock().unwrap().push(event);
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

impl Collect {
    /// The streamed text and how the job finished.
    fn outcome(&self) -> (String, Option<engram_engine::FinishReason>) {
        let events = self.0.lock().unwrap();
        let text = events.iter().filter_map(|e| if let Event::Text(t) = e { Some(t.as_str()) } else { None }).collect();
        let finish = events.iter().find_map(|e| if let Event::Finished { finish, .. } = e { Some(*finish) } else { None });
        (text, finish)
    }
}
