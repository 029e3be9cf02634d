//! Summaries that give way to requests: the summarizer's job stopped after
//! every step, or at an interrupt, and resumed gives bit for bit the summary one uninterrupted
//! run gives; the dual-stream policy's summary in flight keeps its progress between idle
//! slices, leaves every turn admitted meanwhile on the old stream, swaps in the same stream an
//! uninterrupted summary swaps in, and starts again over the new facts when they change
//! mid-flight. The summarizer is a model of its own (the engine runs only its model; with the
//! engine's model summaries are background jobs, `summary_in_engine.rs`).

use crate::common;
use common::{assert_close, cold, fact, ids, on_view, tiny_with_own_summarizer};

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use engram_dual::{DualStream, FactSegment, Summarizer};
use engram_engine::{drain_background, ContextPolicy, IdleInterrupt};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

const TARGET: usize = 10;

fn summarizer(m: &Arc<Model>) -> Summarizer {
    let render = {
        let m = m.clone();
        Arc::new(move |text: &str| Ok(ids(&m, &format!(" Summary: {text}."))))
    };
    // Small prefill chunks: the prompt takes several steps.
    Summarizer::new(m.clone(), TARGET, render).with_prefill_chunk(8)
}

fn facts(m: &Model, n: u64) -> Vec<FactSegment> {
    (1..=n).map(|i| fact(m, i, &format!("Ann's number {i} is {}", i * 7))).collect()
}

/// An interrupt that is requested (a job waits), and one that is not.
fn requested() -> IdleInterrupt {
    IdleInterrupt::on_submitted(Arc::new(AtomicUsize::new(1)))
}

#[test]
fn a_summary_stopped_after_every_step_equals_one_uninterrupted_run() {
    let (_d, m, sm) = tiny_with_own_summarizer();
    let s = summarizer(&sm);
    let texts: Vec<String> = facts(&m, 4).into_iter().map(|f| f.text).collect();
    let whole = s.summarize(&texts).unwrap();

    let mut job = s.start(&texts).unwrap();
    let mut calls = 0;
    let got = loop {
        // A requested interrupt stops the job before its next step: nothing is computed.
        let before = (job.steps(), job.generated());
        assert_eq!(s.advance(&mut job, 5, &requested()).unwrap(), None);
        assert_eq!((job.steps(), job.generated()), before, "an interrupted call computes nothing");
        calls += 1;
        if let Some(done) = s.advance(&mut job, 1, &IdleInterrupt::never()).unwrap() {
            break done;
        }
    };
    assert!(calls > 3, "the prompt and the summary took several steps ({calls})");
    assert!(job.steps() >= calls - 1);
    assert_eq!(got, whole, "the resumed summary equals the uninterrupted one, text and tokens");
}

/// A policy with one user whose stream (base + 3 facts) is prefilled, then a fourth fact that
/// passes the cap: a summary due.
fn over_the_cap(m: &Arc<Model>, sm: &Arc<Model>, pool: &KvPool, idle_steps: usize) -> DualStream {
    let base = ids(m, "System: answer in one line.");
    let cap = base.len() + facts(m, 3).iter().map(|f| f.tokens.len()).sum::<usize>();
    let mut p = DualStream::new(m.clone(), pool.clone(), 256).with_persistent_cap(cap, Some(summarizer(sm))).with_idle_steps(idle_steps);
    p.set_anchors("u", base);
    p.set_facts("u", facts(m, 3));
    let warm = ids(m, " User: hello. Assistant:");
    let c = p.admit_tokens("u", Some("warm"), &warm, &m.tokenizer).unwrap();
    assert_eq!(p.dual_stats().summaries, 0, "under the cap: no summary");
    drop(c);
    p.set_facts("u", facts(m, 4));
    assert!(p.summary_pending("u"));
    p
}

#[test]
fn the_policy_resumes_its_summary_across_slices_and_swaps_in_what_one_run_gives() {
    let (_d, m, sm) = tiny_with_own_summarizer();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let prompt = ids(&m, " User: who am I? Assistant:");

    // Uninterrupted: one slice does it all.
    let mut whole = over_the_cap(&m, &sm, &pool, usize::MAX);
    assert!(!whole.idle_slice(&IdleInterrupt::never()), "one summary, nothing left");
    // The text is written; the new stream is the engine's work, run here.
    drain_background(&m, pool.clone(), &mut whole);
    assert_eq!(whole.dual_stats().summaries, 1);

    // One step per slice, a requested interrupt between slices; a turn admitted mid-flight
    // attends the old stream (base + 4 facts, the fourth appended), as a cold run over it.
    let mut sliced = over_the_cap(&m, &sm, &pool, 1);
    let old = sliced.persistent("u").unwrap().tokens();
    let mut slices = 0;
    while sliced.idle_slice(&IdleInterrupt::never()) {
        slices += 1;
        assert!(sliced.idle_slice(&requested()), "interrupted: still due");
        if slices == 3 {
            let c = sliced.admit_tokens("u", Some("mid"), &prompt, &m.tokenizer).unwrap();
            let stream = sliced.persistent("u").unwrap();
            assert_eq!(stream.tokens(), old, "mid-summary the thread attends the old stream");
            let (logits, _, first) = on_view(&m, &pool, &c);
            assert_close(&logits, &cold(&m, &pool, stream, &prompt, first), "a turn mid-summary, on the old stream");
        }
    }
    drain_background(&m, pool.clone(), &mut sliced);
    let st = sliced.dual_stats();
    assert_eq!(st.summaries, 1);
    assert_eq!(whole.dual_stats().summary_slices, 1, "unbounded steps: one slice");
    let mut default_steps = over_the_cap(&m, &sm, &pool, 8);
    let mut n = 1;
    while default_steps.idle_slice(&IdleInterrupt::never()) {
        n += 1;
    }
    assert_eq!(default_steps.dual_stats().summary_slices, n);
    assert!(n > 2, "8 steps per slice: the prompt's chunks and the decode steps take {n} slices");
    assert!(slices > 5 && st.summary_slices_interrupted >= slices as u64, "{slices} slices, {st:?}");
    assert!(!sliced.summary_pending("u"));

    // The same stream swapped in, and the same logits over it, bit for bit.
    let (a, b) = (whole.persistent("u").unwrap(), sliced.persistent("u").unwrap());
    assert_eq!(a.tokens(), b.tokens());
    assert_ne!(a.tokens(), old, "the summary replaced the facts");
    let ca = whole.admit_tokens("u", Some("next"), &prompt, &m.tokenizer).unwrap();
    let cb = sliced.admit_tokens("u", Some("next"), &prompt, &m.tokenizer).unwrap();
    let (la, _, fa) = on_view(&m, &pool, &ca);
    let (lb, _, fb) = on_view(&m, &pool, &cb);
    assert_eq!((la.clone(), fa), (lb, fb), "resumed and uninterrupted summaries swap in the same stream");
    assert_close(&la, &cold(&m, &pool, whole.persistent("u").unwrap(), &prompt, fa), "the new stream, as a cold run");
}

#[test]
fn facts_changing_mid_summary_start_it_again_over_the_new_facts() {
    let (_d, m, sm) = tiny_with_own_summarizer();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let mut p = over_the_cap(&m, &sm, &pool, 1);
    for _ in 0..3 {
        assert!(p.idle_slice(&IdleInterrupt::never()));
    }
    let mut newer = facts(&m, 4);
    newer.push(fact(&m, 5, "Ann moved to Bergen"));
    p.set_facts("u", newer.clone());
    assert_eq!(p.dual_stats().summaries_restarted, 1);
    while p.idle_slice(&IdleInterrupt::never()) {}
    drain_background(&m, pool.clone(), &mut p);
    assert_eq!(p.dual_stats().summaries, 1, "one summary swapped in: the restarted one");

    // What is swapped in summarizes the new facts: the base, then the summary of all five.
    let texts: Vec<String> = newer.iter().map(|f| f.text.clone()).collect();
    let (_, tokens) = summarizer(&sm).summarize(&texts).unwrap();
    let mut want = ids(&m, "System: answer in one line.");
    want.extend(tokens);
    assert_eq!(p.persistent("u").unwrap().tokens(), want);
}
