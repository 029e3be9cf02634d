//! `engram bench serve`: aggregate decode tokens/s with 1, 2, 4, 8 concurrent sessions
//! through the server's scheduler, in process (figures defined in `serve/stats.rs`), then
//! a second user's time to first token with staggered arrivals.

mod stats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use engram_engine::SamplingParams;
use engram_server::{Event, Job, SchedulerConfig, Server, ServerConfig};

use crate::common::{kv_pool, load_model, model_path, ModelArgs};
use stats::{EngineClock, ServeStats, SessionTiming};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens per session.
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Tokens decoded per session.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Concurrency levels, comma-separated.
    #[arg(long, default_value = "1,2,4,8")]
    concurrency: String,
    /// Rounds of every level, run in turn (1, 4, 1, 4, …): the host's memory bandwidth drifts
    /// between levels a few seconds apart, so the ratio to one session is taken within each
    /// round and the median over rounds reported.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// One prompt's chunk a step (the server's `--one-prompt-per-step`) instead of the
    /// sessions' prompts sharing it.
    #[arg(long)]
    one_prompt_per_step: bool,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

/// Runs every concurrency level (after one unreported warm-up pass at concurrency 1), then the
/// staggered arrivals; each level's figures must add up or the run fails.
pub fn run(mut a: Args) -> Result<()> {
    let model_id = model_path(&mut a.model)?;
    let model = Arc::new(load_model(&a.model)?);
    let pool = kv_pool(&model, &a.model)?;
    let levels: Vec<usize> = a.concurrency.split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>().context("--concurrency")?;
    // At least 2, so the staggered-arrival measurement can batch its two users.
    let max_c = levels.iter().copied().max().unwrap_or(1).max(2);
    let config = ServerConfig {
        scheduler: SchedulerConfig { max_batch: max_c, pack_prompts: !a.one_prompt_per_step, ..Default::default() },
        ..ServerConfig::new(model_id)
    };
    let server = Server::start(model.clone(), pool, config);
    let engine = server.engine();
    // The engine's own token clock (see stats.rs): text events are no clock for tokens.
    let metrics = server.metrics();
    let vocab = model.tokenizer.vocab_size().min(model.config.vocab).max(1) as u64;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    anyhow::ensure!(a.rounds >= 1, "--rounds must be at least 1");
    let mut round = 0u64;
    // Concurrency 1's aggregate decode and overall rates in the current round, the bases of
    // the ratios (when 1 is among the levels).
    let mut single: Option<(f64, f64)> = None;
    let mut per_level: Vec<LevelRounds> = levels.iter().map(|&c| LevelRounds { concurrency: c, ..Default::default() }).collect();
    let schedule = (0..a.rounds).flat_map(|r| levels.iter().enumerate().map(move |(i, &c)| (r, i, c)));
    for (rep, level, c) in std::iter::once((0, usize::MAX, 1)).chain(schedule) {
        // The first pass (concurrency 1) warms the weights up and is not reported.
        let warm = round == 0;
        round += 1;
        let params = SamplingParams { max_tokens: a.decode_tokens, ignore_eos: true, ..Default::default() };
        let clock0 = EngineClock::read(&metrics.render());
        let t0 = Instant::now();
        let mut rxs = Vec::with_capacity(c);
        for i in 0..c as u64 {
            // Distinct prompts per session and round, so nothing is reused.
            let salt = round * 1000 + i;
            let prompt: Vec<u32> = (0..a.prompt_tokens as u64).map(|k| ((k * 2_654_435_761 + salt * 97 + 12345) % vocab) as u32).collect();
            let job = Job::from_tokens(format!("bench-{salt}").into(), prompt, params.clone());
            rxs.push(engine.submit(job).map_err(|e| anyhow::anyhow!(e.message))?);
        }
        // Every receiver is drained concurrently, so the times are when events arrived.
        let timings: Vec<SessionTiming> = rt.block_on(async {
            let tasks: Vec<_> = rxs
                .into_iter()
                .map(|mut rx| {
                    tokio::spawn(async move {
                        while let Some(ev) = rx.recv().await {
                            match ev {
                                Event::Finished { completion_tokens, .. } => {
                                    return Ok(SessionTiming { finished: t0.elapsed(), tokens: completion_tokens });
                                }
                                Event::Failed(e) => return Err(anyhow::anyhow!(e.message)),
                                _ => {}
                            }
                        }
                        Err(anyhow::anyhow!("the engine stopped"))
                    })
                })
                .collect();
            let mut out = Vec::with_capacity(tasks.len());
            for t in tasks {
                out.push(t.await??);
            }
            anyhow::Ok(out)
        })?;
        let wall = t0.elapsed();
        if warm {
            continue;
        }
        let clock = EngineClock::read(&metrics.render()).since(&clock0);
        let st = ServeStats::new(&timings, clock, wall);
        anyhow::ensure!(st.adds_up(), "bench serve bookkeeping: the figures do not add up: {st:?}");
        if level == 0 {
            // A new round: its one-session figure comes first when 1 is a level.
            single = None;
        }
        if c == 1 {
            single = Some((st.aggregate_decode_tok_s, st.overall_tok_s));
        }
        let scaling = single.map(|(s1, _)| st.scaling_vs(s1));
        let l = &mut per_level[level];
        l.decode.push(st.aggregate_decode_tok_s);
        l.overall.push(st.overall_tok_s);
        l.ttft_ms.push(st.mean_ttft_ms);
        if let Some((s1, o1)) = single.filter(|(s1, o1)| *s1 > 0.0 && *o1 > 0.0) {
            l.decode_ratios.push(st.aggregate_decode_tok_s / s1);
            l.overall_ratios.push(st.overall_tok_s / o1);
        }
        let ttft_ms = st.mean_ttft_ms;
        let round_tag = if a.rounds > 1 { format!("round {} ", rep + 1) } else { String::new() };
        if a.json {
            println!(
                "{}",
                serde_json::json!({"round": rep + 1, "concurrency": c, "aggregate_decode_tok_s": st.aggregate_decode_tok_s,
                                   "mean_session_decode_tok_s": st.mean_session_decode_tok_s,
                                   "decode_s_sessions": st.clock.decode_s, "scaling_vs_one_session": scaling,
                                   "overall_tok_s": st.overall_tok_s, "adds_up": st.adds_up(),
                                   "mean_ttft_ms": ttft_ms, "tokens": st.tokens,
                                   "prompt_tokens": a.prompt_tokens, "decode_tokens": a.decode_tokens,
                                   "threads": engram_kernels::num_threads(), "model": model.describe(), "kv_format": a.model.kv_format,
                                   "attention": model.attention().name()})
            );
        } else {
            let sc = scaling.map(|v| format!(", {:.2} of linear", v)).unwrap_or_default();
            println!(
                "{round_tag}concurrency {c:>2}: {:>9.1} tok/s aggregate decode (per session {:.1}{sc}), {:>9.1} tok/s overall, mean TTFT {ttft_ms:.1} ms",
                st.aggregate_decode_tok_s, st.mean_session_decode_tok_s, st.overall_tok_s
            );
        }
    }
    if a.rounds > 1 {
        summarize(&per_level, a.json);
    }
    staggered(&a, &engine, &metrics, &rt, vocab)
}

/// One concurrency level's figures, a value per round; the ratios are to the same round's one
/// session.
#[derive(Default)]
struct LevelRounds {
    concurrency: usize,
    decode: Vec<f64>,
    decode_ratios: Vec<f64>,
    overall: Vec<f64>,
    overall_ratios: Vec<f64>,
    ttft_ms: Vec<f64>,
}

/// The median over rounds of every level's aggregate decode and overall rates, of their ratios
/// to the same round's one session (each ratio measured side by side, then its median: robust
/// to the host's drift between rounds), and of the mean time to first token.
fn summarize(per_level: &[LevelRounds], json: bool) {
    for l in per_level {
        let (c, agg, overall, ttft) = (l.concurrency, stats::median(&l.decode), stats::median(&l.overall), stats::median(&l.ttft_ms));
        let ratio = (!l.decode_ratios.is_empty()).then(|| stats::median(&l.decode_ratios));
        let overall_ratio = (!l.overall_ratios.is_empty()).then(|| stats::median(&l.overall_ratios));
        if json {
            println!(
                "{}",
                serde_json::json!({"summary": true, "concurrency": c, "median_aggregate_decode_tok_s": agg,
                                   "median_ratio_to_one_session": ratio, "ratios": l.decode_ratios,
                                   "median_overall_tok_s": overall, "median_overall_ratio_to_one_session": overall_ratio,
                                   "median_mean_ttft_ms": ttft})
            );
        } else {
            let r = match ratio {
                Some(m) => {
                    let each: Vec<String> = l.decode_ratios.iter().map(|r| format!("{r:.2}")).collect();
                    format!(", {m:.2}x one session (median of rounds: {})", each.join(", "))
                }
                None => String::new(),
            };
            let o = overall_ratio.map(|m| format!(" ({m:.2}x one session)")).unwrap_or_default();
            println!(
                "median over {} rounds, concurrency {c:>2}: {agg:>9.1} tok/s aggregate decode{r}; {overall:.1} tok/s overall{o}; mean TTFT {ttft:.0} ms",
                l.decode.len()
            );
        }
    }
}

/// Staggered arrivals (the multi-agent design's case): user B arrives when user A has its first
/// token. B's time to first token with interleaved prefill + decode, against
/// B's wait if requests ran one after the other (A's remaining generation,
/// then B alone) — both measured from B's arrival.
fn staggered(
    a: &Args,
    engine: &engram_server::EngineHandle,
    metrics: &engram_server::Metrics,
    rt: &tokio::runtime::Runtime,
    vocab: u64,
) -> Result<()> {
    let prompt =
        |salt: u64| -> Vec<u32> { (0..a.prompt_tokens as u64).map(|k| ((k * 2_654_435_761 + salt * 97 + 12345) % vocab) as u32).collect() };
    let params = SamplingParams { max_tokens: a.decode_tokens, ignore_eos: true, ..Default::default() };
    let job = |salt: u64| Job {
        owner: format!("stagger-{salt}").into(),
        session: None,
        text: None,
        add_special: false,
        prompt: prompt(salt),
        params: params.clone(),
        pinned: false,
        long_context_after: None,
    };
    // A job's first token by the engine's clock (its first-token count), not by text events,
    // which the detokenizer may hold back to the end (then the old wait never saw one).
    let firsts = || EngineClock::read(&metrics.render()).first_tokens;
    let first_token = |mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>, before: u64| async move {
        loop {
            if firsts() > before {
                return Ok(rx);
            }
            match rx.try_recv() {
                Ok(Event::Failed(e)) => return Err(anyhow::anyhow!(e.message)),
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) if firsts() <= before => {
                    return Err(anyhow::anyhow!("the engine stopped"))
                }
                _ => tokio::time::sleep(Duration::from_micros(500)).await,
            }
        }
    };
    let finish = |mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>| async move { while rx.recv().await.is_some() {} };
    // Submits a job; also returns the engine's first-token count just before.
    let sub = |j: Job| {
        let before = firsts();
        engine.submit(j).map(|rx| (rx, before)).map_err(|e| anyhow::anyhow!(e.message))
    };
    rt.block_on(async {
        // Interleaved: B joins while A decodes.
        let (rx, n) = sub(job(900_001))?;
        let rx_a = first_token(rx, n).await?;
        let t_b = Instant::now();
        let (rx, n) = sub(job(900_002))?;
        let rx_b = first_token(rx, n).await?;
        let interleaved = t_b.elapsed().as_secs_f64();
        finish(rx_a).await;
        finish(rx_b).await;
        // Sequential: B waits for A to finish, then runs alone.
        let (rx, n) = sub(job(900_003))?;
        let rx_a = first_token(rx, n).await?;
        let t_b = Instant::now();
        finish(rx_a).await;
        let (rx, n) = sub(job(900_004))?;
        let rx_b = first_token(rx, n).await?;
        let sequential = t_b.elapsed().as_secs_f64();
        finish(rx_b).await;
        let row = serde_json::json!({"second_user_ttft_interleaved_ms": interleaved * 1e3, "second_user_ttft_sequential_ms": sequential * 1e3,
                                     "speedup": sequential / interleaved, "prompt_tokens": a.prompt_tokens, "decode_tokens": a.decode_tokens});
        if a.json {
            println!("{row}");
        } else {
            println!("second user TTFT: {:.1} ms interleaved vs {:.1} ms sequential ({:.2}x)", interleaved * 1e3, sequential * 1e3, sequential / interleaved);
        }
        anyhow::Ok(())
    })
}
