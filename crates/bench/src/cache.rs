//! `engram bench cache`: time to first token for a new 64-token user turn
//! after a history of H tokens — cold (no cache), hot (history in memory),
//! warm (a freshly started process restores the history from disk) — plus
//! shared-prefix TTFT, restore throughput, bytes per token, decode speed at
//! depth and, for approximate KV formats, quality against f32 KV.
//!
//! The warm case runs in a child process (`--warm-child`) that loads the
//! model first (and runs one 4-token step, so weights are paged in as in a
//! server that is up) and then times restore + prefill + first token, so
//! nothing of the parent's memory helps it. It restores as the server does
//! (`open_entry`: the blocks are usable after the header checks, `open_ms`;
//! the checksum runs on its own thread, reading the file in layer order,
//! and the first token counts only once it has passed, `checksum_wait_ms`
//! after the prefill). It runs twice: first with the entry file dropped from
//! the page cache (`posix_fadvise(DONTNEED)`; the fraction still resident is
//! measured with `mincore` and reported), so the restored blocks are read
//! from disk while the prefill runs (`ttft_warm_disk_ms`), then again with
//! the file in the page cache (`ttft_warm_ms`). `restore_ms` is a separate
//! synchronous restore (map + checksum of the whole file) for throughput.
//!
//! Every history is prefilled first; then `--repeat` rounds each run an
//! untimed hot turn, the hot turns of all histories back to back (in reverse
//! order every other round) and then their warm starts, so the
//! ratios (`hot_vs_first_history`: this history's hot TTFT over the first
//! history's in the same round; `warm_vs_hot`, `warm_disk_vs_hot`) are taken
//! side by side within a round — the machine's drift between rounds cancels —
//! and reported as the median over rounds. Without `--json` the rows end as
//! markdown tables on stdout (each row's every field goes to stderr as it is done).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use engram_context::PrefixIndex;
use engram_engine::{LoneSequence, SamplingParams};
use engram_kv::persist::{cache_fingerprint, open_entry, read_entry, write_entry, EntryKind, EntryMeta};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::{Fingerprint, Model};
use serde_json::json;

use crate::common::{data_dir, kv_pool, load_model, ModelArgs};
use crate::shared::evict_from_page_cache;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// History lengths in tokens, comma-separated.
    #[arg(long, default_value = "1024,4096,16384")]
    history: String,
    /// System prompt lengths for the shared-prefix rows (empty: skip).
    #[arg(long, default_value = "180,1024,4096")]
    system: String,
    /// Tokens in the new user message.
    #[arg(long, default_value_t = 64)]
    user_tokens: usize,
    /// Tokens decoded after the first, to measure decode speed at depth.
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// One JSON object per line instead of tables.
    #[arg(long)]
    json: bool,
    /// Rounds: each times every history's hot turn and its two warm starts; times are the
    /// medians over rounds, ratios the medians of each round's ratio (timings on shared
    /// 2-core machines swing by tens of percent between minutes).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Skip the cold (no cache) history measurements, which dominate the run time
    /// (`ttft_cold_ms` is then null): for iterating on hot and warm.
    #[arg(long)]
    skip_cold: bool,
    /// Histories of a model with sliding layers keep those layers' window only
    /// (`SeqKv::release_sliding`, as sessions do), not their whole history: `kv_bytes_held`
    /// against `kv_bytes_full_history` says what that saves.
    #[arg(long)]
    release_sliding: bool,
    /// With `--release-sliding`: also keep the window before the spaced points of the
    /// history (`SeqKv::keep_spaced_windows`, as sessions do), where a later request that
    /// diverges resumes.
    #[arg(long)]
    spaced_windows: bool,
    /// Internal: run the warm measurement for `--entry` and print JSON.
    #[arg(long, hide = true)]
    warm_child: bool,
    #[arg(long, hide = true)]
    entry: Option<PathBuf>,
    /// Internal: drop the entry file from the page cache before the warm measurement.
    #[arg(long, hide = true)]
    evict: bool,
}

fn tokens(model: &Model, n: usize, salt: u64) -> Vec<u32> {
    let vocab = model.tokenizer.vocab_size().min(model.config.vocab).max(2) as u64;
    (0..n as u64).map(|i| (((i + salt) * 2_654_435_761 + 97 * salt + 12345) % (vocab - 1) + 1) as u32).collect()
}

fn one_token() -> SamplingParams {
    SamplingParams { max_tokens: 1, ignore_eos: true, ..Default::default() }
}

fn ttft(gen: &mut LoneSequence<'_>, prompt: &[u32]) -> Result<f64> {
    let t = Instant::now();
    gen.generate(prompt, &one_token(), &mut |_| true)?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// One history length's state across the rounds of [`run`].
struct History {
    /// Its length in tokens.
    len: usize,
    /// History and the new user turn.
    prompt: Vec<u32>,
    /// The prefilled history: its cache and token ids.
    kv: engram_kv::SeqKv,
    ids: Vec<u32>,
    cold_ms: Option<f64>,
    path: PathBuf,
    entry_bytes: u64,
    write_ms: f64,
    hot_ms: Vec<f64>,
    /// Warm-child results: file in the page cache, and evicted from it.
    warm: Vec<serde_json::Value>,
    warm_disk: Vec<serde_json::Value>,
}

impl History {
    /// A generator on a fork of the prefilled history (the history itself stays untouched).
    fn hot<'m>(&self, model: &'m Model) -> LoneSequence<'m> {
        LoneSequence::from_parts(model, self.kv.fork(self.kv.len()), self.ids.clone())
    }
}

pub fn run(a: Args) -> Result<()> {
    let model = load_model(&a.model)?;
    let pool = kv_pool(&model, &a.model)?;
    let format = pool.format();
    let fp = cache_fingerprint(model.fingerprint, format);
    if a.warm_child {
        return warm_child(&a, &model, &pool, &fp);
    }
    let dir = data_dir(&a.model.data_dir).join("bench-cache");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let histories = parse_list(&a.history)?;
    check_budget(&pool, &histories, a.user_tokens, !a.skip_cold)?;
    let mut hs = Vec::new();
    for h in histories {
        eprintln!("history {h}: prefill of {} tokens (the slow part)...", h + a.user_tokens);
        let history = tokens(&model, h, 1);
        let mut prompt = history.clone();
        prompt.extend(tokens(&model, a.user_tokens, 7));
        let cold_ms = if a.skip_cold { None } else { Some(ttft(&mut LoneSequence::new(&model, &pool), &prompt)?) };
        // The history is prefilled once; every hot turn runs on a fork of it, and the
        // persisted entry the warm starts restore is written from it.
        let mut hist_kv = engram_kv::SeqKv::new(&pool);
        if let Some(g) = engram_kv::SlidingLayers::of(&model.config).filter(|_| a.release_sliding) {
            hist_kv.release_sliding(g);
            if a.spaced_windows {
                hist_kv.keep_spaced_windows();
            }
        }
        let mut hist_gen = LoneSequence::from_parts(&model, hist_kv, Vec::new());
        hist_gen.prefill(&history)?;
        let (mut kv, ids) = hist_gen.into_parts();
        kv.release_outside_window();
        let path = dir.join(format!("history-{h}-{format}.safetensors"));
        let meta = EntryMeta {
            fingerprint: fp.clone(),
            kind: EntryKind::Session,
            owner: "bench".into(),
            tokens: ids.clone(),
            text: String::new(),
            offsets: Vec::new(),
            created_unix: 0,
        };
        let t = Instant::now();
        let entry_bytes = write_entry(&path, &meta, &kv)?;
        let write_ms = t.elapsed().as_secs_f64() * 1e3;
        hs.push(History { len: h, prompt, kv, ids, cold_ms, path, entry_bytes, write_ms, hot_ms: vec![], warm: vec![], warm_disk: vec![] });
    }
    // Rounds: the hot turns of every history back to back (side by side, so the machine's
    // drift cancels in their ratios), then each history's two warm starts (fresh processes).
    let rounds = a.repeat.max(1);
    for round in 0..rounds {
        eprintln!("round {}/{rounds}: hot turns, then warm starts...", round + 1);
        // An untimed turn first (after the warm-start children the caches and the thread pool
        // are cold, which would burden whichever history came first), then every history,
        // in reverse order every other round.
        if let Some(x) = hs.first() {
            ttft(&mut x.hot(&model), &x.prompt)?;
        }
        let order: Vec<usize> = if round % 2 == 0 { (0..hs.len()).collect() } else { (0..hs.len()).rev().collect() };
        for i in order {
            let x = &mut hs[i];
            let mut hot = x.hot(&model);
            x.hot_ms.push(ttft(&mut hot, &x.prompt)?);
        }
        for x in hs.iter_mut() {
            x.warm_disk.push(warm_run(&a, &x.path, x.len, true)?);
            x.warm.push(warm_run(&a, &x.path, x.len, false)?);
        }
    }
    let mut rows = Vec::new();
    let first_hot = hs.first().map(|x| x.hot_ms.clone()).unwrap_or_default();
    for x in hs {
        // Decode speed at this depth, continuing a hot sequence.
        let mut gen = x.hot(&model);
        let t = Instant::now();
        let g = gen.generate(
            &x.prompt,
            &SamplingParams { max_tokens: a.decode_tokens + 1, ignore_eos: true, ..Default::default() },
            &mut |_| true,
        )?;
        let decode_tok_s = (g.tokens.len().saturating_sub(1)) as f64 / (t.elapsed().as_secs_f64() - g.timings.ttft_ms / 1e3).max(1e-9);
        drop(gen);
        let _ = std::fs::remove_file(&x.path);
        let warm_ms =
            |runs: &[serde_json::Value]| -> Vec<f64> { runs.iter().map(|r| r["ttft_warm_ms"].as_f64().unwrap_or(f64::NAN)).collect() };
        let per_round = |num: &[f64], den: &[f64]| median(num.iter().zip(den).map(|(n, d)| n / d).collect());
        let (warm, disk) = (median_by_ttft(x.warm.clone()), median_by_ttft(x.warm_disk.clone()));
        rows.push(json!({
            "history_tokens": x.len,
            "kv_format": format.name(),
            "attention": model.attention().name(),
            "user_tokens": a.user_tokens,
            "ttft_cold_ms": x.cold_ms.map(round),
            "ttft_hot_ms": round(median(x.hot_ms.clone())),
            "hot_vs_first_history": round(per_round(&x.hot_ms, &first_hot)),
            "ttft_hot_rounds_ms": x.hot_ms.iter().map(|&t| round(t)).collect::<Vec<_>>(),
            "ttft_warm_ms": warm["ttft_warm_ms"],
            "ttft_warm_rounds_ms": warm_ms(&x.warm).iter().map(|&t| round(t)).collect::<Vec<_>>(),
            "ttft_warm_disk_rounds_ms": warm_ms(&x.warm_disk).iter().map(|&t| round(t)).collect::<Vec<_>>(),
            "warm_vs_hot": round(per_round(&warm_ms(&x.warm), &x.hot_ms)),
            "restore_ms": warm["restore_ms"],
            "restore_gb_s": warm["restore_gb_s"],
            "ttft_warm_disk_ms": disk["ttft_warm_ms"],
            "warm_disk_vs_hot": round(per_round(&warm_ms(&x.warm_disk), &x.hot_ms)),
            "resident_before_disk_run": disk["resident_fraction"],
            "restore_disk_ms": disk["restore_ms"],
            "restore_disk_gb_s": disk["restore_gb_s"],
            "open_ms": warm["open_ms"],
            "open_disk_ms": disk["open_ms"],
            "checksum_wait_ms": warm["checksum_wait_ms"],
            "checksum_wait_disk_ms": disk["checksum_wait_ms"],
            "persist_write_ms": round(x.write_ms),
            "entry_bytes": x.entry_bytes,
            "bytes_per_token": pool.bytes_per_token(),
            "kv_bytes_held": x.kv.num_bytes(),
            "kv_bytes_full_history": pool.bytes_for(x.len),
            "decode_tok_s_at_depth": round(decode_tok_s),
            "threads": engram_kernels::num_threads(),
            "repeats": rounds,
        }));
        print_row(&a, rows.last().unwrap());
    }
    for &s in &parse_list(&a.system)? {
        let system = tokens(&model, s, 3);
        let mut prompt = system.clone();
        prompt.extend(tokens(&model, a.user_tokens, 11));
        let cold = ttft(&mut LoneSequence::new(&model, &pool), &prompt)?;
        let mut index = PrefixIndex::new(Fingerprint(model.fingerprint.0 ^ 1));
        let mut g = LoneSequence::new(&model, &pool);
        g.prefill(&system)?;
        let (kv, toks) = g.into_parts();
        index.insert(None, &toks, &kv);
        drop(kv);
        let t = Instant::now();
        let shared = index.lookup(&pool, None, &prompt);
        let reused = shared.len();
        let mut gen = LoneSequence::from_parts(&model, shared, prompt[..reused].to_vec());
        gen.generate(&prompt, &one_token(), &mut |_| true)?;
        let hit = t.elapsed().as_secs_f64() * 1e3;
        rows.push(json!({
            "system_prompt_tokens": s,
            "kv_format": format.name(),
            "attention": model.attention().name(),
            "reused_tokens": reused,
            "ttft_cold_ms": round(cold),
            "ttft_shared_prefix_ms": round(hit),
            "speedup": round(cold / hit),
        }));
        print_row(&a, rows.last().unwrap());
    }
    if !format.is_exact() {
        rows.push(quality(&model, format)?);
        print_row(&a, rows.last().unwrap());
    }
    if !a.json {
        print_tables(&rows);
    }
    Ok(())
}

/// Every history stays in memory through the rounds (and, with `cold`, the largest is also
/// prefilled once more beside them): fail at once, saying what budget would do, rather than
/// minutes in.
fn check_budget(pool: &KvPool, histories: &[usize], user_tokens: usize, cold: bool) -> Result<()> {
    let blocks = |tokens: usize| tokens.div_ceil(engram_kv::BLOCK_TOKENS) + 1;
    let largest = histories.iter().copied().max().unwrap_or(0);
    let held: usize = histories.iter().map(|&h| blocks(h + user_tokens)).sum();
    let need = (held + if cold { blocks(largest + user_tokens) } else { 0 }) * pool.block_bytes();
    anyhow::ensure!(
        need <= pool.budget(),
        "bench cache keeps every history's KV in memory, and without --skip-cold prefills the largest once more: {} MiB \
         for {histories:?} in {}; the KV budget is {} MiB: pass --kv-budget-mib {} or fewer --history lengths",
        need >> 20,
        pool.format(),
        pool.budget() >> 20,
        (need >> 20) + 64
    );
    Ok(())
}

/// The history and shared-prefix rows as markdown tables (stdout; `--json` prints the rows).
fn print_tables(rows: &[serde_json::Value]) {
    let ms = |v: &serde_json::Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.0} ms"));
    let x = |v: &serde_json::Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.2}x"));
    let hist: Vec<_> = rows.iter().filter(|r| r.get("history_tokens").is_some()).collect();
    if let Some(r0) = hist.first() {
        let text = |k: &str| r0[k].as_str().unwrap_or("?").to_string();
        println!(
            "\nKV {}, attention {}, {} threads; medians of {} rounds, ratios the medians of each round's ratio",
            text("kv_format"),
            text("attention"),
            r0["threads"],
            r0["repeats"]
        );
        println!("| history | cold TTFT | hot TTFT | hot / first row | warm TTFT | warm / hot | warm, file evicted | evicted / hot | decode tok/s | bytes/token |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in hist {
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} |",
                r["history_tokens"],
                ms(&r["ttft_cold_ms"]),
                ms(&r["ttft_hot_ms"]),
                x(&r["hot_vs_first_history"]),
                ms(&r["ttft_warm_ms"]),
                x(&r["warm_vs_hot"]),
                ms(&r["ttft_warm_disk_ms"]),
                x(&r["warm_disk_vs_hot"]),
                r["decode_tok_s_at_depth"].as_f64().unwrap_or(f64::NAN),
                r["bytes_per_token"],
            );
        }
    }
    for r in rows.iter().filter(|r| r.get("quality_vs_f32").is_some()) {
        println!("\nquality: {}", fields(r));
    }
    let sys: Vec<_> = rows.iter().filter(|r| r.get("system_prompt_tokens").is_some()).collect();
    if !sys.is_empty() {
        println!("\n| system prompt | cold TTFT | shared-prefix TTFT | speed-up |");
        println!("|---:|---:|---:|---:|");
        for r in sys {
            println!(
                "| {} | {} | {} | {} |",
                r["system_prompt_tokens"],
                ms(&r["ttft_cold_ms"]),
                ms(&r["ttft_shared_prefix_ms"]),
                x(&r["speedup"])
            );
        }
    }
}

/// Logit error and top-1 agreement of `format` KV against f32 KV over 512 tokens of real text
/// (prefilled; `engram bench fidelity` scores token by token and compares more schemes).
fn quality(model: &Model, format: KvFormat) -> Result<serde_json::Value> {
    let text = engram_tokenizer::FIXTURE_CORPUS.chars().take(4000).collect::<String>();
    let mut ids = model.tokenizer.encode(&text, true)?.ids;
    ids.truncate(512);
    let layout = KvLayout::of(&model.config);
    let exact = LoneSequence::new(model, &KvPool::new(layout, KvFormat::F32, 1 << 34)).score(&ids)?;
    let pool = KvPool::new(layout, format, 1 << 34);
    let approx = LoneSequence::new(model, &pool).score(&ids)?;
    let bytes_vs_f16 = pool.bytes_per_token() as f64 / KvPool::new(layout, KvFormat::F16, 1).bytes_per_token() as f64;
    let mut row = crate::fidelity::measure::Scores::compare(&exact, &approx, model.config.vocab, &[]).json();
    let obj = row.as_object_mut().expect("Scores::json is an object");
    obj.retain(|k, _| ["positions", "top1_agreement", "mean_kl_nats", "max_rel_logit_err"].contains(&k.as_str()));
    obj.insert("bytes_vs_f16".into(), ((bytes_vs_f16 * 1e3).round() / 1e3).into());
    obj.insert("quality_vs_f32".into(), format.name().into());
    Ok(row)
}

/// The middle of `xs` (the upper middle for an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The warm run with the median TTFT.
fn median_by_ttft(mut runs: Vec<serde_json::Value>) -> serde_json::Value {
    runs.sort_by(|x, y| x["ttft_warm_ms"].as_f64().unwrap_or(0.0).total_cmp(&y["ttft_warm_ms"].as_f64().unwrap_or(0.0)));
    runs.swap_remove(runs.len() / 2)
}

/// Runs the warm-start child for the entry at `path` and returns its JSON line.
fn warm_run(a: &Args, path: &std::path::Path, h: usize, evict: bool) -> Result<serde_json::Value> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(child_args(a, path, h));
    if evict {
        cmd.arg("--evict");
    }
    let child = cmd.output().context("running the warm-start child")?;
    if !child.status.success() {
        anyhow::bail!("warm child failed: {}", String::from_utf8_lossy(&child.stderr));
    }
    serde_json::from_slice(&child.stdout).context("warm child output")
}

fn warm_child(a: &Args, model: &Model, pool: &KvPool, fp: &str) -> Result<()> {
    let path = a.entry.as_ref().context("--entry is required with --warm-child")?;
    let h = parse_list(&a.history)?[0];
    let mut prompt = tokens(model, h, 1);
    prompt.extend(tokens(model, a.user_tokens, 7));
    // A started server has run steps already: page the weights in and start
    // the thread pool before timing, as `bench speed` does.
    LoneSequence::new(model, pool).prefill(&prompt[..4.min(prompt.len())])?;
    let resident = if a.evict { evict_from_page_cache(path)? } else { 1.0 };
    // As the server restores: the checksum runs beside the prefill, and the
    // first token counts only once the checksum has passed.
    let t = Instant::now();
    let (meta, kv, check) = open_entry(path, pool, fp, model.config.vocab)?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut gen = LoneSequence::from_parts(model, kv, meta.tokens);
    gen.generate(&prompt, &one_token(), &mut |_| true)?;
    let computed_ms = t.elapsed().as_secs_f64() * 1e3;
    check.wait()?;
    let ttft = t.elapsed().as_secs_f64() * 1e3;
    drop(gen);

    // Restore throughput on its own: a synchronous restore (map + checksum),
    // from disk again when the file was evicted for this run.
    if a.evict {
        evict_from_page_cache(path)?;
    }
    let t = Instant::now();
    let (_, kv) = read_entry(path, pool, fp, model.config.vocab)?;
    let restore_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(kv);
    let bytes = std::fs::metadata(path)?.len() as f64;
    println!(
        "{}",
        json!({
            "ttft_warm_ms": round(ttft),
            "open_ms": round(open_ms),
            "checksum_wait_ms": round(ttft - computed_ms),
            "restore_ms": round(restore_ms),
            "restore_gb_s": round(bytes / (restore_ms / 1e3) / 1e9),
            "resident_fraction": round(resident),
        })
    );
    Ok(())
}

fn child_args(a: &Args, entry: &std::path::Path, h: usize) -> Vec<String> {
    let mut v = vec!["bench".into(), "cache".into(), "--warm-child".into(), "--entry".into(), entry.display().to_string()];
    v.extend(["--history".into(), h.to_string(), "--user-tokens".into(), a.user_tokens.to_string()]);
    v.extend(["--kv-format".into(), a.model.kv_format.clone(), "--kv-budget-mib".into(), a.model.kv_budget_mib.to_string()]);
    v.extend(["--attention".into(), a.model.attention.name().into()]);
    if let Some(m) = &a.model.model {
        v.extend(["--model".into(), m.display().to_string()]);
    }
    if let Some(t) = a.model.threads {
        v.extend(["--threads".into(), t.to_string()]);
    }
    if let Some(d) = &a.model.data_dir {
        v.extend(["--data-dir".into(), d.display().to_string()]);
    }
    v
}

fn parse_list(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| x.trim().parse::<usize>().with_context(|| format!("\"{x}\" is not a token count")))
        .collect()
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `--json`: the row on stdout; else its fields as `key=value` on stderr (progress and the
/// details the final tables leave out).
fn print_row(a: &Args, row: &serde_json::Value) {
    if a.json {
        println!("{row}");
    } else {
        eprintln!("{}", fields(row));
    }
}

/// A row's fields as `key=value`, two spaces apart.
fn fields(row: &serde_json::Value) -> String {
    let cells: Vec<String> = row.as_object().map_or(Vec::new(), |o| o.iter().map(|(k, v)| format!("{k}={v}")).collect());
    cells.join("  ")
}
