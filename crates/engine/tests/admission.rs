//! Issue 19 item 12: admission waits instead of refusing. With a KV budget that holds one
//! long prompt but not two, four such requests submitted at once all complete — each with the
//! text it gets alone — because a request joins the batch only when its prompt fits beside
//! the running prefills. A prompt larger than the whole budget fails at once as a bad request
//! naming the bytes; a request that waits longer than `admission_wait` fails as unavailable.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::Collect;
use engram_engine::{run_engine, Command, Event, FinishReason, Generator, JobErrorKind, Metrics, SamplingParams, SchedulerConfig};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, BLOCK_TOKENS};
use engram_model::Model;

fn tiny() -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    (dir, model)
}

/// Runs `jobs` (owner, prompt) submitted at once with `params` on an engine with `budget`
/// bytes of f32 KV; returns each job's events.
fn run(model: &Arc<Model>, budget: usize, config: SchedulerConfig, jobs: &[Vec<u32>], params: &SamplingParams) -> Vec<Collect> {
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending) = (model.clone(), pending.clone());
        let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, budget);
        std::thread::spawn(move || run_engine(&model, pool, config, Arc::new(Metrics::default()), pending, rx))
    };
    let sinks: Vec<Collect> = jobs.iter().map(|_| Collect::default()).collect();
    for (i, (prompt, sink)) in jobs.iter().zip(&sinks).enumerate() {
        pending.fetch_add(1, Relaxed);
        tx.send(Command::Submit(common::job(&format!("user{i}"), prompt, params), Box::new(sink.clone()), Instant::now())).unwrap();
    }
    drop(tx);
    engine.join().unwrap();
    sinks
}

fn failure(sink: &Collect) -> Option<(JobErrorKind, String)> {
    sink.0.lock().unwrap().iter().find_map(|e| if let Event::Failed(e) = e { Some((e.kind, e.message.clone())) } else { None })
}

/// Four distinct prompts of `n` tokens.
fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..4u32).map(|j| (0..n as u32).map(|i| 5 + (i * 7 + j * 13) % 90).collect()).collect()
}

#[test]
fn requests_that_fit_alone_all_complete_when_submitted_together() {
    let (_d, model) = tiny();
    let block = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 1).block_bytes();
    // 200-token prompts (7 blocks) + 16 decoded tokens; the budget holds 10 blocks: one
    // request, not two.
    let jobs = prompts(200);
    let params = SamplingParams { max_tokens: 16, ignore_eos: true, ..Default::default() };
    let config = SchedulerConfig { prefill_chunk: 32, ..SchedulerConfig::default() };
    let sinks = run(&model, 10 * block, config, &jobs, &params);
    let alone = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 10 * block);
    for (i, (sink, prompt)) in sinks.iter().zip(&jobs).enumerate() {
        assert_eq!(failure(sink), None, "request {i} failed");
        let want = Generator::new(&model, &alone).generate(prompt, &params, &mut |_| true).unwrap();
        assert_eq!(sink.outcome(), (want.text, Some(FinishReason::Length)), "request {i}");
    }
    assert!(200usize.div_ceil(BLOCK_TOKENS) * 2 > 10, "the budget does not hold two prompts");
}

#[test]
fn a_prompt_larger_than_the_budget_is_a_bad_request_naming_the_bytes() {
    let (_d, model) = tiny();
    let block = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 1).block_bytes();
    let params = SamplingParams { max_tokens: 4, ..Default::default() };
    let sinks = run(&model, 4 * block, SchedulerConfig::default(), &prompts(200)[..1], &params);
    let (kind, message) = failure(&sinks[0]).expect("it fails");
    assert_eq!(kind, JobErrorKind::BadRequest, "{message}");
    assert!(message.contains(&format!("{} bytes", 7 * block)) && message.contains(&format!("{} bytes", 4 * block)), "{message}");
}

#[test]
fn a_request_waits_at_most_admission_wait() {
    let (_d, model) = tiny();
    let block = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 1).block_bytes();
    // The first request decodes long enough to hold the budget past the second's wait.
    let params = SamplingParams { max_tokens: 64, ignore_eos: true, ..Default::default() };
    let config = SchedulerConfig { admission_wait: Duration::from_millis(1), ..SchedulerConfig::default() };
    let sinks = run(&model, 10 * block, config, &prompts(200)[..2], &params);
    assert_eq!(failure(&sinks[0]), None);
    let (kind, message) = failure(&sinks[1]).expect("the second waits too long");
    assert_eq!(kind, JobErrorKind::Unavailable, "{message}");
    assert!(message.contains("retry later"), "{message}");
}
