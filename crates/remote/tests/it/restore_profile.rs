//! Where a restore's time goes, 4096 tokens of a 1B-shaped cache in q4 and f16: one raw `MGET`
//! of every run through the client alone, decoding those values (checks and copies into the
//! pool), and the whole `fetch_kv`, three rounds each. A measurement, not a test (ignored):
//! `cargo test --release -p engram-remote --test it restore_profile -- --ignored --nocapture`.
use std::time::Instant;

use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_remote::{RemoteConfig, RemoteTier};

use crate::common::*;

#[test]
#[ignore]
fn restore_profile() {
    let redis = Redis::start(&[]);
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
        for round in 0..3 {
            let t0 = Instant::now();
            let vals: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(&keys).query(&mut c).unwrap();
            let mget = t0.elapsed().as_secs_f64() * 1e3;
            let bytes: usize = vals.iter().flatten().map(|v| v.len()).sum();
            let t1 = Instant::now();
            let mut parts = Vec::new();
            for v in vals.iter().flatten() {
                parts.push(engram_kv::persist::decode_entry("k", v, &p, &fp, VOCAB).unwrap().1);
            }
            let decode = t1.elapsed().as_secs_f64() * 1e3;
            drop(parts);
            let t2 = Instant::now();
            let got = r.fetch_kv(Some("t"), Some("t"), &tokens, n, &p, VOCAB).unwrap();
            let fetch = t2.elapsed().as_secs_f64() * 1e3;
            assert_eq!(got.len(), n);
            drop(got);
            eprintln!("{format} round {round}: {} MiB: raw MGET {mget:.1} ms, decode {decode:.1} ms, fetch_kv {fetch:.1} ms", bytes >> 20);
        }
    }
}
