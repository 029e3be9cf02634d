//! `engram bench grammar`: what constrained decoding (llguidance's token mask,
//! `engram_engine::grammar`) costs per token, at 1 and 8 sequences decoding together
//! through the scheduler. Each round runs the batch under a JSON schema (twelve bounded
//! strings: many tokens, every one masked), then free over the same number of tokens per
//! sequence, the order alternating by round; and replays each bound answer's tokens
//! through a fresh matcher alone (`compute_mask`, applying it to a vocabulary of logits,
//! `consume`), timing the mask per token apart from the forward pass.
//!
//! The table: aggregate decode tokens/s free and bound, their ratio, the mask per token,
//! and the mask's share of a free token's time at that batch (one step of `n` sequences
//! makes `n` tokens and masks `n` times, one after another on the engine thread).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use engram_engine::scheduler::Job;
use engram_engine::{EngineHandle, Grammar, GrammarCompiler, Metrics, SamplingParams, SchedulerConfig};
use engram_model::Model;
use serde_json::json;

use crate::common::{kv_pool, load_model, ModelArgs};
use crate::timed_sink::TimedSink;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Sequences decoding together, one row each.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8])]
    batch: Vec<usize>,
    /// Timed rounds per batch (each runs the batch bound and free).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// One JSON line per batch instead of the table.
    #[arg(long)]
    json: bool,
}

/// The schema every bound sequence answers: long strings, so most tokens are masked inside
/// a string, where a mask is cheapest to compute and most often all-but-closed.
fn schema() -> serde_json::Value {
    json!({"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 12, "maxItems": 12})
}

/// One batch's run: its wall time from submission to the last end, and each sequence's
/// text and tokens.
struct Run {
    secs: f64,
    outputs: Vec<(String, usize)>,
}

/// Runs `params` (one per sequence) together through a fresh engine.
fn run_batch(model: &Arc<Model>, args: &ModelArgs, prompt: &[u32], params: Vec<SamplingParams>) -> Result<Run> {
    let pool = kv_pool(model, args)?;
    let config = SchedulerConfig { max_batch: params.len().max(1), ..SchedulerConfig::default() };
    let stack_model = model.clone();
    let (handle, engine) = EngineHandle::start(model.clone(), pool, config, Arc::new(Metrics::default()), move |_, p| {
        engram_stack::build(&stack_model, p, &Default::default()).policy
    });
    let sinks: Vec<TimedSink> = params.iter().map(|_| TimedSink::default()).collect();
    let start = Instant::now();
    for (p, sink) in params.into_iter().zip(&sinks) {
        let job = Job {
            owner: "bench".into(),
            session: None,
            text: None,
            add_special: true,
            prompt: prompt.to_vec(),
            params: p,
            pinned: false,
            long_context_after: None,
        };
        handle.submit(job, Box::new(sink.clone()))?;
    }
    drop(handle);
    engine.join().map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    let mut end = start;
    let mut outputs = Vec::new();
    for s in &sinks {
        let t = s.get();
        if let Some(e) = t.failed {
            bail!("a request failed: {e}");
        }
        end = end.max(t.end.unwrap_or(start));
        outputs.push((t.text, t.completion_tokens));
    }
    Ok(Run { secs: end.duration_since(start).as_secs_f64(), outputs })
}

/// The mask alone over `text`'s tokens (as the tokenizer writes them): microseconds per
/// token and the tokens replayed.
fn mask_alone(model: &Model, grammar: &Grammar, text: &str) -> Result<(f64, usize)> {
    let ids = model.tokenizer.encode(text, false)?.ids;
    let mut st = grammar.start();
    let mut logits = vec![0.0f32; model.config.vocab];
    let t = Instant::now();
    let mut n = 0;
    for &tok in &ids {
        st.mask(&mut logits)?;
        n += 1;
        if st.consume(tok)? {
            break;
        }
    }
    Ok((t.elapsed().as_secs_f64() * 1e6, n))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run(args: Args) -> Result<()> {
    let model = Arc::new(load_model(&args.model)?);
    let t = Instant::now();
    let compiler = GrammarCompiler::new(&model.tokenizer, model.config.vocab)?;
    let trie_ms = t.elapsed().as_secs_f64() * 1e3;
    let grammar = compiler.json_schema(schema()).map_err(|e| anyhow::anyhow!("the schema: {e}"))?;
    let prompt = model.tokenizer.encode("Answer in JSON:", true)?.ids;
    if !args.json {
        println!(
            "constrained decoding: a JSON schema of 12 strings (<= 24 characters), vocabulary {}, trie {trie_ms:.0} ms, {} rounds, median",
            model.config.vocab, args.rounds
        );
        println!(
            "| sequences | decode free (tok/s, all) | decode bound (tok/s, all) | bound / free | mask per token | mask / free token time |"
        );
        println!("|---|---|---|---|---|---|");
    }
    // Warm-up (weights paged in), not reported.
    run_batch(&model, &args.model, &prompt, vec![SamplingParams { max_tokens: 8, ignore_eos: true, ..Default::default() }])?;
    for &n in &args.batch {
        let (mut free, mut bound, mut mask) = (Vec::new(), Vec::new(), Vec::new());
        let mut lengths: Option<Vec<usize>> = None;
        for round in 0..args.rounds {
            let seed = |i: usize| (round * 100 + i) as u64;
            let bound_params: Vec<SamplingParams> = (0..n)
                .map(|i| SamplingParams {
                    max_tokens: 400,
                    temperature: 1.0,
                    seed: seed(i),
                    grammar: Some(grammar.clone()),
                    ..Default::default()
                })
                .collect();
            // Free over each sequence's bound length; the order alternates by round (an odd
            // round's free run takes the last round's lengths, its bound run comes second).
            let free_params = |lengths: &[usize]| -> Vec<SamplingParams> {
                lengths
                    .iter()
                    .enumerate()
                    .map(|(i, &k)| SamplingParams {
                        max_tokens: k.max(1),
                        temperature: 1.0,
                        seed: seed(i),
                        ignore_eos: true,
                        ..Default::default()
                    })
                    .collect()
            };
            let (b, f) = match (round % 2, &lengths) {
                (1, Some(l)) => {
                    let f = run_batch(&model, &args.model, &prompt, free_params(l))?;
                    (run_batch(&model, &args.model, &prompt, bound_params)?, f)
                }
                _ => {
                    let b = run_batch(&model, &args.model, &prompt, bound_params)?;
                    let l: Vec<usize> = b.outputs.iter().map(|(_, k)| *k).collect();
                    (b, run_batch(&model, &args.model, &prompt, free_params(&l))?)
                }
            };
            lengths = Some(b.outputs.iter().map(|(_, k)| *k).collect());
            let tokens = |r: &Run| r.outputs.iter().map(|(_, k)| *k).sum::<usize>() as f64;
            bound.push(tokens(&b) / b.secs);
            free.push(tokens(&f) / f.secs);
            let (mut us, mut k) = (0.0, 0);
            for (text, _) in &b.outputs {
                let (u, m) = mask_alone(&model, &grammar, text)?;
                us += u;
                k += m;
            }
            mask.push(us / k.max(1) as f64);
        }
        let (f, b, m) = (median(free), median(bound), median(mask));
        let share = m / (1e6 / f);
        if args.json {
            println!("{}", json!({"sequences": n, "free_tok_s": f, "bound_tok_s": b, "mask_us_per_token": m, "mask_share": share}));
        } else {
            println!("| {n} | {f:.1} | {b:.1} | {:.2} | {m:.1} µs | {:.2}% |", b / f, share * 100.0);
        }
    }
    if !args.json {
        println!(
            "reproduce: engram bench grammar{}",
            args.model.model.as_ref().map_or(String::new(), |m| format!(" --model {}", m.display()))
        );
    }
    Ok(())
}
