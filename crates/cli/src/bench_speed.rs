//! `engram bench speed`: prefill tokens/s over a 512-token prompt and decode
//! tokens/s over 128 tokens, as llama-bench measures them (pp512 / tg128).
//! The weights are paged in and one warm-up step runs before timing.

use std::time::Instant;

use anyhow::Result;
use engram_engine::Generator;
use engram_kv::KvPool;
use engram_model::Model;

use crate::common::{kv_pool, load_model, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Timed repetitions; the best is reported.
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let model = load_model(&a.model)?;
    let pool = kv_pool(&model, &a.model)?;
    // Deterministic pseudo-random prompt over the tokenizer's real tokens.
    let vocab = model.tokenizer.vocab_size().min(model.config.vocab).max(1) as u64;
    let prompt: Vec<u32> = (0..a.prompt_tokens as u64).map(|i| ((i * 2_654_435_761 + 12345) % vocab) as u32).collect();
    warm_up(&model, &pool)?;
    let (mut best_pp, mut best_tg) = (0.0f64, 0.0f64);
    for _ in 0..a.reps.max(1) {
        let mut gen = Generator::new(&model, &pool).with_prefill_chunk(a.prompt_tokens.max(1));
        let t = Instant::now();
        let mut logits = gen.feed(&prompt, false)?;
        best_pp = best_pp.max(a.prompt_tokens as f64 / t.elapsed().as_secs_f64());
        // Decode continues from a fresh short context, like llama-bench's tg128.
        let mut gen = Generator::new(&model, &pool);
        logits = gen.feed(&prompt[..1], false).unwrap_or(logits);
        let t = Instant::now();
        for _ in 0..a.decode_tokens {
            let next = engram_engine::argmax(&logits);
            logits = gen.feed(&[next], false)?;
        }
        best_tg = best_tg.max(a.decode_tokens as f64 / t.elapsed().as_secs_f64());
    }
    let threads = engram_kernels::num_threads();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": model.source,
                "weights": model.weights.main_dtype().name(),
                "threads": threads,
                "prompt_tokens": a.prompt_tokens,
                "decode_tokens": a.decode_tokens,
                "prefill_tok_s": (best_pp * 100.0).round() / 100.0,
                "decode_tok_s": (best_tg * 100.0).round() / 100.0,
            })
        );
    } else {
        println!("| model | weights | threads | prefill {} (tok/s) | decode {} (tok/s) |", a.prompt_tokens, a.decode_tokens);
        println!("|---|---|---|---|---|");
        println!("| {} | {} | {threads} | {best_pp:.1} | {best_tg:.1} |", model.source, model.weights.main_dtype().name());
    }
    Ok(())
}

/// Touches every weight page and runs a short step so timing excludes page faults and first-use costs.
fn warm_up(model: &Model, pool: &KvPool) -> Result<()> {
    let mut gen = Generator::new(model, pool);
    gen.feed(&[1, 2, 3, 4], false)?;
    Ok(())
}
