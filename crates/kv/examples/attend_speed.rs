//! Attention over a cached sequence, all in: `cargo run --release -p engram-kv --example
//! attend_speed [HISTORY] [QUERIES] [FORMAT] [REPEATS] [PRECISION]` (defaults 16384, 64, f16, 3,
//! exact). One layer of llama-1b's
//! shape (8 KV heads of 64, 4 query heads each), the cache filled with random rows, attention run
//! for every KV head on one thread, as one hot turn's layer does. Prints ms and ns per
//! (16-row block × 32-key chunk), to compare with the exact kernel alone, operands in L1 (~410 ns
//! per block-chunk, `docs/benchmarks.md#kv-cache-cold-hot-warm`): the difference is reading,
//! decoding and packing the chunks.

use std::time::Instant;

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::attention::{attend, AttnTask};
use engram_model::KvCache;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let history: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(16384);
    let queries: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let format: KvFormat = args.get(2).map_or(Ok(KvFormat::F16), |a| a.parse()).expect("format");
    let repeats: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(3);
    let precision: engram_model::AttentionPrecision = args.get(4).map_or(Ok(Default::default()), |a| a.parse()).expect("precision");
    let (kv_heads, group, hd) = (8, 4, 64);
    let layout = KvLayout { num_layers: 1, num_kv_heads: kv_heads, head_dim: hd };
    let pool = KvPool::new(layout, format, 8 << 30);
    let mut kv = SeqKv::new(&pool);
    let total = history + queries;
    kv.reserve(total).expect("budget");
    let w = kv_heads * hd;
    let rnd = |i: usize| ((i.wrapping_mul(2654435761) >> 7) % 2000) as f32 / 1000.0 - 1.0;
    let step = 1024;
    for first in (0..total).step_by(step) {
        let n = step.min(total - first);
        let k: Vec<f32> = (0..n * w).map(|i| rnd(first * w + i)).collect();
        let v: Vec<f32> = (0..n * w).map(|i| rnd(first * w + i + 99)).collect();
        kv.write(0, first, &k, &v, n);
    }
    let q: Vec<f32> = (0..queries * kv_heads * group * hd).map(|i| rnd(i + 5) * 3.0).collect();
    let positions: Vec<u32> = (history..history + queries).map(|p| p as u32).collect();
    let block_chunks = (queries * group).div_ceil(16) * total.div_ceil(32) * kv_heads;
    for _ in 0..repeats {
        let t = Instant::now();
        let mut check = 0.0;
        for kv_head in 0..kv_heads {
            let task = AttnTask {
                kv: &kv,
                layer: 0,
                q: &q,
                num_queries: queries,
                positions: &positions,
                key_mask: None,
                kv_head,
                group,
                head_dim: hd,
                num_heads: kv_heads * group,
                precision,
            };
            check += attend(&task)[0];
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "{format} {} history {history} queries {queries}: {:.2} ms per layer, {:.0} ns per block-chunk (check {check:.4})",
            precision.name(),
            s * 1e3,
            s * 1e9 / block_chunks as f64
        );
    }
}
