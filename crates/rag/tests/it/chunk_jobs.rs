//! Blended RAG admission through a real engine thread (pycode-7m, f16 KV): a request whose
//! system prompt and chunks its tenant's chunk store lacks waits while the engine prefills
//! them as background jobs (the policy's admission runs no model: every piece in the store
//! came from a job's end), the engine's step repairs the moved chunks, and at ratio 1 the
//! answer is the cold one; a request whose pieces are stored queues no job; a failing chunk
//! job fails its request with an error naming the piece, once, and the engine goes on; pieces
//! evicted before admission are prefilled again a bounded number of times, then the request
//! fails saying so.

use crate::common;
use common::{Cold, Sink};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use engram_engine::{run_engine, Command, Job, Metrics, SamplingParams, SchedulerConfig};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_policy::{BackgroundDone, ContextPolicy, OwnerKey, PolicyLayer};
use engram_rag::{ChunkReuse, PromptSegments, SegmentRegistry, TreeCounters, TreePolicy, DEFAULT_SYSTEM_PROMPT};

/// The tree policy with every background job's end turned into an error ("injected fault"):
/// what a job that faults in the engine hands back.
struct FailingJobs(TreePolicy);

impl PolicyLayer for FailingJobs {
    fn inner(&self) -> &dyn ContextPolicy {
        &self.0
    }
    fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
        &mut self.0
    }
    fn background_done(&mut self, done: BackgroundDone) {
        ContextPolicy::background_done(&mut self.0, BackgroundDone { outcome: Err("injected fault".into()), ..done });
    }
}

/// The tree policy emptying its stores after every background job's end (`make_room` of more
/// than it holds): what a KV budget too small for one prompt's chunks does.
struct EvictingStores(TreePolicy);

impl PolicyLayer for EvictingStores {
    fn inner(&self) -> &dyn ContextPolicy {
        &self.0
    }
    fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
        &mut self.0
    }
    fn background_done(&mut self, done: BackgroundDone) {
        ContextPolicy::background_done(&mut self.0, done);
        ContextPolicy::make_room(&mut self.0, usize::MAX);
    }
}

/// Which wrapper the test's engine runs the tree policy in.
#[derive(Clone, Copy, PartialEq)]
enum Wrap {
    Plain,
    Failing,
    Evicting,
}

/// An engine thread over `TreePolicy`, wrapped as `wrap` says.
struct Engine {
    tx: mpsc::Sender<Command>,
    pending: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    registry: SegmentRegistry,
    counters: Arc<TreeCounters>,
    thread: std::thread::JoinHandle<()>,
}

fn engine(model: &Arc<Model>, wrap: Wrap) -> Engine {
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 256 << 20);
    let registry = SegmentRegistry::default();
    let policy = TreePolicy::new(Box::new(Cold(pool.clone())), registry.clone(), pool.clone(), model.clone(), 64 << 20);
    let counters = policy.counters();
    let policy: Box<dyn ContextPolicy> = match wrap {
        Wrap::Plain => Box::new(policy),
        Wrap::Failing => Box::new(FailingJobs(policy)),
        Wrap::Evicting => Box::new(EvictingStores(policy)),
    };
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let metrics = Arc::new(Metrics::default());
    let thread = {
        let (model, pending, metrics) = (model.clone(), pending.clone(), metrics.clone());
        std::thread::spawn(move || run_engine(&model, pool, SchedulerConfig::default(), policy, metrics, pending, rx))
    };
    Engine { tx, pending, metrics, registry, counters, thread }
}

/// A RAG prompt: the system prompt, three chunks (segments "c0".."c2"), the question.
fn segments(model: &Model, question: &str, chunk_order: [usize; 3]) -> PromptSegments {
    const CHUNKS: [&str; 3] = [
        "From: Alice. The budget review moved to Thursday at 3 pm in room Fjord.",
        "Meeting notes: Dana owns the disk format. Eli writes the benchmark.",
        "Event: Lunch with Carol. When: Friday noon. Where: Green Cafe.",
    ];
    let enc = |t: &str, special: bool| model.tokenizer.encode(t, special).unwrap().ids;
    let mut tokens = enc(DEFAULT_SYSTEM_PROMPT, true);
    let (mut path, mut ends) = (vec!["sys:test".to_string()], vec![tokens.len()]);
    for c in chunk_order {
        tokens.extend(enc(&format!("\n{}", CHUNKS[c]), false));
        ends.push(tokens.len());
        path.push(format!("c{c}"));
    }
    tokens.extend(enc(&format!("\nQuestion: {question}\nAnswer:"), false));
    PromptSegments { tenant: "t".into(), path, ends, tokens, tree_dir: None, reuse: ChunkReuse::Blend { ratio: 1.0 }, chunk_dir: None }
}

impl Engine {
    /// Submits `seg`'s prompt as a RAG job (registered) or, with `rag` false, as a plain cold
    /// request of another owner; greedy, `max_tokens` tokens.
    fn ask(&self, seg: &PromptSegments, rag: bool) -> (OwnerKey, Sink) {
        let owner = if rag { self.registry.register(seg.clone()) } else { OwnerKey::parse("cold") };
        let params = SamplingParams { max_tokens: 8, ignore_eos: true, ..SamplingParams::default() };
        let sink = Sink::default();
        self.pending.fetch_add(1, Relaxed);
        let job = Job::from_tokens(owner.clone(), seg.tokens.clone(), params);
        self.tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
        (owner, sink)
    }

    /// Waits until nothing is queued or running.
    fn settle(&self) {
        let t0 = Instant::now();
        while self.pending.load(Relaxed) > 0 {
            assert!(t0.elapsed().as_secs() < 120, "the engine did not finish its requests");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn stop(self) {
        drop(self.tx);
        self.thread.join().unwrap();
    }
}

#[test]
fn missing_chunk_kv_is_prefilled_by_background_jobs_and_the_answer_stays_cold() {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let e = engine(&model, Wrap::Plain);
    let seg = segments(&model, "When is the budget review?", [0, 1, 2]);
    let (_, cold) = e.ask(&seg, false);
    e.settle();
    let cold = cold.outcome().expect("the cold request answered");
    assert_eq!(e.metrics.background_jobs.load(Relaxed), 0, "a plain request queues nothing");

    // Nothing stored: the system prompt's job, then one job per chunk, before admission.
    let (owner, blended) = e.ask(&seg, true);
    e.settle();
    assert_eq!(blended.outcome().expect("the blended request answered"), cold, "ratio 1 = the cold answer");
    assert_eq!(e.metrics.background_jobs.load(Relaxed), 4, "the system prompt and three chunks, as background jobs");
    assert_eq!(e.metrics.background_failed.load(Relaxed), 0);
    // Every piece the store holds came from a job's end: admission assembled, it computed nothing.
    assert_eq!(e.counters.blend_chunk_jobs.load(Relaxed), 4);
    let b = e.registry.take_blend(&owner).expect("a blended admission reports");
    assert_eq!((b.stats.chunks_computed, b.stats.chunks_reused), (3, 0));
    assert_eq!(b.tokens_computed, seg.ends[3], "the system prompt and the chunks were prefilled for it");
    assert_eq!(b.stats.recomputed_tokens, b.stats.moved_tokens);
    assert_eq!(b.stats.moved_tokens, seg.ends[3] - seg.ends[1], "every chunk but the first moved");

    // Stored now, in another order: no job, every chunk reused, still the cold answer.
    let reordered = segments(&model, "When is the budget review?", [2, 0, 1]);
    let (_, cold2) = e.ask(&reordered, false);
    let (owner2, again) = e.ask(&reordered, true);
    e.settle();
    assert_eq!(again.outcome().unwrap(), cold2.outcome().unwrap(), "ratio 1 = the cold answer in any order");
    assert_eq!(e.metrics.background_jobs.load(Relaxed), 4, "nothing was missing");
    let b = e.registry.take_blend(&owner2).unwrap();
    assert_eq!((b.stats.chunks_computed, b.stats.chunks_reused, b.tokens_computed), (0, 3, 0));
    assert_eq!(e.counters.blend_jobs.load(Relaxed), 2);
    e.stop();
}

#[test]
fn a_failing_chunk_job_fails_its_request_with_an_error_naming_it() {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let e = engine(&model, Wrap::Failing);
    let seg = segments(&model, "Who owns the disk format?", [1, 0, 2]);
    let (_, failed) = e.ask(&seg, true);
    e.settle();
    let err = failed.outcome().expect_err("the request fails");
    assert!(err.contains("admitting the request"), "{err}");
    assert!(err.contains("prefilling the system prompt of the prompt failed: injected fault"), "{err}");
    // Failed once, not retried: the one job (the system prompt's) ran.
    assert_eq!(e.metrics.background_jobs.load(Relaxed), 1);
    assert_eq!(e.counters.blend_chunk_jobs.load(Relaxed), 0, "nothing entered the store");
    // The engine goes on: a plain request answers.
    let (_, plain) = e.ask(&seg, false);
    e.settle();
    assert!(plain.outcome().is_ok());
    e.stop();
}

#[test]
fn chunk_kv_evicted_before_admission_is_prefilled_again_a_bounded_number_of_times() {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let e = engine(&model, Wrap::Evicting);
    let seg = segments(&model, "When is lunch with Carol?", [2, 1, 0]);
    let (_, failed) = e.ask(&seg, true);
    e.settle();
    let err = failed.outcome().expect_err("the request fails rather than wait for ever");
    assert!(err.contains("still missing after 4 rounds of prefill jobs"), "{err}");
    // Each round's system prompt job ended and was dropped again; no fifth round.
    assert_eq!(e.metrics.background_jobs.load(Relaxed), 4);
    e.stop();
}
