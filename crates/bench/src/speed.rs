//! `engram bench speed`: prefill tokens/s over a 512-token prompt and decode
//! tokens/s over 128 tokens, as llama-bench measures them (pp512 / tg128), each through the
//! engine's own step (one [`LoneSequence`]: the prompt in one step; then greedy decoding
//! from a one-token context, one token a step). The weights are paged in and one warm-up
//! step runs before timing.
//!
//! Beside them, in the same run, the decode *limit*: the memory read bandwidth measured with
//! the same threads ([`crate::shared::read_gb_s`]) right after each repetition's decode, the
//! best of them (as the decode figure is the best repetition: on a shared host the bandwidth
//! moves by tens of percent from second to second, and one probe at the end made shares above
//! 100% possible) ÷ the bytes one decode token reads (every weight matrix once, the output
//! matrix included, plus the KV cache at the mean decode context); `of_limit` = decode ÷ limit.

use std::time::Instant;

use anyhow::Result;
use engram_engine::{LoneSequence, SamplingParams};
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
    /// Size of the bandwidth probe buffer (MiB) for the decode limit; well above the
    /// last-level cache, the host's included (a VM may report less cache than its host has).
    #[arg(long, default_value_t = 512)]
    membw_mib: usize,
}

pub fn run(a: Args) -> Result<()> {
    let t_load = Instant::now();
    let model = load_model(&a.model)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let pool = kv_pool(&model, &a.model)?;
    // Deterministic pseudo-random prompt over the tokenizer's real tokens.
    let vocab = model.tokenizer.vocab_size().min(model.config.vocab).max(1) as u64;
    let prompt: Vec<u32> = (0..a.prompt_tokens as u64).map(|i| ((i * 2_654_435_761 + 12345) % vocab) as u32).collect();
    warm_up(&model, &pool)?;
    let (mut best_pp, mut best_tg, mut bw_gb_s) = (0.0f64, 0.0f64, 0.0f64);
    let probe = crate::shared::random_bytes(a.membw_mib.max(16) << 20);
    // Greedy, never stopped early: every run computes exactly the tokens it is asked for.
    let greedy = |n: usize| SamplingParams { max_tokens: n, ignore_eos: true, ..SamplingParams::default() };
    for _ in 0..a.reps.max(1) {
        // The whole prompt in one engine step (its last token's logits, one token sampled).
        let g = LoneSequence::new(&model, &pool).with_prefill_chunk(a.prompt_tokens.max(1)).generate(&prompt, &greedy(1), &mut |_| true)?;
        best_pp = best_pp.max(a.prompt_tokens as f64 / (g.timings.ttft_ms / 1e3));
        // Decode continues from a fresh short context, like llama-bench's tg128: the first
        // token is sampled after one prompt token, then `decode_tokens` steps feed one each.
        let g = LoneSequence::new(&model, &pool).generate(&prompt[..1], &greedy(a.decode_tokens + 1), &mut |_| true)?;
        anyhow::ensure!(g.tokens.len() == a.decode_tokens + 1, "decode ended after {} of {} tokens", g.tokens.len(), a.decode_tokens + 1);
        best_tg = best_tg.max(g.timings.decode_tok_s());
        // The limit's bandwidth, probed with the same pool right after this decode.
        bw_gb_s = bw_gb_s.max(crate::shared::read_gb_s(&probe, 3));
    }
    let threads = engram_kernels::num_threads();
    let lim = DecodeLimit::new(&model, &pool, a.decode_tokens, bw_gb_s);
    let kernels = engram_kernels::internal::Isa::detect().name();
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
                "kernels": kernels,
                "read_gb_s": (bw_gb_s * 100.0).round() / 100.0,
                "weight_bytes_per_token": lim.weight_bytes,
                "kv_bytes_per_token": lim.kv_bytes,
                "limit_tok_s": (lim.tok_s * 100.0).round() / 100.0,
                "of_limit": (best_tg / lim.tok_s * 1000.0).round() / 1000.0,
                // Weights repacked at load for the AVX2 GEMV (ENGRAM_REPACK=off: 0), and the
                // load time that includes the repacking.
                "repacked_bytes": model.weights.packed_bytes(),
                // Weights copied verbatim into huge pages (unpacked formats; ENGRAM_HUGE_PAGES=off: 0).
                "resident_bytes": model.weights.resident_bytes(),
                "load_s": (load_s * 1000.0).round() / 1000.0,
            })
        );
    } else {
        println!(
            "| model | weights | kernels | threads | prefill {} (tok/s) | decode {} (tok/s) | limit (tok/s) | of limit | read (GB/s) |",
            a.prompt_tokens, a.decode_tokens
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        println!(
            "| {} | {} | {kernels} | {threads} | {best_pp:.1} | {best_tg:.1} | {:.1} | {:.0}% | {bw_gb_s:.1} |",
            model.source,
            model.weights.main_dtype().name(),
            lim.tok_s,
            100.0 * best_tg / lim.tok_s
        );
    }
    Ok(())
}

/// Touches every weight page and runs a short step so timing excludes page faults and first-use costs.
fn warm_up(model: &Model, pool: &KvPool) -> Result<()> {
    LoneSequence::new(model, pool).prefill(&[1, 2, 3, 4])?;
    Ok(())
}

/// The bandwidth bound on decode: `tok_s = bandwidth ÷ (weight_bytes + kv_bytes)`.
struct DecodeLimit {
    /// Weight bytes one decode token reads: every layer matrix and the output matrix (the
    /// embedding contributes one row, neglected; norms are tiny).
    weight_bytes: usize,
    /// KV bytes one decode token reads at the mean context of the timed decode.
    kv_bytes: usize,
    /// The limit in tokens per second.
    tok_s: f64,
}

impl DecodeLimit {
    fn new(model: &Model, pool: &KvPool, decode_tokens: usize, bw_gb_s: f64) -> DecodeLimit {
        let weight_bytes = model.weights.bytes_read_per_token(model.config.moe.map_or(0, |m| m.top_k));
        // Decode runs from context 1 to 1 + decode_tokens; the mean context is about half.
        let kv_bytes = pool.bytes_per_token() * (1 + decode_tokens / 2);
        let tok_s = bw_gb_s * 1e9 / (weight_bytes + kv_bytes).max(1) as f64;
        DecodeLimit { weight_bytes, kv_bytes, tok_s }
    }
}
