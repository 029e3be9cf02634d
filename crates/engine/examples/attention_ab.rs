//! Hot-turn time to first token with exact vs bf16 attention, side by side in one process:
//! `cargo run --release -p engram-engine --example attention_ab -- MODEL.gguf [HISTORY] [REPEATS]`
//! (defaults 16384, 5). The history is prefilled once (the slow part); each repeat then runs
//! the 64-token turn on a fork of it with each precision in turn, so the two columns share the
//! machine's drift. Prints one line per repeat and the medians.

use std::time::Instant;

use engram_engine::{Generator, SamplingParams};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::{AttentionPrecision, Model};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().expect("usage: attention_ab MODEL [HISTORY] [REPEATS]");
    let history: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(16384);
    let repeats: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let mut model = Model::load(std::path::Path::new(path)).expect("model");
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 8 << 30);
    let vocab = model.config.vocab.min(model.tokenizer.vocab_size()) as u64;
    let ids = |n: usize, salt: u64| -> Vec<u32> { (0..n as u64).map(|i| ((i * 2_654_435_761 + salt) % (vocab - 1) + 1) as u32).collect() };
    let hist = ids(history, 1);
    let mut prompt = hist.clone();
    prompt.extend(ids(64, 7));
    eprintln!("prefilling {history} tokens...");
    let mut g = Generator::new(&model, &pool);
    g.feed(&hist, false).expect("prefill");
    let (kv, toks) = g.into_parts();
    let one = SamplingParams { max_tokens: 1, ignore_eos: true, ..Default::default() };
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for rep in 0..repeats {
        for (i, p) in [AttentionPrecision::Exact, AttentionPrecision::Bf16].into_iter().enumerate() {
            model.set_attention(p);
            let mut hot = Generator::from_parts(&model, kv.fork(kv.len()), toks.clone());
            let t = Instant::now();
            hot.generate(&prompt, &one, &mut |_| true).expect("turn");
            times[i].push(t.elapsed().as_secs_f64() * 1e3);
        }
        println!("repeat {rep}: exact {:.1} ms, bf16 {:.1} ms", times[0][rep], times[1][rep]);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (e, b) = (median(&mut times[0]), median(&mut times[1]));
    println!("history {history}: median exact {e:.1} ms, bf16 {b:.1} ms ({:.2}x)", e / b);
}
