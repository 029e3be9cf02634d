//! `engram bench facts`: what a user's facts cost the dual-stream policy (facts appended and
//! superseded), measured on the policy's own calls (`engram_dual::DualStream`), the way
//! the scheduler makes them, on one engine thread.
//!
//! A user with a system prompt and facts just under `--persistent-cap-tokens`, a thread whose
//! ring holds `--turns` turns of `--turn-tokens`. Measured side by side: a turn (admission
//! plus the prefill of its message) with nothing changed (median of 7); the turn after a fact
//! is appended (only the fact is prefilled, the ring moved after it); then a fact that passes
//! the cap: the summary's generation, the new stream's prefill and the swap — the engine's
//! background jobs, run alone (nothing waits) — and the first turn on the new stream (the ring
//! moved onto it). The seed reports an 80 ms stutter.
//!
//! Then, through the engine thread (`facts_stall.rs`): the stall a request arriving
//! mid-summary sees, with the summary on the idle hook (one uninterruptible slice vs
//! preemptible, a summarizer model of its own) and in the engine.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use engram_dual::{DualStream, FactSegment, RenderSegment, Summarizer};
use engram_engine::{ContextPolicy, Retired};
use engram_kv::{KvPool, KvView};
use engram_model::{Logits, Model};

use crate::common::{forward_at, kv_pool, load_model, ModelArgs};
use crate::facts_stall;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The persistent stream's cap (the dual-stream design's default: 512).
    #[arg(long, default_value_t = 512)]
    persistent_cap_tokens: usize,
    /// The summary's most tokens (the dual-stream design's default: 300).
    #[arg(long, default_value_t = 300)]
    summary_target_tokens: usize,
    /// Turns in the thread's ring when the facts change.
    #[arg(long, default_value_t = 16)]
    turns: usize,
    /// Tokens per turn.
    #[arg(long, default_value_t = 64)]
    turn_tokens: usize,
    /// Rounds of the through-the-engine stall comparison (0: skip it).
    #[arg(long, default_value_t = 3)]
    stall_reps: usize,
    /// When the request arrives: milliseconds after the summary's first idle slice began.
    #[arg(long, default_value_t = 5)]
    stall_delay_ms: u64,
    /// Answer tokens per turn in the through-the-engine comparison.
    #[arg(long, default_value_t = 8)]
    answer_tokens: usize,
    /// One JSON line instead of the table (and one for the engine comparison).
    #[arg(long)]
    json: bool,
}

const SYSTEM: &str = "You are a coding assistant. Answer briefly and show code when it helps.\n";

fn fact(model: &Model, id: u64) -> Result<FactSegment> {
    let text = format!("The user's project number {id} is written in Python {} and uses library {}.", 3 + id % 9, id * 37 % 101);
    let tokens = model.tokenizer.encode(&format!("{}{text}\n", engram_server::FACT_PREFIX), false)?.ids;
    Ok(FactSegment { id, text, tokens })
}

fn message(model: &Model, i: usize, n: usize) -> Result<Vec<u32>> {
    let ids = model.tokenizer.encode(engram_tokenizer::FIXTURE_CORPUS, false)?.ids;
    let start = (i * 991) % ids.len().saturating_sub(n).max(1);
    Ok(ids[start..start + n.min(ids.len())].to_vec())
}

/// Admits `prompt` on the thread and prefills it on the view; returns the milliseconds and,
/// if `keep`, retires it into the ring.
fn turn(model: &Arc<Model>, dual: &mut DualStream, prompt: &[u32], keep: bool) -> Result<f64> {
    let t = Instant::now();
    let c = dual.admit_tokens("user", Some("a"), prompt, &model.tokenizer).map_err(anyhow::Error::msg)?;
    let mut view = KvView::new(c.spans, c.kv).starting_at(c.own_first);
    let first = view.own_first_position();
    forward_at(model, &mut view, &c.tokens, first, Logits::Last)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if keep {
        let kv = view.into_own();
        let n = c.tokens.len();
        dual.retire(Retired {
            owner: "user".into(),
            session_id: "a".into(),
            text: String::new(),
            tokens: c.tokens,
            token_ends: vec![0; n],
            kv,
            cache: None,
            unfed: None,
        });
    }
    Ok(ms)
}

pub fn run(a: Args) -> Result<()> {
    let model = Arc::new(load_model(&a.model)?);
    let pool: KvPool = kv_pool(&model, &a.model)?;
    let tok = &model.tokenizer;
    let anchors = tok.encode(SYSTEM, true)?.ids;
    let render: RenderSegment = {
        let m = model.clone();
        Arc::new(move |text: &str| {
            m.tokenizer.encode(&format!("{}{text}\n", engram_server::SUMMARY_PREFIX), false).map(|e| e.ids).map_err(|e| e.to_string())
        })
    };
    let summarizer = Summarizer::new(model.clone(), a.summary_target_tokens, render.clone());
    let ring = a.turns * a.turn_tokens + 1;
    let mut dual = DualStream::new(model.clone(), pool.clone(), ring).with_persistent_cap(a.persistent_cap_tokens, Some(summarizer));
    dual.set_anchors("user", anchors.clone());
    // Facts up to just under the cap (the last one appended later must pass it).
    let mut facts = Vec::new();
    let mut used = anchors.len();
    loop {
        let f = fact(&model, facts.len() as u64 + 1)?;
        if used + 2 * f.tokens.len() > a.persistent_cap_tokens {
            break;
        }
        used += f.tokens.len();
        facts.push(f);
    }
    dual.set_facts("user", facts.clone());
    for i in 0..a.turns {
        turn(&model, &mut dual, &message(&model, i, a.turn_tokens)?, true)?;
    }
    let probe = message(&model, 9999, a.turn_tokens)?;
    let mut steady: Vec<f64> = (0..7).map(|_| turn(&model, &mut dual, &probe, false)).collect::<Result<_>>()?;
    steady.sort_by(f64::total_cmp);
    let steady = steady[steady.len() / 2];

    // A fact appended under the cap: the next turn prefills it and moves the ring after it.
    facts.push(fact(&model, facts.len() as u64 + 1)?);
    dual.set_facts("user", facts.clone());
    let after_append = turn(&model, &mut dual, &probe, false)?;

    // A fact past the cap: summarized by the engine's background jobs, swapped in, attended
    // from the next turn.
    facts.push(fact(&model, facts.len() as u64 + 1)?);
    let live_before = dual.persistent("user").map_or(0, |s| s.live_len());
    dual.set_facts("user", facts.clone());
    // Nothing waits: the jobs run alone until the summary is swapped in.
    let t = Instant::now();
    engram_engine::drain_background(&model, pool.clone(), &mut dual);
    let idle_ms = t.elapsed().as_secs_f64() * 1e3;
    let st = dual.dual_stats();
    anyhow::ensure!(st.summaries == 1, "the facts past the cap were not summarized (see the log)");
    let after_swap = turn(&model, &mut dual, &probe, false)?;
    let live_after = dual.persistent("user").map_or(0, |s| s.live_len());
    let (summary_ms, swap_ms) = (st.last_summary_us as f64 / 1e3, st.last_swap_us as f64 / 1e3);
    let prefill_ms = st.last_summary_prefill_us as f64 / 1e3;

    if a.json {
        let line = serde_json::json!({"model": model.describe(), "facts": facts.len(), "persistent_cap": a.persistent_cap_tokens,
            "stream_tokens_before": live_before, "stream_tokens_after": live_after, "ring_tokens": a.turns * a.turn_tokens,
            "turn_ms": steady, "turn_after_fact_ms": after_append, "summary_jobs_ms": idle_ms, "summary_ms": summary_ms,
            "new_stream_prefill_ms": prefill_ms, "swap_ms": swap_ms, "turn_after_swap_ms": after_swap});
        println!("{line}");
        return stall(&a, &model, &pool, &anchors, &facts, render);
    }
    println!(
        "{}: {} facts, persistent stream {live_before} tokens (cap {}) → {live_after} after the summary; ring of {} tokens\n",
        model.describe(),
        facts.len(),
        a.persistent_cap_tokens,
        a.turns * a.turn_tokens
    );
    println!("| step | ms |");
    println!("|---|---|");
    println!("| a turn ({} tokens) with nothing changed, median of 7 | {steady:.2} |", a.turn_tokens);
    println!("| the turn after a fact is appended (fact prefilled, ring moved) | {after_append:.2} |");
    println!("| engine job: summary generated | {summary_ms:.2} |");
    println!("| engine job: new stream prefilled beside the old one | {prefill_ms:.2} |");
    println!("| the swap (the new stream put in place) | {swap_ms:.3} |");
    println!("| the first turn on the new stream (ring moved onto it) | {after_swap:.2} |");
    println!(
        "\nthe summary's jobs, alone: {idle_ms:.1} ms; the first turn after the swap takes {:.2} ms more than usual",
        after_swap - steady
    );
    stall(&a, &model, &pool, &anchors, &facts, render)?;
    if !a.json {
        println!("\nreproduce: engram bench facts --model M [--persistent-cap-tokens 512] [--summary-target-tokens 300] [--turns 16] [--stall-reps 3] [--stall-delay-ms 5] [--json]");
    }
    Ok(())
}

/// The through-the-engine comparison (`facts_stall.rs`), from the facts just under the
/// cap (`facts` less the two the table above appended).
fn stall(a: &Args, model: &Arc<Model>, pool: &KvPool, anchors: &[u32], facts: &[FactSegment], render: RenderSegment) -> Result<()> {
    if a.stall_reps == 0 {
        return Ok(());
    }
    let (under, extra) = facts.split_at(facts.len() - 2);
    let messages: Vec<Vec<u32>> = (0..a.turns).map(|i| message(model, i, a.turn_tokens)).collect::<Result<_>>()?;
    let probe = message(model, 9999, a.turn_tokens)?;
    let ring = a.turns * (a.turn_tokens + a.answer_tokens) + 1;
    let cap = a.persistent_cap_tokens;
    let policy = |s: Option<Summarizer>| DualStream::new(model.clone(), pool.clone(), ring).with_persistent_cap(cap, s);
    // The idle hook's modes run a summarizer model of its own: a second copy of the model.
    let own = Arc::new(load_model(&a.model)?);
    let own_summarizer = || Summarizer::new(own.clone(), a.summary_target_tokens, render.clone());
    let engine_summarizer = || Summarizer::new(model.clone(), a.summary_target_tokens, render.clone());
    let setup = facts_stall::Setup {
        model,
        pool,
        anchors,
        facts: under,
        extra,
        messages: &messages,
        probe: &probe,
        answer_tokens: a.answer_tokens,
        delay: std::time::Duration::from_millis(a.stall_delay_ms),
        policy: &policy,
        own_summarizer: &own_summarizer,
        engine_summarizer: &engine_summarizer,
    };
    let results = facts_stall::run(&setup, a.stall_reps)?;
    facts_stall::report(&results, &model.describe(), setup.delay, a.json);
    Ok(())
}
