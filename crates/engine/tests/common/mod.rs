//! What the engine's integration tests share: the tiny fixture model, token ids from text, an
//! `EventSink` that keeps a job's events, a job from token ids, and the `ContextPolicy` methods
//! a test policy takes unchanged from the session store.

#![allow(dead_code, unused_macros, unused_imports)]

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use engram_engine::{run_engine, Command, ContextPolicy, Event, EventSink, FinishReason, Job, Metrics, SamplingParams, SchedulerConfig};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

/// The tiny random-weight fixture (Q8_0 GGUF written, loaded from its HF folder), with the
/// directory that must outlive it.
pub fn tiny() -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    (dir, model)
}

/// `text`'s token ids, no special tokens.
pub fn ids(m: &Model, text: &str) -> Vec<u32> {
    m.tokenizer.encode(text, false).unwrap().ids
}

/// Collects a job's events.
#[derive(Clone, Default)]
pub struct Collect(pub Arc<Mutex<Vec<Event>>>);

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
    pub fn outcome(&self) -> (String, Option<FinishReason>) {
        let events = self.0.lock().unwrap();
        let text = events.iter().filter_map(|e| if let Event::Text(t) = e { Some(t.as_str()) } else { None }).collect();
        let finish = events.iter().find_map(|e| if let Event::Finished { finish, .. } = e { Some(*finish) } else { None });
        (text, finish)
    }
}

/// A job for `owner` given as token ids (no text, no special tokens added, no session).
pub fn job(owner: &str, prompt: &[u32], params: &SamplingParams) -> Job {
    Job::from_tokens(owner.into(), prompt.to_vec(), params.clone())
}

/// A test policy's `PolicyLayer` inner policy: its `inner` field (a `SessionStore` or a
/// `DualStream`). The tests override only the methods they vary; the rest forward.
macro_rules! inner_layer {
    () => {
        fn inner(&self) -> &dyn engram_engine::ContextPolicy {
            &self.inner
        }
        fn inner_mut(&mut self) -> &mut dyn engram_engine::ContextPolicy {
            &mut self.inner
        }
    };
}
pub(crate) use inner_layer;

/// Each job's text, completion tokens and finish, and the engine's metrics.
pub type Run = (Vec<(String, usize, Option<FinishReason>)>, Arc<Metrics>);

/// Runs `jobs` (prompt, params) submitted together before the engine starts (so its first
/// step sees them all) to one engine with `config`, its KV in `format` (a 256 MiB pool), on
/// this thread until all finish.
pub fn run_jobs(model: &Arc<Model>, format: KvFormat, config: SchedulerConfig, jobs: &[(String, SamplingParams)]) -> Run {
    let (tx, rx) = mpsc::channel();
    let (pending, metrics) = (Arc::new(AtomicUsize::new(0)), Arc::new(Metrics::default()));
    let sinks: Vec<Collect> = jobs.iter().map(|_| Collect::default()).collect();
    for (i, ((prompt, params), sink)) in jobs.iter().zip(&sinks).enumerate() {
        let ids = model.tokenizer.encode(prompt, true).unwrap().ids;
        pending.fetch_add(1, Relaxed);
        tx.send(Command::Submit(job(&format!("t{i}"), &ids, params), Box::new(sink.clone()), Instant::now())).unwrap();
    }
    drop(tx);
    let pool = KvPool::new(KvLayout::of(&model.config), format, 256 << 20);
    run_engine(model, pool.clone(), config, sessions(model, &pool), metrics.clone(), pending, rx);
    let outcomes = sinks
        .iter()
        .map(|s| {
            let (text, finish) = s.outcome();
            let n = s.0.lock().unwrap().iter().find_map(|e| match e {
                Event::Finished { completion_tokens, .. } => Some(*completion_tokens),
                _ => None,
            });
            (text, n.unwrap_or(0), finish)
        })
        .collect();
    (outcomes, metrics)
}

/// The session policy with its default configuration (RAM only), for `model`'s caches in `pool`.
pub fn sessions(model: &Model, pool: &KvPool) -> Box<dyn ContextPolicy> {
    Box::new(engram_context::SessionStore::from_config(model, pool, &engram_context::SessionsConfig::default()))
}

/// Deterministic token runs: system prompt, chunk A, chunk B, question.
pub fn parts(m: &Model) -> [Vec<u32>; 4] {
    let v = m.config.vocab as u32;
    let run = |seed: u32, n: u32| (0..n).map(|i| (seed * 7919 + i * 104_729) % (v - 3) + 3).collect::<Vec<u32>>();
    [run(1, 9), run(2, 37), run(3, 29), run(4, 6)]
}

/// Prefills `tokens` into `kv` after what it holds, on the model's forward pass alone (the
/// reference a repair is checked against).
pub fn prefill(m: &Model, kv: &mut SeqKv, tokens: &[u32]) {
    kv.reserve(tokens.len()).unwrap();
    let first = kv.len();
    m.forward(&mut [SeqStep::new(tokens, first, kv, Logits::None)]).unwrap();
}
