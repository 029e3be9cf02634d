//! A summary on the idle hook gives way to requests, through the scheduler:
//! a job submitted while the summary is in flight is answered over the old stream — what a
//! cold run over the old stream's window answers — and the summary is not swapped in under it;
//! the summary then completes, and a turn after it attends the new stream — what a cold run
//! over the new window answers. The summarizer is a model of its own (with the engine's model,
//! summaries are the engine's background jobs: `summary_in_engine.rs`).

use crate::common;
use common::{fact, ids, tiny_with_own_summarizer, Collect};

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use engram_dual::DualControl;
use engram_dual::{DualStats, DualStream, FactSegment, Summarizer};
use engram_engine::PolicyControl;
use engram_engine::{
    run_engine, Command, ContextPolicy, IdleInterrupt, Job, LoneSequence, Metrics, Retired, SamplingParams, SchedulerConfig,
};
use engram_engine::{AdmitRequest, PolicyLayer};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_policy::Checkout;

const ANSWER: usize = 6;

/// The policy behind a gate: an idle slice runs only while the test allows it; the counters
/// after each slice are published.
struct Gate {
    inner: DualStream,
    allow: Arc<AtomicUsize>,
    ran: Arc<AtomicUsize>,
    stats: Arc<Mutex<(DualStats, bool)>>,
}

impl PolicyLayer for Gate {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.inner.admit(req)
    }
    fn retire(&mut self, r: Retired) {
        self.inner.retire(r)
    }
    fn idle_slice(&mut self, interrupt: &IdleInterrupt) -> bool {
        if self.allow.load(SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
            return self.inner.summary_pending("u");
        }
        self.allow.fetch_sub(1, SeqCst);
        let more = self.inner.idle_slice(interrupt);
        *self.stats.lock().unwrap() = (self.inner.dual_stats(), self.inner.summary_pending("u"));
        self.ran.fetch_add(1, SeqCst);
        more
    }
}

fn summarizer(m: &Arc<Model>) -> Summarizer {
    let render = {
        let m = m.clone();
        Arc::new(move |text: &str| Ok(ids(&m, &format!(" Summary: {text}."))))
    };
    Summarizer::new(m.clone(), 10, render).with_prefill_chunk(8)
}

fn facts(m: &Model, n: u64) -> Vec<FactSegment> {
    (1..=n).map(|i| fact(m, i, &format!("Ann's number {i} is {}", i * 7))).collect()
}

/// What a cold run over `window` then `prompt` answers, greedy.
fn cold_answer(m: &Model, window: &[u32], prompt: &[u32]) -> String {
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let all: Vec<u32> = window.iter().chain(prompt).copied().collect();
    let params = SamplingParams { max_tokens: ANSWER, ignore_eos: true, ..Default::default() };
    LoneSequence::new(m, &pool).generate(&all, &params, &mut |_| true).unwrap().text
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(60), "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_job_mid_summary_answers_over_the_old_stream_and_the_next_turn_over_the_new_one() {
    let (_d, m, sm) = tiny_with_own_summarizer();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let base = ids(&m, "System: answer in one line.");
    let cap = base.len() + facts(&m, 3).iter().map(|f| f.tokens.len()).sum::<usize>();
    let mut dual = DualStream::new(m.clone(), pool.clone(), 256).with_persistent_cap(cap, Some(summarizer(&sm))).with_idle_steps(1);
    dual.set_anchors("u", base.clone());
    dual.set_facts("u", facts(&m, 3));
    let (allow, ran) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let stats = Arc::new(Mutex::new((DualStats::default(), false)));
    let gate = Gate { inner: dual, allow: allow.clone(), ran: ran.clone(), stats: stats.clone() };
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending, pool) = (m.clone(), pending.clone(), pool.clone());
        std::thread::spawn(move || {
            run_engine(&model, pool, SchedulerConfig::default(), Box::new(gate), Arc::new(Metrics::default()), pending, rx)
        })
    };
    let turn = |thread: &str, prompt: &[u32]| -> String {
        let sink = Collect::default();
        let params = SamplingParams { max_tokens: ANSWER, ignore_eos: true, ..Default::default() };
        let job = Job { session: Some(thread.into()), ..common::job("u", prompt, &params) };
        pending.fetch_add(1, SeqCst);
        tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
        wait_until("the turn's end", || sink.outcome().1.is_some());
        sink.outcome().0
    };
    let prompt = ids(&m, " User: who am I? Assistant:");

    // The stream (base + 3 facts, at the cap) prefilled by a first turn; then a fourth fact.
    turn("warm", &ids(&m, " User: hello. Assistant:"));
    tx.send(Command::Control(PolicyControl::new(DualControl::Facts { user: "u".into(), facts: facts(&m, 4) }))).unwrap();
    allow.store(3, SeqCst);
    wait_until("three slices of the summary", || ran.load(SeqCst) == 3);
    let (st, due) = *stats.lock().unwrap();
    assert!(due && st.summaries == 0 && st.summary_slices == 3, "{st:?}: the summary is in flight");

    // Mid-summary: answered over the old stream (base + the 4 facts), as a cold run over it.
    let old: Vec<u32> = base.iter().copied().chain(facts(&m, 4).into_iter().flat_map(|f| f.tokens)).collect();
    let mid = turn("t", &prompt);
    assert_eq!(mid, cold_answer(&m, &old, &prompt), "a job mid-summary answers over the old stream");
    let (st, due) = *stats.lock().unwrap();
    assert!(due && st.summaries == 0, "{st:?}: not swapped in under the job");

    // The summary completes; a turn then attends the new stream (base + the summary).
    allow.store(usize::MAX / 2, SeqCst);
    wait_until("the summary's swap", || stats.lock().unwrap().0.summaries == 1);
    let texts: Vec<String> = facts(&m, 4).into_iter().map(|f| f.text).collect();
    let (_, summary) = summarizer(&sm).summarize(&texts).unwrap();
    let new: Vec<u32> = base.iter().copied().chain(summary).collect();
    let after = turn("t2", &prompt);
    assert_eq!(after, cold_answer(&m, &new, &prompt), "the next turn answers over the new stream");
    assert_ne!(mid, after, "the old and new windows give different answers here");
    drop(tx);
    engine.join().unwrap();
}
