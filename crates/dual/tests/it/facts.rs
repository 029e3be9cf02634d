//! The dual-stream policy's persistent stream (facts appended and superseded), driven through the
//! `ContextPolicy` calls the scheduler makes: a fact appended, and a fact superseded (the old
//! one masked at once, the new one appended), give views whose logits equal a cold run over
//! exactly the view's tokens at its positions; threads already open move onto the new stream at
//! their next turn; past the cap the facts are summarized — at the session's start before the
//! first prefill, later on the idle hook — and a turn running during the swap keeps the view it
//! started with, joining its ring after it.

use crate::common;
use common::{assert_close, cold, fact, ids, on_view, tiny};

use std::sync::Arc;

use engram_dual::SegmentId;
use engram_dual::{DualStream, FactSegment, Summarizer};
use engram_engine::{ContextPolicy, Retired};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};

fn retire(policy: &mut DualStream, thread: &str, tokens: Vec<u32>, kv: SeqKv) {
    let n = tokens.len();
    policy.retire(Retired {
        owner: "u".into(),
        session_id: thread.into(),
        text: String::new(),
        tokens,
        token_ends: vec![0; n],
        kv,
        cache: None,
        unfed: None,
    });
}

#[test]
fn appended_and_superseded_facts_are_what_a_cold_run_over_the_view_sees() {
    let (_d, m) = tiny();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let tok = &m.tokenizer;
    let mut p = DualStream::new(m.clone(), pool.clone(), 256);
    p.set_anchors("u", m.tokenizer.encode("System: answer in one line.", true).unwrap().ids);
    p.set_facts("u", vec![fact(&m, 1, "Ann keeps bees")]);
    let prompt = ids(&m, " User: who am I? Assistant:");

    let c = p.admit_tokens("u", Some("t1"), &prompt, tok).unwrap();
    let (logits, turn, first) = on_view(&m, &pool, &c);
    let stream = p.persistent("u").unwrap();
    assert_eq!(first, stream.len());
    assert_close(&logits, &cold(&m, &pool, stream, &prompt, first), "base + fact");
    let turn_len = c.tokens.len();
    retire(&mut p, "t1", c.tokens, turn);

    // Supersede: fact 1 tombstoned (masked at once), fact 2 appended after it.
    p.set_facts("u", vec![fact(&m, 2, "Ann keeps wasps")]);
    let stream = p.persistent("u").unwrap();
    let f1 = fact(&m, 1, "Ann keeps bees").tokens.len();
    let base = stream.segments()[0].tokens.len();
    assert_eq!(stream.masked_ranges(), vec![base..base + f1], "the old fact is masked, not dropped");
    assert_eq!(stream.live_facts(), vec![2]);
    let c = p.admit_tokens("u", Some("t2"), &prompt, tok).unwrap();
    let (logits, _, first) = on_view(&m, &pool, &c);
    let stream = p.persistent("u").unwrap();
    assert_eq!(first, stream.len(), "the masked fact keeps its positions: a gap");
    assert_close(&logits, &cold(&m, &pool, stream, &prompt, first), "base + superseding fact, the old one masked");
    retire(&mut p, "t2", Vec::new(), SeqKv::new(&pool));

    // The thread opened before the change moves onto the new stream at its next turn: its view
    // is the live stream then its turn, moved to follow the stream.
    let c = p.admit_tokens("u", Some("t1"), &prompt, tok).unwrap();
    let attended: usize = c.spans.iter().map(|s| s.len()).sum();
    assert_eq!(attended, stream_live(&p) + turn_len);
    let (_, _, first) = on_view(&m, &pool, &c);
    assert_eq!(first, p.persistent("u").unwrap().len() + turn_len);
    assert_eq!(p.dual_stats().rebases, 1);
}

fn stream_live(p: &DualStream) -> usize {
    p.persistent("u").unwrap().live_len()
}

#[test]
fn past_the_cap_a_summary_is_attended_and_swapped_in_between_turns() {
    // A summarizer model of its own: summarized at the session's start and on the idle hook.
    let (_d, m, sm) = common::tiny_with_own_summarizer();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let tok = &m.tokenizer;
    let base = m.tokenizer.encode("System: answer in one line.", true).unwrap().ids;
    let facts: Vec<FactSegment> = (1..=3).map(|i| fact(&m, i, &format!("Ann's number {i} is {}", i * 7))).collect();
    let cap = base.len() + facts[0].tokens.len() + 4;
    let render = {
        let m = m.clone();
        Arc::new(move |text: &str| Ok(ids(&m, &format!(" Summary: {text}."))))
    };
    let summarizer = Summarizer::new(sm, 8, render);
    let mut p = DualStream::new(m.clone(), pool.clone(), 256).with_persistent_cap(cap, Some(summarizer));
    p.set_anchors("u", base.clone());
    p.set_facts("u", facts.clone());
    let prompt = ids(&m, " User: who am I? Assistant:");

    // Session start: summarized before the first prefill; the summary is what is attended.
    let a = p.admit_tokens("u", Some("t1"), &prompt, tok).unwrap();
    let stream = p.persistent("u").unwrap();
    assert_eq!(p.dual_stats().summaries, 1);
    let ids_of: Vec<SegmentId> = stream.segments().iter().map(|s| s.id).collect();
    assert!(matches!(ids_of[..], [SegmentId::Base, SegmentId::Summary(_)]), "{ids_of:?}");
    let (logits_a, turn_a, first_a) = on_view(&m, &pool, &a);
    assert_close(&logits_a, &cold(&m, &pool, stream, &prompt, first_a), "base + summary");

    // A fact arrives while turn A runs: appended (over the cap, a summary due), summarized on
    // the idle hook and swapped in. Turn A's view is the one it started with.
    let mut more = facts.clone();
    more.push(fact(&m, 4, "Ann moved to Bergen"));
    p.set_facts("u", more);
    // A few steps per idle slice: the slices run until the summary is swapped in.
    let mut slices = 1;
    while p.idle_slice(&engram_engine::IdleInterrupt::never()) {
        slices += 1;
        assert!(slices < 1000, "the summary ends");
    }
    // The summary's text is written; the new stream is the engine's work, run here.
    engram_engine::drain_background(&m, pool.clone(), &mut p);
    assert_eq!(p.dual_stats().summaries, 2);
    let (again, _, first_again) = on_view(&m, &pool, &a);
    assert_eq!((again, first_again), (logits_a, first_a), "a running turn never sees the swap");
    let turn_len = a.tokens.len();
    retire(&mut p, "t1", a.tokens, turn_a);

    // The next turn attends the new summary, then turn A moved to follow it.
    let b = p.admit_tokens("u", Some("t1"), &prompt, tok).unwrap();
    let stream = p.persistent("u").unwrap();
    let ids_of: Vec<SegmentId> = stream.segments().iter().map(|s| s.id).collect();
    assert!(matches!(ids_of[..], [SegmentId::Base, SegmentId::Summary(_)]), "{ids_of:?}");
    let attended: usize = b.spans.iter().map(|s| s.len()).sum();
    assert_eq!(attended, stream.len() + turn_len);
    let (_, _, first_b) = on_view(&m, &pool, &b);
    assert_eq!(first_b, stream.len() + turn_len);
    assert!(p.dual_stats().last_swap_us > 0 || p.dual_stats().last_summary_us > 0);
}
