//! Summaries the engine runs (the summarizer is the engine's own model), through the real
//! scheduler: a fact past the cap while a long request decodes is summarized *under that load*
//! (low-priority background jobs in the same steps) and swapped in before the request ends; the
//! request, admitted before the swap, answers over the old stream — what a cold run over it
//! answers —, the next turn over the new one; the summary is the one the summarizer's own loop
//! writes; facts that change mid-flight drop the result and summarize the new facts.

use crate::common;
use common::{fact, ids, tiny, Collect};

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use engram_dual::{DualControl, DualStats, DualStream, FactSegment, Summarizer};
use engram_engine::{drain_background, PolicyLayer};
use engram_engine::{
    run_engine, Command, ContextPolicy, Job, LoneSequence, Metrics, PolicyControl, Retired, SamplingParams, SchedulerConfig,
};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_policy::{AdmitRequest, BackgroundDone, BackgroundJob, BackgroundPriority, Checkout};

/// What the test reads of the policy: its counters and stream after every retirement and
/// background job, and the summaries counted when each thread's turn retired.
#[derive(Default)]
struct Seen {
    stats: DualStats,
    stream: Vec<u32>,
    at_retire: Vec<(String, u64)>,
}

struct Watch {
    inner: DualStream,
    seen: Arc<Mutex<Seen>>,
    /// Low-priority jobs (summaries) held back until a request of thread `busy` is admitted,
    /// so the summary runs under that request's load whatever the order in which the engine
    /// reads the test's messages (alone, the tiny model's summary can end, and swap the
    /// stream, before the request arrives).
    held: std::collections::VecDeque<BackgroundJob>,
    released: bool,
}

impl Watch {
    fn publish(&self) {
        let mut s = self.seen.lock().unwrap();
        s.stats = self.inner.dual_stats();
        s.stream = self.inner.persistent("u").map(|p| p.tokens()).unwrap_or_default();
    }
}

impl PolicyLayer for Watch {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.released |= req.session == Some("busy");
        self.inner.admit(req)
    }
    fn next_background(&mut self) -> Option<BackgroundJob> {
        while let Some(job) = self.inner.next_background() {
            if self.released || job.priority != BackgroundPriority::Low {
                return Some(job);
            }
            self.held.push_back(job);
        }
        if self.released {
            self.held.pop_front()
        } else {
            None
        }
    }
    fn retire(&mut self, r: Retired) {
        let thread = r.session_id.clone();
        self.inner.retire(r);
        self.publish();
        let summaries = self.inner.dual_stats().summaries;
        self.seen.lock().unwrap().at_retire.push((thread, summaries));
    }
    fn background_done(&mut self, done: BackgroundDone) {
        self.inner.background_done(done);
        self.publish();
    }
}

fn summarizer(m: &Arc<Model>) -> Summarizer {
    let render = {
        let m = m.clone();
        Arc::new(move |text: &str| Ok(ids(&m, &format!(" Summary: {text}."))))
    };
    Summarizer::new(m.clone(), 10, render)
}

fn facts(m: &Model, n: u64) -> Vec<FactSegment> {
    (1..=n).map(|i| fact(m, i, &format!("Ann's number {i} is {}", i * 7))).collect()
}

/// What a cold run over `window` then `prompt` answers, greedy, `n` tokens.
fn cold_answer(m: &Model, window: &[u32], prompt: &[u32], n: usize) -> String {
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let all: Vec<u32> = window.iter().chain(prompt).copied().collect();
    let params = SamplingParams { max_tokens: n, ignore_eos: true, ..Default::default() };
    LoneSequence::new(m, &pool).generate(&all, &params, &mut |_| true).unwrap().text
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(120), "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_summary_runs_under_load_and_the_next_turn_attends_it() {
    let (_d, m) = tiny();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let base = ids(&m, "System: answer in one line.");
    let cap = base.len() + facts(&m, 3).iter().map(|f| f.tokens.len()).sum::<usize>();
    let mut dual = DualStream::new(m.clone(), pool.clone(), 4096).with_persistent_cap(cap, Some(summarizer(&m)));
    dual.set_anchors("u", base.clone());
    dual.set_facts("u", facts(&m, 3));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    // The whole share: the test is about where the work runs, `bench background` about its cost.
    let config = SchedulerConfig { background_share: 1.0, ..SchedulerConfig::default() };
    let engine = {
        let (model, pending, pool) = (m.clone(), pending.clone(), pool.clone());
        let watch = Watch { inner: dual, seen: seen.clone(), held: Default::default(), released: false };
        std::thread::spawn(move || run_engine(&model, pool, config, Box::new(watch), Arc::new(Metrics::default()), pending, rx))
    };
    let submit = |thread: &str, prompt: &[u32], n: usize| -> Collect {
        let sink = Collect::default();
        let params = SamplingParams { max_tokens: n, ignore_eos: true, ..Default::default() };
        let job = Job { session: Some(thread.into()), ..common::job("u", prompt, &params) };
        pending.fetch_add(1, SeqCst);
        tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
        sink
    };
    let answer = |sink: &Collect| {
        wait_until("the turn's end", || sink.outcome().1.is_some());
        sink.outcome().0
    };
    let prompt = ids(&m, " User: who am I? Assistant:");

    // The stream (base + 3 facts, at the cap) prefilled by a first turn.
    answer(&submit("warm", &ids(&m, " User: hello. Assistant:"), 1));
    let old: Vec<u32> = base.iter().copied().chain(facts(&m, 4).into_iter().flat_map(|f| f.tokens)).collect();

    // A fourth fact (over the cap: a summary queued) with a long request right behind it.
    tx.send(Command::Control(PolicyControl::new(DualControl::Facts { user: "u".into(), facts: facts(&m, 4) }))).unwrap();
    let long = 160;
    let busy = submit("busy", &prompt, long);
    let busy_answer = answer(&busy);
    let seen_now = |f: &dyn Fn(&Seen) -> bool| f(&seen.lock().unwrap());
    assert!(
        seen_now(&|s| s.at_retire.iter().any(|(t, n)| t == "busy" && *n == 1)),
        "the summary was swapped in while the long request decoded: {:?}",
        seen.lock().unwrap().at_retire
    );
    assert_eq!(busy_answer, cold_answer(&m, &old, &prompt, long), "a request admitted before the swap answers over the old stream");

    // The stream swapped in is base + the summary the summarizer's own loop writes.
    let texts: Vec<String> = facts(&m, 4).into_iter().map(|f| f.text).collect();
    let (_, summary) = summarizer(&m).summarize(&texts).unwrap();
    let new: Vec<u32> = base.iter().copied().chain(summary).collect();
    assert_eq!(seen.lock().unwrap().stream, new, "base + the summary");
    let after = answer(&submit("t2", &prompt, 6));
    assert_eq!(after, cold_answer(&m, &new, &prompt, 6), "the next turn answers over the new stream");
    let st = seen.lock().unwrap().stats;
    assert_eq!((st.summaries, st.summary_slices), (1, 0), "{st:?}: run by the engine, not on the idle hook");
    drop(tx);
    engine.join().unwrap();
}

#[test]
fn facts_changing_mid_summary_drop_its_result_and_summarize_the_new_facts() {
    let (_d, m) = tiny();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let base = ids(&m, "System: answer in one line.");
    let cap = base.len() + facts(&m, 3).iter().map(|f| f.tokens.len()).sum::<usize>();
    let mut p = DualStream::new(m.clone(), pool.clone(), 256).with_persistent_cap(cap, Some(summarizer(&m)));
    p.set_anchors("u", base.clone());
    p.set_facts("u", facts(&m, 4));
    // Queued, not run: the policy never runs the model itself.
    let first = p.next_background().expect("a summary job for the engine");
    assert!(p.summary_pending("u") && p.dual_stats().summaries == 0);
    let mut newer = facts(&m, 4);
    newer.push(fact(&m, 5, "Ann moved to Bergen"));
    p.set_facts("u", newer.clone());
    assert_eq!(p.dual_stats().summaries_restarted, 1);
    // The dropped job still ends (the engine runs what it took): its result is not used.
    let mut lent = common::Requeue { inner: p, first: Some(first) };
    drain_background(&m, pool.clone(), &mut lent);
    let p = lent.inner;
    assert_eq!(p.dual_stats().summaries, 1, "one summary swapped in: the new facts'");
    assert!(!p.summary_pending("u"));
    let texts: Vec<String> = newer.iter().map(|f| f.text.clone()).collect();
    let (_, tokens) = summarizer(&m).summarize(&texts).unwrap();
    let want: Vec<u32> = base.iter().copied().chain(tokens).collect();
    assert_eq!(p.persistent("u").unwrap().tokens(), want);
}
