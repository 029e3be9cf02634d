//! Where a restore's time goes, 4096 tokens of a 1B-shaped cache (16 layers, 8 KV heads, head
//! size 64: the yardstick's Llama-3.2-1B) in q4 and f16, and how it compares with
//! `redis-benchmark`: per round, alternating, the way restores read runs before the lean reader
//! (the `redis` crate's `MGET`, each trip's values then decoded) and `fetch_kv` now (the lean
//! reader, each value decoded as it arrives), then `redis-benchmark`'s `GET` of a run's size
//! (one client, no pipelining, as `engram bench remote` runs it). A measurement, not a test
//! (ignored):
//! `cargo test --release -p engram-remote --test it restore_profile -- --ignored --nocapture`.
use std::time::Instant;

use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_remote::{RemoteConfig, RemoteTier};

use crate::common::*;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// `redis-benchmark`'s GET throughput (bytes/s) for `size`-byte values, one client.
fn redis_benchmark(port: u16, size: usize) -> f64 {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", "set,get", "-c", "1", "-P", "1", "-q"])
        .args(["-d", &size.to_string(), "-n", "200"])
        .output()
        .expect("redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.split(['\n', '\r']).rfind(|l| l.starts_with("GET:")).expect("a GET line");
    let rps: f64 = line.trim_start_matches("GET:").split_whitespace().next().unwrap().parse().unwrap();
    rps * size as f64
}

#[test]
#[ignore]
fn restore_profile() {
    let redis = Redis::start(&[]);
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    for format in [KvFormat::Q4, KvFormat::F16] {
        redis.cmd::<()>(&["FLUSHALL"]).unwrap();
        let layout = KvLayout { num_layers: 16, num_kv_heads: 8, head_dim: 64 };
        let p = KvPool::new(layout, format, 4 << 30);
        let n = 4096;
        let mut kv = engram_kv::SeqKv::new(&p);
        kv.reserve(n).unwrap();
        let w = 8 * 64;
        for l in 0..16 {
            let k: Vec<f32> = (0..n * w).map(|i| ((i * 7919 + l) % 1000) as f32 / 500.0 - 1.0).collect();
            use engram_model::KvCache;
            kv.write(l, 0, &k, &k, n);
        }
        let (tokens, text, ends) = conversation(n, 1);
        let t = RemoteTier::new(RemoteConfig::new(redis.url())).unwrap();
        let fp = format!("0123456789abcdef-{format}");
        let r = t.for_model(fp.clone());
        r.save_session(Some("t"), "t", "s", Some("t"), &text, &tokens, &ends, kv.fork(n));
        t.flush();
        let keys: Vec<String> = redis.keys().into_iter().filter(|k| k.contains(":run:")).collect();
        let mut c = redis.client().get_connection().unwrap();
        let run_bytes = p.bytes_for(engram_remote::DEFAULT_RUN_TOKENS);
        let per_trip = ((16 << 20) / run_bytes).max(1);
        let (mut old, mut new, mut mget, mut bytes) = (Vec::new(), Vec::new(), Vec::new(), 0);
        for round in 0..rounds {
            // Before: each trip's values through the crate, then decoded.
            let t0 = Instant::now();
            let mut parts = Vec::new();
            let mut raw = 0.0;
            bytes = 0;
            for batch in keys.chunks(per_trip) {
                let t = Instant::now();
                let vals: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(batch).query(&mut c).unwrap();
                raw += t.elapsed().as_secs_f64() * 1e3;
                for v in vals.iter().flatten() {
                    bytes += v.len();
                    parts.push(engram_kv::persist::decode_entry("k", v, &p, &fp, VOCAB).unwrap().1);
                }
            }
            let before = t0.elapsed().as_secs_f64() * 1e3;
            drop(parts);
            // Now: `fetch_kv` (a fresh replica's tier: connecting included, as in the bench).
            let fresh = RemoteTier::new(RemoteConfig::new(redis.url())).unwrap().for_model(fp.clone());
            let t2 = Instant::now();
            let got = fresh.fetch_kv(Some("t"), Some("t"), &tokens, n, &p, VOCAB).unwrap();
            let now = t2.elapsed().as_secs_f64() * 1e3;
            assert_eq!(got.len(), n);
            drop(got);
            eprintln!(
                "{format} round {round}: {} MiB: before (crate MGET {raw:.1} ms + decode) {before:.1} ms, fetch_kv now {now:.1} ms",
                bytes >> 20
            );
            old.push(before);
            new.push(now);
            mget.push(raw);
        }
        let bench = redis_benchmark(redis.port, run_bytes);
        let (old, new) = (median(old), median(new));
        let gbs = |ms: f64| bytes as f64 / (ms / 1e3) / 1e9;
        eprintln!(
            "{format}: medians of {rounds}: before {old:.1} ms ({:.2} GB/s, ratio {:.2}), now {new:.1} ms ({:.2} GB/s, ratio {:.2}); \
             crate MGET alone {:.1} ms; redis-benchmark GET {:.2} GB/s ({:.1} MiB values)",
            gbs(old),
            gbs(old) / (bench / 1e9),
            gbs(new),
            gbs(new) / (bench / 1e9),
            median(mget),
            bench / 1e9,
            run_bytes as f64 / (1 << 20) as f64
        );
    }
}
