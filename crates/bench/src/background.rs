//! `engram bench background`: what low-priority background work (the forward work a policy
//! asks the engine for: a summary's generation, a stream's prefill) costs requests that run
//! beside it, and how much of it a busy server still gets done, at several
//! `--background-share` values.
//!
//! Per column, a fresh engine; `--sessions` requests decode `--decode-tokens` each, submitted
//! together, while the policy keeps one generation job of `--job-prompt-tokens` +
//! `--job-tokens` queued at all times (a summary's shape). `none` runs the requests alone.
//! Reported: the requests' inter-token latency (p50, p95; per token, the engine thread's own
//! timestamps), their aggregate decode tokens/s, and the background rows the engine computed
//! while they ran. The columns are interleaved round by round (same machine load) and each
//! latency is the median over rounds.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use engram_context::{SessionStore, SessionsConfig};
use engram_engine::scheduler::{Event, EventSink, Job};
use engram_engine::{
    AdmitRequest, BackgroundDone, BackgroundJob, BackgroundPriority, Checkout, ContextPolicy, EngineHandle, MatchKind, Metrics, OwnerKey,
    PolicyLayer, SamplingParams, SchedulerConfig,
};
use engram_kv::{KvPool, SeqKv};
use engram_model::Model;

use crate::common::{kv_pool, load_model, model_path, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Requests decoding at once.
    #[arg(long, default_value_t = 2)]
    sessions: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 32)]
    prompt_tokens: usize,
    /// Tokens each request decodes.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// The background job's prompt and generated tokens (a summary: its facts, then the summary).
    #[arg(long, default_value_t = 256)]
    job_prompt_tokens: usize,
    #[arg(long, default_value_t = 64)]
    job_tokens: usize,
    /// Background shares measured, comma-separated (each beside the `none` baseline).
    #[arg(long, default_value = "0,0.1,0.25")]
    shares: String,
    /// Rounds (columns interleaved within each).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

/// The session store plus a background generation job always queued (when `endless`).
struct Endless {
    inner: SessionStore,
    endless: bool,
    prompt: Vec<u32>,
    max_tokens: usize,
    pool: KvPool,
    next: u64,
    failed: Arc<AtomicU64>,
}

impl PolicyLayer for Endless {
    fn inner(&self) -> &dyn ContextPolicy {
        &self.inner
    }
    fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
        &mut self.inner
    }
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.inner.admit(req)
    }
    fn next_background(&mut self) -> Option<BackgroundJob> {
        if !self.endless {
            return None;
        }
        self.next += 1;
        let n = self.prompt.len();
        Some(BackgroundJob {
            owner: OwnerKey::parse("background"),
            tag: self.next,
            start: Checkout::own("summary".into(), MatchKind::Miss, self.prompt.clone(), vec![0; n], 0, SeqKv::new(&self.pool)),
            max_tokens: self.max_tokens,
            stop: Vec::new(),
            priority: BackgroundPriority::Low,
            hidden: Vec::new(),
        })
    }
    fn background_done(&mut self, done: BackgroundDone) {
        if done.outcome.is_err() {
            self.failed.fetch_add(1, Relaxed);
        }
    }
}

/// What one request's events said: each token's arrival (its log-probability event, one per
/// token), the engine's background rows at its first token and at its end, and how it ended.
#[derive(Default)]
struct Seen {
    times: Vec<Instant>,
    rows_at_first: Option<u64>,
    rows_at_end: u64,
    end: Option<Result<(), String>>,
}

#[derive(Clone)]
struct Tokens(Arc<Mutex<Seen>>, Arc<Metrics>);

impl EventSink for Tokens {
    fn send(&self, e: Event) -> bool {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let rows = self.1.background_rows.load(Relaxed);
        match e {
            Event::Logprob(_) => {
                t.times.push(Instant::now());
                t.rows_at_first.get_or_insert(rows);
            }
            Event::Finished { .. } => {
                t.end = Some(Ok(()));
                t.rows_at_end = rows;
            }
            Event::Failed(e) => t.end = Some(Err(e.message)),
            Event::Started { .. } | Event::Text(_) => {}
        }
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// One column's run: every inter-token gap (s), the aggregate decode tokens/s and the
/// background rows computed from the requests' first token to their last.
struct Column {
    gaps: Vec<f64>,
    decode_tok_s: f64,
    background_rows: u64,
}

fn tokens_of(model: &Model, n: usize, salt: u64) -> Vec<u32> {
    let vocab = model.tokenizer.vocab_size().min(model.config.vocab).max(2) as u64;
    (0..n as u64).map(|i| ((i * 7919 + salt * 104_729 + 13) % (vocab - 1) + 1) as u32).collect()
}

fn run_column(model: &Arc<Model>, pool: &KvPool, a: &Args, share: Option<f32>, round: u64) -> Result<Column> {
    let metrics = Arc::new(Metrics::default());
    let failed = Arc::new(AtomicU64::new(0));
    let config = SchedulerConfig { max_batch: a.sessions + 2, background_share: share.unwrap_or(0.0), ..Default::default() };
    let policy = Endless {
        inner: SessionStore::from_config(model, pool, &SessionsConfig::default()),
        endless: share.is_some(),
        prompt: tokens_of(model, a.job_prompt_tokens, 1_000 + round),
        max_tokens: a.job_tokens,
        pool: pool.clone(),
        next: 0,
        failed: failed.clone(),
    };
    let (handle, thread) = EngineHandle::start(model.clone(), pool.clone(), config, metrics.clone(), move |_, _| Box::new(policy));
    // Let the background job start first, as on a server that was already busy with it.
    std::thread::sleep(Duration::from_millis(50));
    let params = SamplingParams { max_tokens: a.decode_tokens, ignore_eos: true, logprobs: Some(0), ..Default::default() };
    let t0 = Instant::now();
    let sinks: Vec<Tokens> = (0..a.sessions).map(|_| Tokens(Arc::default(), metrics.clone())).collect();
    for (i, sink) in sinks.iter().enumerate() {
        let prompt = tokens_of(model, a.prompt_tokens, round * 100 + i as u64);
        let job = Job::from_tokens(format!("user{i}").as_str().into(), prompt, params.clone());
        handle.submit(job, Box::new(sink.clone())).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    loop {
        let ended: Vec<Option<Result<(), String>>> =
            sinks.iter().map(|s| s.0.lock().unwrap_or_else(|e| e.into_inner()).end.clone()).collect();
        if let Some(Err(e)) = ended.iter().flatten().find(|r| r.is_err()) {
            bail!("a request failed: {e}");
        }
        if ended.iter().all(Option::is_some) {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    drop(handle);
    thread.join().map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    if failed.load(Relaxed) > 0 {
        bail!("{} background jobs failed", failed.load(Relaxed));
    }
    let (mut gaps, mut first, mut rows_from, mut rows_to) = (Vec::new(), None::<Instant>, u64::MAX, 0);
    for s in &sinks {
        let seen = s.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&t) = seen.times.first() {
            first = Some(first.map_or(t, |f| f.min(t)));
        }
        rows_from = rows_from.min(seen.rows_at_first.unwrap_or(u64::MAX));
        rows_to = rows_to.max(seen.rows_at_end);
        gaps.extend(seen.times.windows(2).map(|w| w[1].duration_since(w[0]).as_secs_f64()));
    }
    let background_rows = rows_to.saturating_sub(rows_from);
    let decode_time = first.map_or(elapsed, |f| elapsed - f.duration_since(t0).as_secs_f64()).max(1e-9);
    Ok(Column { gaps, decode_tok_s: (a.sessions * a.decode_tokens.saturating_sub(1)) as f64 / decode_time, background_rows })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

/// Runs the columns, interleaved per round, and prints the table.
pub fn run(mut a: Args) -> Result<()> {
    let model_id = model_path(&mut a.model)?;
    let model = Arc::new(load_model(&a.model)?);
    let pool = kv_pool(&model, &a.model)?;
    let mut columns: Vec<Option<f32>> = vec![None];
    for s in a.shares.split(',') {
        let v: f32 = s.trim().parse().with_context(|| format!("--shares: {s:?}"))?;
        if !(0.0..=1.0).contains(&v) {
            bail!("--shares: {v} is not between 0 and 1");
        }
        columns.push(Some(v));
    }
    let name = |c: &Option<f32>| c.map_or("none".to_string(), |s| format!("share {s}"));
    let mut results: Vec<Vec<Column>> = columns.iter().map(|_| Vec::new()).collect();
    for round in 0..a.rounds.max(1) as u64 {
        for (i, c) in columns.iter().enumerate() {
            eprintln!("round {}: {}", round + 1, name(c));
            results[i].push(run_column(&model, &pool, &a, *c, round)?);
        }
    }
    let base_p50 = median(results[0].iter().map(|c| sorted_pct(&c.gaps, 0.5)).collect());
    if !a.json {
        println!(
            "engram bench background: {model_id}, {} requests × {} tokens beside a {}+{}-token background job, {} rounds",
            a.sessions, a.decode_tokens, a.job_prompt_tokens, a.job_tokens, a.rounds
        );
        println!(
            "| background | inter-token p50 (ms) | p95 (ms) | p50 / none | decode tok/s (requests) | background rows while they ran |"
        );
        println!("|---|---|---|---|---|---|");
    }
    for (c, runs) in columns.iter().zip(&results) {
        let p50 = median(runs.iter().map(|r| sorted_pct(&r.gaps, 0.5)).collect());
        let p95 = median(runs.iter().map(|r| sorted_pct(&r.gaps, 0.95)).collect());
        let tok_s = median(runs.iter().map(|r| r.decode_tok_s).collect());
        let rows = median(runs.iter().map(|r| r.background_rows as f64).collect());
        if a.json {
            println!(
                "{}",
                serde_json::json!({"bench": "background", "model": model_id, "background": name(c), "share": c, "p50_ms": p50 * 1e3, "p95_ms": p95 * 1e3, "decode_tok_s": tok_s, "background_rows": rows})
            );
        } else {
            println!("| {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.0} |", name(c), p50 * 1e3, p95 * 1e3, p50 / base_p50, tok_s, rows);
        }
    }
    Ok(())
}

fn sorted_pct(gaps: &[f64], p: f64) -> f64 {
    let mut v = gaps.to_vec();
    v.sort_by(f64::total_cmp);
    percentile(&v, p)
}
