//! `engram bench context`: the dual-stream policy (`engram_dual::DualStream`)
//! against keeping the full history, on one long conversation through the scheduler.
//!
//! Each turn is a synthetic user message (`--message-tokens`, drawn from a fixed text) and a
//! greedy answer (`--answer-tokens`). The dual-stream run sends only the new turn to a thread
//! whose ring holds `--ring-tokens`; the full-history run sends everything so far and the
//! session store extends its cache (no eviction). Reported at each `--turns` mark: KV bytes in
//! use (measured from the pool), and decode milliseconds per token of that turn; then the
//! thread-switch time (a request's admission on another thread of the same user: the view
//! built from RAM, no KV copied) and the KV bytes of 1 and 8 threads over one user's anchors;
//! then the depth check: decode at the first and last marks side by side (a second thread of
//! the user at the first mark's depth, a turn there and one on the main thread, alternating),
//! the ratio that holds up on a loaded machine. The full history stops where it passes the
//! model's context.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use engram_dual::DualStream;
use engram_engine::scheduler::Job;
use engram_engine::{ContextPolicy, SamplingParams};
use engram_kv::KvPool;
use engram_model::Model;

use crate::common::{forward_at, kv_pool, load_model, ModelArgs};
use crate::engine_thread::EngineThread;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Turns at which to report (the conversation runs to the largest).
    #[arg(long, default_value = "12,50,200", value_delimiter = ',')]
    turns: Vec<usize>,
    /// Tokens per user message.
    #[arg(long, default_value_t = 40)]
    message_tokens: usize,
    /// Tokens per answer (greedy, end-of-sequence ignored).
    #[arg(long, default_value_t = 24)]
    answer_tokens: usize,
    /// The ring's capacity in tokens (the dual-stream design's default: 1,536).
    #[arg(long, default_value_t = 1536)]
    ring_tokens: usize,
    /// Stop the full-history run after this many turns (default: the last mark), for speed
    /// runs on large models where only the dual-stream rows are wanted past it.
    #[arg(long)]
    full_turns: Option<usize>,
    /// Alternating rounds of the depth check: a turn on a thread at the first mark, then one on
    /// the main thread at the last, repeated, so both depths see the same machine load.
    #[arg(long, default_value_t = 3)]
    depth_rounds: usize,
    /// One JSON line per mark, then one for threads and one for the depth check.
    #[arg(long)]
    json: bool,
}

/// Runs `job` to its end on `engine`; returns decode milliseconds per token after the first,
/// and the text.
fn run_job(engine: &EngineThread, job: Job) -> Result<(f64, String)> {
    let (_, t) = engine.run(job)?;
    let end = t.end.expect("run returns ended jobs");
    let first = t.first_token.unwrap_or(end);
    Ok((end.duration_since(first).as_secs_f64() * 1e3 / t.completion_tokens.saturating_sub(1).max(1) as f64, t.text))
}

/// One measured mark of a run.
struct Mark {
    turn: usize,
    kv_bytes: usize,
    decode_ms: f64,
}

/// User message `i`: `n` tokens of a fixed text, different per turn.
fn message(model: &Model, i: usize, n: usize) -> Result<Vec<u32>> {
    let text = engram_tokenizer::FIXTURE_CORPUS;
    let ids = model.tokenizer.encode(text, false)?.ids;
    let start = (i * 997) % ids.len().saturating_sub(n).max(1);
    Ok(ids[start..start + n.min(ids.len())].to_vec())
}

fn params(a: &Args) -> SamplingParams {
    // Log-probabilities (no alternatives) make every token an event, so decode time runs from
    // the first token even where a random-weight fixture's bytes finish no character for a while.
    SamplingParams { max_tokens: a.answer_tokens, ignore_eos: true, logprobs: Some(0), ..Default::default() }
}

fn job(owner: &str, thread: &str, prompt: Vec<u32>, params: &SamplingParams) -> Job {
    Job {
        owner: owner.into(),
        session: Some(thread.into()),
        text: None,
        add_special: false,
        prompt,
        params: params.clone(),
        pinned: false,
        long_context_after: None,
    }
}

pub fn run(a: Args) -> Result<()> {
    let model = Arc::new(load_model(&a.model)?);
    let last = a.turns.iter().copied().max().unwrap_or(0);
    let anchors = model.tokenizer.encode("You are a helpful assistant. Answer in one short paragraph.", true)?.ids;
    let p = params(&a);

    // Dual-stream: only the new turn is sent; the thread's ring keeps the rest.
    let pool = kv_pool(&model, &a.model)?;
    let mut dual = DualStream::new(model.clone(), pool.clone(), a.ring_tokens);
    dual.set_anchors("user", anchors.clone());
    let engine = EngineThread::start(&model, &pool, Box::new(dual));
    let mut dual_marks = Vec::new();
    for i in 1..=last {
        let (ms, _) = run_job(&engine, job("user", "main", message(&model, i, a.message_tokens)?, &p))?;
        if a.turns.contains(&i) {
            dual_marks.push(Mark { turn: i, kv_bytes: pool.used(), decode_ms: ms });
        }
    }
    // Threads: 7 more threads of the same user, one turn each (the anchors shared), then the
    // time to admit a request on another thread (its ring's view built from RAM).
    let one_thread = pool.used();
    for t in 1..8 {
        run_job(&engine, job("user", &format!("thread-{t}"), message(&model, 1000 + t, a.message_tokens)?, &p))?;
    }
    let eight_threads = pool.used();
    let depth = depth_check(&engine, &model, &a, &p)?;
    drop(engine);

    let switch_us = thread_switch_us(&model, &pool, &a, &anchors)?;

    // Full history: every turn sent again as text, the session extended (EXTEND: only the new
    // message is tokenized and prefilled), nothing evicted.
    let pool = kv_pool(&model, &a.model)?;
    let engine = EngineThread::start(&model, &pool, engram_stack::build(&model, &pool, &Default::default()).policy);
    let mut full_marks = Vec::new();
    let mut history = model.tokenizer.decode(&anchors, true)?;
    for i in 1..=a.full_turns.unwrap_or(last).min(last) {
        history.push_str(&model.tokenizer.decode(&message(&model, i, a.message_tokens)?, true)?);
        let prompt = model.tokenizer.encode(&history, true)?.ids;
        if prompt.len() + a.answer_tokens >= model.config.max_positions {
            eprintln!("full history: turn {i} passes the model's context of {} tokens; stopping there", model.config.max_positions);
            break;
        }
        let j = Job { text: Some(history.clone()), add_special: true, ..job("user", "main", prompt, &p) };
        let (ms, answer) = run_job(&engine, j)?;
        history.push_str(&answer);
        if a.turns.contains(&i) {
            full_marks.push(Mark { turn: i, kv_bytes: pool.used(), decode_ms: ms });
        }
    }
    drop(engine);

    report(&a, &dual_marks, &full_marks, one_thread, eight_threads, switch_us, &depth);
    Ok(())
}

/// Decode at the first and last marks measured side by side: the marks of the main run lie
/// minutes apart, so on a loaded machine their ratio is mostly drift.
struct Depth {
    first_turn: usize,
    last_turn: usize,
    first_ms: f64,
    last_ms: f64,
}

/// Builds a thread of the same user to the first mark's turns, then alternates a turn there
/// and a turn on the main thread (past the last mark) for `--depth-rounds`; medians of each.
fn depth_check(engine: &EngineThread, model: &Model, a: &Args, p: &SamplingParams) -> Result<Depth> {
    let first_turn = a.turns.iter().copied().min().unwrap_or(1);
    let last_turn = a.turns.iter().copied().max().unwrap_or(1);
    for i in 1..first_turn {
        run_job(engine, job("user", "shallow", message(model, 2000 + i, a.message_tokens)?, p))?;
    }
    let (mut shallow, mut deep) = (Vec::new(), Vec::new());
    for r in 0..a.depth_rounds.max(1) {
        shallow.push(run_job(engine, job("user", "shallow", message(model, 3000 + r, a.message_tokens)?, p))?.0);
        deep.push(run_job(engine, job("user", "main", message(model, 4000 + r, a.message_tokens)?, p))?.0);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        v[v.len() / 2]
    };
    Ok(Depth { first_turn, last_turn, first_ms: median(shallow), last_ms: median(deep) })
}

/// Median microseconds to admit a request on another thread of a user (the ring's view from
/// RAM, `--ring-tokens` of turns in it), over 101 switches between two threads.
fn thread_switch_us(model: &Arc<Model>, pool: &KvPool, a: &Args, anchors: &[u32]) -> Result<f64> {
    use engram_engine::Retired;
    let mut dual = DualStream::new(model.clone(), pool.clone(), a.ring_tokens);
    dual.set_anchors("user", anchors.to_vec());
    let tok = &model.tokenizer;
    // Fill two threads' rings with turns of KV (prefilled directly, no decoding).
    for thread in ["a", "b"] {
        let mut filled = 0;
        let mut i = 0;
        while filled + a.message_tokens <= a.ring_tokens {
            let prompt = message(model, i, a.message_tokens)?;
            let c = dual.admit_tokens("user", Some(thread), &prompt, tok).map_err(anyhow::Error::msg)?;
            let mut view = engram_kv::KvView::new(c.spans, c.kv).starting_at(c.own_first);
            let first = view.own_first_position();
            forward_at(model, &mut view, &prompt, first, engram_model::Logits::None)?;
            let kv = view.into_own();
            dual.retire(Retired {
                owner: "user".into(),
                session_id: thread.into(),
                text: String::new(),
                tokens: prompt.clone(),
                token_ends: vec![0; prompt.len()],
                kv,
                cache: None,
                unfed: None,
            });
            filled += prompt.len();
            i += 1;
        }
    }
    let prompt = message(model, 5000, a.message_tokens)?;
    let mut times = Vec::new();
    for k in 0..101 {
        let thread = if k % 2 == 0 { "a" } else { "b" };
        let t = Instant::now();
        let c = dual.admit_tokens("user", Some(thread), &prompt, tok).map_err(anyhow::Error::msg)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        drop(c);
    }
    times.sort_by(|x, y| x.total_cmp(y));
    Ok(times[times.len() / 2])
}

fn report(a: &Args, dual: &[Mark], full: &[Mark], one: usize, eight: usize, switch_us: f64, depth: &Depth) {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    if a.json {
        for m in dual {
            let f = full.iter().find(|f| f.turn == m.turn);
            let line = serde_json::json!({"turns": m.turn, "dual_kv_bytes": m.kv_bytes, "dual_decode_ms_per_token": m.decode_ms,
                "full_kv_bytes": f.map(|f| f.kv_bytes), "full_decode_ms_per_token": f.map(|f| f.decode_ms)});
            println!("{line}");
        }
        println!("{}", serde_json::json!({"threads": {"kv_bytes_1": one, "kv_bytes_8": eight, "switch_us_median": switch_us}}));
        println!(
            "{}",
            serde_json::json!({"depth": {"rounds": a.depth_rounds, "first_turns": depth.first_turn, "last_turns": depth.last_turn,
                "first_decode_ms_per_token": depth.first_ms, "last_decode_ms_per_token": depth.last_ms,
                "ratio": depth.last_ms / depth.first_ms.max(1e-9)}})
        );
        return;
    }
    println!("one conversation: {}-token messages, {}-token answers, ring of {} tokens", a.message_tokens, a.answer_tokens, a.ring_tokens);
    println!("| turns | dual KV MiB | full KV MiB | dual decode ms/token | full decode ms/token |");
    println!("|---|---|---|---|---|");
    for m in dual {
        let f = full.iter().find(|f| f.turn == m.turn);
        let (fk, fd) = f.map_or(("not run (past the context or `--full-turns`)".into(), "—".into()), |f| {
            (format!("{:.2}", mib(f.kv_bytes)), format!("{:.2}", f.decode_ms))
        });
        println!("| {} | {:.2} | {fk} | {:.2} | {fd} |", m.turn, mib(m.kv_bytes), m.decode_ms);
    }
    if let (Some(first), Some(last)) = (dual.first(), dual.last()) {
        println!("\ndual decode at {} turns / at {}: {:.2}x", last.turn, first.turn, last.decode_ms / first.decode_ms.max(1e-9));
    }
    println!(
        "threads: KV {:.2} MiB with 1, {:.2} MiB with 8 (anchors shared; each new thread one turn); switching threads (a request's view from RAM, {} tokens of turns): {:.1} µs median",
        mib(one),
        mib(eight),
        a.ring_tokens,
        switch_us
    );
    println!(
        "side by side ({} alternating rounds): decode {:.2} ms/token at {} turns, {:.2} at {}+: {:.2}x",
        a.depth_rounds.max(1),
        depth.first_ms,
        depth.first_turn,
        depth.last_ms,
        depth.last_turn,
        depth.last_ms / depth.first_ms.max(1e-9)
    );
}
