//! `engram bench remote`: a long session continued on a replica that has not seen it — time to
//! first token of the next user turn when its history is restored from the remote tier
//! (Redis), from local disk, or recomputed — with the bytes moved, per KV format; and the
//! remote restore's throughput against `redis-benchmark`'s `GET` throughput for the same value
//! size on the same machine and store.
//!
//! The "other replica" is a second `RemoteTier` (its own connections, nothing cached) in this
//! process: it looks the session's manifest up, fetches its runs with pipelined `MGET`s,
//! checks and decodes them, and prefills only the new turn. The disk row restores the same
//! history from an entry file dropped from the page cache first. Rounds alternate the three
//! ways side by side; times are medians over rounds.
//!
//! Redis: `--redis URL`, else a `redis-server` this command starts on a free loopback port
//! (and stops).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use engram_engine::{LoneSequence, SamplingParams};
use engram_kv::persist::{cache_fingerprint, read_entry, write_entry, EntryKind, EntryMeta};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_remote::{RemoteConfig, RemoteTier};
use serde_json::json;

use crate::common::{data_dir, load_model, ModelArgs};
use crate::shared::evict_from_page_cache;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens of history (the session another replica continues).
    #[arg(long, default_value_t = 4096)]
    history: usize,
    /// Tokens in the new user turn.
    #[arg(long, default_value_t = 64)]
    user_tokens: usize,
    /// KV formats, comma-separated.
    #[arg(long, default_value = "f16,q4")]
    formats: String,
    /// Rounds (medians are reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// A Redis (or Valkey) to use instead of starting one.
    #[arg(long)]
    redis: Option<String>,
    /// Requests per `redis-benchmark` run (large values: keep it small).
    #[arg(long, default_value_t = 40)]
    benchmark_requests: usize,
}

/// A `redis-server` started for the run.
struct OwnRedis(Child);

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> Result<(String, u16, OwnRedis)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--maxmemory", "8gb", "--maxmemory-policy", "allkeys-lru"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server (install it, or pass --redis URL)")?;
    let url = format!("redis://127.0.0.1:{port}/");
    let guard = OwnRedis(child);
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("redis-server did not start on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((url, port, guard))
}

fn tokens(model: &Model, n: usize, salt: u64) -> Vec<u32> {
    let vocab = model.tokenizer.vocab_size().min(model.config.vocab).max(2) as u64;
    (0..n as u64).map(|i| (((i + salt) * 2_654_435_761 + 97 * salt + 12345) % (vocab - 1) + 1) as u32).collect()
}

fn one_token() -> SamplingParams {
    SamplingParams { max_tokens: 1, ignore_eos: true, ..Default::default() }
}

/// The median (the mean of the middle two for an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// `redis-benchmark`'s GET throughput (bytes/s) for `size`-byte values, one client, no
/// pipelining (as one restore's trips are issued), on `host:port`.
fn redis_benchmark(port: u16, size: usize, requests: usize) -> Result<f64> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", "set,get", "-c", "1", "-P", "1", "-q"])
        .args(["-d", &size.to_string(), "-n", &requests.to_string()])
        .output()
        .context("running redis-benchmark")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Lines like "GET: 123.45 requests per second, p50=0.1 msec" (after carriage-returned progress).
    let line = text.split(['\n', '\r']).rfind(|l| l.starts_with("GET:")).with_context(|| format!("no GET line in {text:?}"))?;
    let rps: f64 = line.trim_start_matches("GET:").split_whitespace().next().unwrap_or("").parse().context("GET requests per second")?;
    Ok(rps * size as f64)
}

pub fn run(a: Args) -> Result<()> {
    let model = load_model(&a.model)?;
    let (url, port, _own) = match &a.redis {
        Some(u) => {
            let port = u.rsplit(':').next().and_then(|p| p.trim_end_matches(|c: char| !c.is_ascii_digit()).parse().ok()).unwrap_or(6379);
            (u.clone(), port, None)
        }
        None => {
            let (u, p, g) = start_redis()?;
            (u, p, Some(g))
        }
    };
    let dir = data_dir(&a.model.data_dir).join("bench-remote");
    std::fs::create_dir_all(&dir)?;
    let history = tokens(&model, a.history, 1);
    let user = tokens(&model, a.user_tokens, 2);
    let prompt: Vec<u32> = history.iter().chain(&user).copied().collect();
    let text: String = history.iter().map(|t| format!("t{t} ")).collect();
    let mut ends = Vec::with_capacity(history.len());
    let mut at = 0;
    for t in &history {
        at += format!("t{t} ").len();
        ends.push(at);
    }
    let mut rows = Vec::new();
    for format in a.formats.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        let format: KvFormat = format.parse()?;
        // Room for the history, its fork, one restore of each kind and a cold run at once.
        let per_token = KvPool::new(KvLayout::of(&model.config), format, 0).bytes_per_token();
        let pool = KvPool::try_new(KvLayout::of(&model.config), format, 6 * (a.history + a.user_tokens) * per_token + (64 << 20))?;
        let fp = cache_fingerprint(model.fingerprint, format);
        eprintln!("{format}: prefilling {} tokens of history", a.history);
        let mut gen = LoneSequence::new(&model, &pool);
        gen.prefill(&history)?;
        let (kv, ids) = gen.into_parts();
        let n = kv.len().min(ids.len());

        // Replica A saves it to the tier; the disk entry is written beside it.
        let writer = RemoteTier::new(RemoteConfig::new(url.clone())).map_err(anyhow::Error::msg)?;
        let t = Instant::now();
        writer.for_model(fp.clone()).save_session(Some("bench"), "bench", "s", Some("bench"), &text, &ids[..n], &ends[..n], kv.fork(n));
        writer.flush();
        let write_ms = t.elapsed().as_secs_f64() * 1e3;
        let ws = writer.stats();
        if ws.writes == 0 {
            bail!("the session was not written to {url}: {ws:?}");
        }
        let path = dir.join(format!("history-{format}.safetensors"));
        let meta = EntryMeta {
            fingerprint: fp.clone(),
            kind: EntryKind::Session,
            owner: "bench/s".into(),
            tokens: ids[..n].to_vec(),
            text: String::new(),
            offsets: Vec::new(),
            created_unix: 0,
        };
        let entry_bytes = write_entry(&path, &meta, &kv)?;
        let run_bytes = engram_kv::persist::encoded_len(
            &EntryMeta { tokens: ids[..engram_remote::DEFAULT_RUN_TOKENS.min(n)].to_vec(), ..meta.clone() },
            &kv.fork(engram_remote::DEFAULT_RUN_TOKENS.min(n)),
        )? as usize;
        drop(kv);

        let (mut cold, mut remote, mut disk, mut fetch, mut read_bytes) = (vec![], vec![], vec![], vec![], 0u64);
        for round in 0..a.repeat.max(1) {
            // Recomputed: the whole prompt.
            let t = Instant::now();
            LoneSequence::new(&model, &pool).generate(&prompt, &one_token(), &mut |_| true)?;
            cold.push(t.elapsed().as_secs_f64() * 1e3);
            // Restored from the tier by a replica that never saw it.
            let other = RemoteTier::new(RemoteConfig::new(url.clone())).map_err(anyhow::Error::msg)?.for_model(fp.clone());
            let t = Instant::now();
            let m = other.find_manifest(Some("bench"), "bench", Some("s"), &text).context("the manifest")?;
            let got = other
                .fetch_kv(Some("bench"), m.salt.as_deref(), &m.tokens, m.tokens.len(), &pool, model.config.vocab)
                .context("the runs")?;
            let fetched = t.elapsed().as_secs_f64() * 1e3;
            anyhow::ensure!(got.len() == n, "restored {} of {n} tokens", got.len());
            LoneSequence::from_parts(&model, got, m.tokens.clone()).generate(&prompt, &one_token(), &mut |_| true)?;
            remote.push(t.elapsed().as_secs_f64() * 1e3);
            fetch.push(fetched);
            read_bytes = other.tier().stats().bytes_read;
            // Restored from local disk, the file out of the page cache first.
            let resident = evict_from_page_cache(&path)?;
            let t = Instant::now();
            let (m2, got) = read_entry(&path, &pool, &fp, model.config.vocab)?;
            LoneSequence::from_parts(&model, got, m2.tokens).generate(&prompt, &one_token(), &mut |_| true)?;
            disk.push(t.elapsed().as_secs_f64() * 1e3);
            eprintln!(
                "{format} round {round}: cold {:.0} ms, remote {:.0} ms (fetch {:.0} ms), disk {:.0} ms (page cache {:.0}% resident before)",
                cold[round],
                remote[round],
                fetched,
                disk[round],
                resident * 100.0
            );
        }
        let fetch_ms = median(fetch);
        let restore_gbs = read_bytes as f64 / (fetch_ms / 1e3) / 1e9;
        let bench_gbs = match redis_benchmark(port, run_bytes, a.benchmark_requests) {
            Ok(b) => Some(b / 1e9),
            Err(e) => {
                eprintln!("redis-benchmark: {e}");
                None
            }
        };
        let row = json!({
            "format": format.name(),
            "history": n,
            "user_tokens": a.user_tokens,
            "ttft_cold_ms": median(cold),
            "ttft_remote_ms": median(remote),
            "ttft_disk_ms": median(disk),
            "remote_fetch_ms": fetch_ms,
            "remote_bytes": read_bytes,
            "remote_written_bytes": ws.bytes_written,
            "remote_write_ms": write_ms,
            "disk_bytes": entry_bytes,
            "run_value_bytes": run_bytes,
            "restore_gb_s": restore_gbs,
            "redis_benchmark_get_gb_s": bench_gbs,
            "restore_vs_redis_benchmark": bench_gbs.map(|b| restore_gbs / b),
        });
        eprintln!("{row}");
        rows.push(row);
    }
    println!("| KV | history | TTFT recompute | TTFT remote (fetch) | TTFT local disk | bytes remote / disk | restore GB/s | redis-benchmark GET GB/s (value size) | ratio |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {} | {} | {:.0} ms | {:.0} ms ({:.0} ms) | {:.0} ms | {:.1} / {:.1} MiB | {:.2} | {} ({:.1} MiB) | {} |",
            r["format"].as_str().unwrap_or(""),
            r["history"],
            f("ttft_cold_ms"),
            f("ttft_remote_ms"),
            f("remote_fetch_ms"),
            f("ttft_disk_ms"),
            f("remote_bytes") / 1048576.0,
            f("disk_bytes") / 1048576.0,
            f("restore_gb_s"),
            r["redis_benchmark_get_gb_s"].as_f64().map_or("n/a".into(), |b| format!("{b:.2}")),
            f("run_value_bytes") / 1048576.0,
            r["restore_vs_redis_benchmark"].as_f64().map_or("n/a".into(), |x| format!("{x:.2}")),
        );
    }
    Ok(())
}
