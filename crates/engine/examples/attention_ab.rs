//! Hot-turn time to first token with exact vs bf16 attention at several history lengths, all
//! alternated in one process: `cargo run --release -p engram-engine --example attention_ab --
//! MODEL.gguf [HISTORIES] [REPEATS] [KV_FORMAT]` (defaults `1024,16384`, 7, f16). Each history is
//! prefilled once
//! (the slow part); every repeat then runs the 64-token turn on a fork of each history with each
//! precision, so all columns share the machine's drift. Prints each repeat, the medians, and each
//! history's median over the first history's (the target: 16K within 1.5x of 1K).
//! `ATTENTION=exact|bf16` runs one precision only (to profile one path).

use std::time::Instant;

use engram_engine::{LoneSequence, SamplingParams};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::{AttentionPrecision, Model};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().expect("usage: attention_ab MODEL [HISTORIES] [REPEATS] [KV_FORMAT]");
    let histories: Vec<usize> =
        args.get(1).map_or("1024,16384", |s| s.as_str()).split(',').map(|h| h.trim().parse().expect("history length")).collect();
    let repeats: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(7).max(1);
    let format: KvFormat = args.get(3).map_or(Ok(KvFormat::F16), |a| a.parse()).expect("KV format");
    let mut model = Model::load(std::path::Path::new(path)).expect("model");
    let pool = KvPool::new(KvLayout::of(&model.config), format, 16 << 30);
    let vocab = model.config.vocab.min(model.tokenizer.vocab_size()) as u64;
    let ids = |n: usize, salt: u64| -> Vec<u32> { (0..n as u64).map(|i| ((i * 2_654_435_761 + salt) % (vocab - 1) + 1) as u32).collect() };
    // `ATTENTION=exact|bf16` runs one precision only (for profiling one path).
    let precisions: Vec<AttentionPrecision> = match std::env::var("ATTENTION") {
        Ok(p) => vec![p.parse().expect("ATTENTION: exact or bf16")],
        Err(_) => vec![AttentionPrecision::Exact, AttentionPrecision::Bf16],
    };
    let mut cases = Vec::new();
    for &h in &histories {
        eprintln!("prefilling {h} tokens...");
        let hist = ids(h, 1);
        let mut prompt = hist.clone();
        prompt.extend(ids(64, 7));
        let mut g = LoneSequence::new(&model, &pool);
        g.prefill(&hist).expect("prefill");
        let (kv, toks) = g.into_parts();
        cases.push((h, prompt, kv, toks));
    }
    let one = SamplingParams { max_tokens: 1, ignore_eos: true, ..Default::default() };
    // times[history][precision]
    let mut times = vec![vec![Vec::new(); precisions.len()]; histories.len()];
    for rep in 0..repeats {
        let mut line = format!("repeat {rep}:");
        for (hi, (h, prompt, kv, toks)) in cases.iter().enumerate() {
            for (pi, &p) in precisions.iter().enumerate() {
                model.set_attention(p);
                let mut hot = LoneSequence::from_parts(&model, kv.fork(kv.len()), toks.clone());
                let t = Instant::now();
                hot.generate(prompt, &one, &mut |_| true).expect("turn");
                let ms = t.elapsed().as_secs_f64() * 1e3;
                times[hi][pi].push(ms);
                line += &format!("  {h} {} {ms:.1} ms", p.name());
            }
        }
        println!("{line}");
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("{format} KV");
    let mut head = format!("{:>8}", "history");
    for p in &precisions {
        head += &format!(" {:>10} {:>12}", format!("{} ms", p.name()), format!("{} / 1st", p.name()));
    }
    println!("{head}");
    for (hi, &h) in histories.iter().enumerate() {
        let mut line = format!("{h:>8}");
        for pi in 0..precisions.len() {
            let (t, t0) = (median(&times[hi][pi]), median(&times[0][pi]));
            line += &format!(" {t:>10.1} {:>11.2}x", t / t0);
        }
        println!("{line}");
    }
}
