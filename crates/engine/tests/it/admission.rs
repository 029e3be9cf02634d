//! Admission waits instead of refusing. With a KV budget that holds one
//! long prompt but not two, four such requests submitted at once all complete — each with the
//! text it gets alone — because a request joins the batch only when its prompt fits beside
//! the running prefills. A prompt larger than the whole budget fails at once as a bad request
//! naming the bytes; a request that waits longer than `admission_wait` fails as unavailable.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common;
use common::{tiny, Collect};
use engram_engine::{
    run_engine, Command, Event, EventSink, FinishReason, JobErrorKind, LoneSequence, Metrics, SamplingParams, SchedulerConfig,
};
use engram_kv::{KvFormat, KvLayout, KvPool, BLOCK_TOKENS};
use engram_model::Model;

/// Runs `jobs` submitted at once with `params` on an engine with `budget` bytes of f32 KV;
/// returns each job's events.
fn run(model: &Arc<Model>, budget: usize, config: SchedulerConfig, jobs: &[Vec<u32>], params: &SamplingParams) -> Vec<Collect> {
    let owned: Vec<(String, Vec<u32>)> = jobs.iter().enumerate().map(|(i, p)| (format!("user{i}"), p.clone())).collect();
    run_owned(model, budget, config, &owned, params, &|_| {}).0
}

/// A sink that also logs, in one list shared by all jobs, when its job starts.
#[derive(Clone)]
struct Logged {
    index: usize,
    log: Arc<std::sync::Mutex<Vec<usize>>>,
    events: Collect,
}

impl EventSink for Logged {
    fn send(&self, event: Event) -> bool {
        if matches!(event, Event::Started { .. }) {
            self.log.lock().unwrap().push(self.index);
        }
        self.events.send(event)
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// [`run`] with each job's owner key given (submitted in order); `before(i)` runs before job
/// `i` is submitted. Also returns the jobs' indices in the order they started.
fn run_owned(
    model: &Arc<Model>,
    budget: usize,
    config: SchedulerConfig,
    jobs: &[(String, Vec<u32>)],
    params: &SamplingParams,
    before: &dyn Fn(usize),
) -> (Vec<Collect>, Vec<usize>) {
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending) = (model.clone(), pending.clone());
        let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, budget);
        std::thread::spawn(move || {
            run_engine(&model, pool.clone(), config, common::sessions(&model, &pool), Arc::new(Metrics::default()), pending, rx)
        })
    };
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sinks: Vec<Collect> = jobs.iter().map(|_| Collect::default()).collect();
    for (i, ((owner, prompt), sink)) in jobs.iter().zip(&sinks).enumerate() {
        before(i);
        pending.fetch_add(1, Relaxed);
        let logged = Logged { index: i, log: log.clone(), events: sink.clone() };
        tx.send(Command::Submit(common::job(owner, prompt, params), Box::new(logged), Instant::now())).unwrap();
    }
    drop(tx);
    engine.join().unwrap();
    let order = log.lock().unwrap().clone();
    (sinks, order)
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
        let want = LoneSequence::new(&model, &alone).generate(prompt, &params, &mut |_| true).unwrap();
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

/// One account saturating the server does not delay another's request
/// behind its queue. Account `a` (two owner keys: an agent and a plain session) submits eight
/// requests, then account `b` one; with a batch of 4 and the default share (3 slots per
/// account) `b`'s request starts among the first four, not ninth as first-come-first-served
/// would have it, and every answer is still the one it gets alone.
#[test]
fn one_account_saturating_the_batch_does_not_delay_another() {
    let (_d, model) = tiny();
    let params = SamplingParams { max_tokens: 24, ignore_eos: true, ..Default::default() };
    let config = SchedulerConfig { max_batch: 4, prefill_chunk: 32, ..SchedulerConfig::default() };
    assert_eq!(config.active_per_tenant(), 3);
    let mut jobs: Vec<(String, Vec<u32>)> = (0..8u32)
        .map(|j| {
            let owner = if j % 2 == 0 { "a\u{1f}agent:x".to_string() } else { "a".to_string() };
            (owner, (0..40u32).map(|i| 5 + (i * 7 + j * 13) % 90).collect())
        })
        .collect();
    jobs.push(("b".into(), (0..40u32).map(|i| 7 + (i * 5) % 80).collect()));
    let (sinks, order) = run_owned(&model, 64 << 20, config, &jobs, &params, &|_| {});
    let b_at = order.iter().position(|&i| i == 8).expect("b started");
    assert!(b_at <= 3, "b started {}th of 9 ({order:?})", b_at + 1);
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20);
    for (i, (sink, (_, prompt))) in sinks.iter().zip(&jobs).enumerate() {
        let want = LoneSequence::new(&model, &pool).generate(prompt, &params, &mut |_| true).unwrap();
        assert_eq!(sink.outcome(), (want.text, Some(FinishReason::Length)), "request {i}");
    }
}

#[test]
fn accounts_are_the_text_before_the_separator() {
    assert_eq!(engram_engine::scheduler::account("alice\u{1f}agent:bot"), "alice");
    assert_eq!(engram_engine::scheduler::account("alice"), "alice");
    let c = SchedulerConfig { max_batch: 1, ..SchedulerConfig::default() };
    assert_eq!(c.active_per_tenant(), 1);
    let c = SchedulerConfig { max_batch: 16, ..SchedulerConfig::default() };
    assert_eq!(c.active_per_tenant(), 12);
    let c = SchedulerConfig { max_batch: 16, max_active_per_tenant: Some(16), ..SchedulerConfig::default() };
    assert_eq!(c.active_per_tenant(), 16);
}
