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

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use engram_context::PrefixIndex;
use engram_engine::{Generator, SamplingParams};
use engram_kv::persist::{cache_fingerprint, open_entry, read_entry, write_entry, EntryKind, EntryMeta};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::{Fingerprint, Model};
use serde_json::json;

use crate::common::{data_dir, kv_pool, load_model, ModelArgs};

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
    /// Hot and warm measurements are repeated this many times and the median reported
    /// (timings on shared 2-core machines swing by tens of percent).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Skip the cold (no cache) history measurements, which dominate the run time
    /// (`ttft_cold_ms` is then null): for iterating on hot and warm.
    #[arg(long)]
    skip_cold: bool,
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

fn ttft(gen: &mut Generator<'_>, prompt: &[u32]) -> Result<f64> {
    let t = Instant::now();
    gen.generate(prompt, &one_token(), &mut |_| true)?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
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
    let histories: Vec<usize> = parse_list(&a.history)?;
    let mut rows = Vec::new();
    for &h in &histories {
        eprintln!("history {h}: prefill of {} tokens (the slow part)...", h + a.user_tokens);
        let history = tokens(&model, h, 1);
        let mut prompt = history.clone();
        prompt.extend(tokens(&model, a.user_tokens, 7));
        let cold = if a.skip_cold { None } else { Some(ttft(&mut Generator::new(&model, &pool), &prompt)?) };

        // The history is prefilled once; the hot turn runs on a fork of it and
        // the persisted entry is written from it.
        let mut hist_gen = Generator::new(&model, &pool);
        hist_gen.feed(&history, false)?;
        let (kv, toks) = hist_gen.into_parts();
        let mut hots = Vec::new();
        let mut hot_gen = Generator::from_parts(&model, kv.fork(kv.len()), toks.clone());
        for rep in 0..a.repeat.max(1) {
            if rep > 0 {
                hot_gen = Generator::from_parts(&model, kv.fork(kv.len()), toks.clone());
            }
            hots.push(ttft(&mut hot_gen, &prompt)?);
        }
        let hot = median(hots);
        // Decode speed at this depth, continuing the hot sequence.
        let t = Instant::now();
        let g = hot_gen.generate(
            &prompt,
            &SamplingParams { max_tokens: a.decode_tokens + 1, ignore_eos: true, ..Default::default() },
            &mut |_| true,
        )?;
        let decode_tok_s = (g.tokens.len().saturating_sub(1)) as f64 / (t.elapsed().as_secs_f64() - g.timings.ttft_ms / 1e3).max(1e-9);
        drop(hot_gen);

        // Persist the history, then restore it in a fresh process.
        let path = dir.join(format!("history-{h}-{format}.safetensors"));
        let meta = EntryMeta {
            fingerprint: fp.clone(),
            kind: EntryKind::Session,
            owner: "bench".into(),
            tokens: toks,
            text: String::new(),
            offsets: Vec::new(),
            created_unix: 0,
        };
        let t = Instant::now();
        let bytes = write_entry(&path, &meta, &kv)?;
        let write_ms = t.elapsed().as_secs_f64() * 1e3;
        drop(kv);
        let disk = median_run(&a, &path, h, true)?;
        let warm = median_run(&a, &path, h, false)?;
        let _ = std::fs::remove_file(&path);
        rows.push(json!({
            "history_tokens": h,
            "kv_format": format.name(),
            "attention": model.attention().name(),
            "user_tokens": a.user_tokens,
            "ttft_cold_ms": cold.map(round),
            "ttft_hot_ms": round(hot),
            "ttft_warm_ms": warm["ttft_warm_ms"],
            "restore_ms": warm["restore_ms"],
            "restore_gb_s": warm["restore_gb_s"],
            "ttft_warm_disk_ms": disk["ttft_warm_ms"],
            "resident_before_disk_run": disk["resident_fraction"],
            "restore_disk_ms": disk["restore_ms"],
            "restore_disk_gb_s": disk["restore_gb_s"],
            "open_ms": warm["open_ms"],
            "open_disk_ms": disk["open_ms"],
            "checksum_wait_ms": warm["checksum_wait_ms"],
            "checksum_wait_disk_ms": disk["checksum_wait_ms"],
            "persist_write_ms": round(write_ms),
            "entry_bytes": bytes,
            "bytes_per_token": pool.bytes_per_token(),
            "decode_tok_s_at_depth": round(decode_tok_s),
            "threads": engram_kernels::num_threads(),
            "repeats": a.repeat.max(1),
        }));
        print_row(&a, rows.last().unwrap());
    }
    for &s in &parse_list(&a.system)? {
        let system = tokens(&model, s, 3);
        let mut prompt = system.clone();
        prompt.extend(tokens(&model, a.user_tokens, 11));
        let cold = ttft(&mut Generator::new(&model, &pool), &prompt)?;
        let mut index = PrefixIndex::new(Fingerprint(model.fingerprint.0 ^ 1));
        let mut g = Generator::new(&model, &pool);
        g.feed(&system, false)?;
        let (kv, toks) = g.into_parts();
        index.insert(&toks, &kv);
        drop(kv);
        let t = Instant::now();
        let shared = index.lookup(&pool, &prompt);
        let reused = shared.len();
        let mut gen = Generator::from_parts(&model, shared, prompt[..reused].to_vec());
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
    Ok(())
}

/// Logit error and top-1 agreement of `format` KV against f32 KV over 512 tokens of real text
/// (prefilled; `engram bench kv-quality` scores token by token and compares more schemes).
fn quality(model: &Model, format: KvFormat) -> Result<serde_json::Value> {
    let text = engram_tokenizer::FIXTURE_CORPUS.chars().take(4000).collect::<String>();
    let mut ids = model.tokenizer.encode(&text, true)?.ids;
    ids.truncate(512);
    let layout = KvLayout::of(&model.config);
    let exact = Generator::new(model, &KvPool::new(layout, KvFormat::F32, 1 << 34)).feed(&ids, true)?;
    let pool = KvPool::new(layout, format, 1 << 34);
    let approx = Generator::new(model, &pool).feed(&ids, true)?;
    let bytes_vs_f16 = pool.bytes_per_token() as f64 / KvPool::new(layout, KvFormat::F16, 1).bytes_per_token() as f64;
    let mut row = crate::bench_kv_quality::compare(format.name(), &exact, &approx, model.config.vocab, bytes_vs_f16);
    let obj = row.as_object_mut().expect("compare returns an object");
    let name = obj.remove("scheme").expect("compare names the scheme");
    obj.insert("quality_vs_f32".into(), name);
    Ok(row)
}

/// The middle of `xs` (the upper middle for an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// [`warm_run`] `--repeat` times; the run with the median TTFT.
fn median_run(a: &Args, path: &std::path::Path, h: usize, evict: bool) -> Result<serde_json::Value> {
    let mut runs = (0..a.repeat.max(1)).map(|_| warm_run(a, path, h, evict)).collect::<Result<Vec<_>>>()?;
    runs.sort_by(|x, y| x["ttft_warm_ms"].as_f64().unwrap_or(0.0).total_cmp(&y["ttft_warm_ms"].as_f64().unwrap_or(0.0)));
    Ok(runs.swap_remove(runs.len() / 2))
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

/// Asks the kernel to drop `path` from the page cache (clean pages only: entries are fsynced
/// when written) and returns the fraction of its pages still resident afterwards.
#[cfg(unix)]
fn evict_from_page_cache(path: &std::path::Path) -> Result<f64> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    // SAFETY: a valid open descriptor; the advice only affects caching.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    anyhow::ensure!(rc == 0, "posix_fadvise failed: {rc}");
    resident_fraction(&file)
}

#[cfg(unix)]
fn resident_fraction(file: &std::fs::File) -> Result<f64> {
    // SAFETY: read-only mapping of a file this process does not modify; only inspected by mincore.
    let map = unsafe { memmap2::Mmap::map(file)? };
    let page = 4096;
    let pages = map.len().div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `map.len()` bytes and `vec` has one byte per page.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), vec.as_mut_ptr()) };
    anyhow::ensure!(rc == 0, "mincore failed");
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages.max(1) as f64)
}

#[cfg(not(unix))]
fn evict_from_page_cache(_path: &std::path::Path) -> Result<f64> {
    Ok(1.0)
}

fn warm_child(a: &Args, model: &Model, pool: &KvPool, fp: &str) -> Result<()> {
    let path = a.entry.as_ref().context("--entry is required with --warm-child")?;
    let h = parse_list(&a.history)?[0];
    let mut prompt = tokens(model, h, 1);
    prompt.extend(tokens(model, a.user_tokens, 7));
    // A started server has run steps already: page the weights in and start
    // the thread pool before timing, as `bench speed` does.
    Generator::new(model, pool).feed(&prompt[..4.min(prompt.len())], false)?;
    let resident = if a.evict { evict_from_page_cache(path)? } else { 1.0 };
    // As the server restores: the checksum runs beside the prefill, and the
    // first token counts only once the checksum has passed.
    let t = Instant::now();
    let (meta, kv, check) = open_entry(path, pool, fp, model.config.vocab)?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut gen = Generator::from_parts(model, kv, meta.tokens);
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

fn print_row(a: &Args, row: &serde_json::Value) {
    if a.json {
        println!("{row}");
    } else {
        let cells: Vec<String> = row.as_object().unwrap().iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("{}", cells.join("  "));
    }
}
