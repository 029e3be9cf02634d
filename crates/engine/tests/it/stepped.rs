//! `SteppedJob`: a background job advanced a few engine steps per call on an engine of its own.
//! However it is cut into calls — one step at a time, interrupted calls between — it ends with
//! what `run_alone` of the same job computes, bit for bit; an interrupted call computes
//! nothing; a job dropped unfinished gives its KV back to the pool; a call after the end is an
//! error.

use crate::common;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use engram_engine::{
    run_alone, BackgroundJob, BackgroundPriority, Checkout, IdleInterrupt, MatchKind, OwnerKey, SchedulerConfig, Stepped, SteppedJob,
};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, SeqStep};

fn job(pool: &KvPool, prompt: &[u32], max_tokens: usize) -> BackgroundJob {
    let n = prompt.len();
    BackgroundJob {
        owner: OwnerKey::parse("summarizer"),
        tag: 7,
        start: Checkout::own(String::new(), MatchKind::Miss, prompt.to_vec(), vec![0; n], 0, SeqKv::new(pool)),
        max_tokens,
        stop: Vec::new(),
        priority: BackgroundPriority::Low,
        hidden: Vec::new(),
    }
}

fn requested() -> IdleInterrupt {
    IdleInterrupt::on_submitted(Arc::new(AtomicUsize::new(1)))
}

#[test]
fn a_job_cut_into_single_steps_equals_run_alone_bit_for_bit() {
    let (_d, m) = common::tiny();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F16, 16 << 20);
    let prompt = common::ids(&m, "The engine steps a job a few steps at a time, and the caller waits between them.");
    let config = SchedulerConfig { prefill_chunk: 8, ..SchedulerConfig::default() };
    let alone = run_alone(&m, pool.clone(), config.clone(), job(&pool, &prompt, 12), None, &mut || false).expect("never stopped");
    let want = alone.done.outcome.expect("the job ran");

    let mut stepped = SteppedJob::start(m.clone(), pool.clone(), config, job(&pool, &prompt, 12), None);
    let mut calls = 0;
    let (done, total_steps) = loop {
        // An interrupted call makes no step.
        match stepped.advance(3, &requested()).unwrap() {
            Stepped::Pending { steps, .. } => assert_eq!(steps, 0, "an interrupted call computes nothing"),
            Stepped::Done { .. } => panic!("an interrupted call cannot finish the job"),
        }
        calls += 1;
        match stepped.advance(1, &IdleInterrupt::never()).unwrap() {
            Stepped::Pending { steps, .. } => assert_eq!(steps, 1),
            Stepped::Done { done, steps } => break (done, steps),
        }
    };
    assert!(calls > prompt.len() / 8, "the prompt and the answer took several calls ({calls})");
    assert!(total_steps <= 1);
    let got = done.outcome.expect("the job ran");
    assert_eq!(done.tag, 7);
    assert_eq!(got.tokens, want.tokens, "the same tokens as run_alone");
    assert_eq!(got.generated, want.generated);
    assert_eq!(got.text, want.text);
    // The KV bit for bit: one more token over each gives the same logits.
    assert_eq!(got.kv.len(), want.kv.len());
    let next = |mut kv: SeqKv| {
        let at = kv.len();
        kv.reserve(1).unwrap();
        m.forward(&mut [SeqStep::new(&[5], at, &mut kv, Logits::Last)]).unwrap().remove(0)
    };
    let (a, b) = (next(got.kv), next(want.kv));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "the same KV, bit for bit");
    assert!(stepped.advance(1, &IdleInterrupt::never()).is_err(), "a call after the end is an error");
}

#[test]
fn a_job_dropped_unfinished_gives_its_kv_back() {
    let (_d, m) = common::tiny();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F16, 16 << 20);
    let prompt = common::ids(&m, "A job that is dropped half way.");
    let config = SchedulerConfig { prefill_chunk: 4, ..SchedulerConfig::default() };
    let mut stepped = SteppedJob::start(m.clone(), pool.clone(), config, job(&pool, &prompt, 32), None);
    match stepped.advance(3, &IdleInterrupt::never()).unwrap() {
        Stepped::Pending { steps, .. } => assert_eq!(steps, 3),
        Stepped::Done { .. } => panic!("three steps do not finish this job"),
    }
    assert!(pool.used() > 0, "the job holds KV between calls");
    drop(stepped);
    assert_eq!(pool.used(), 0, "dropping the job gives its KV back");
}
