//! `engram generate --sparse METHOD`: the opt-in sparse path (DynaKV and baselines, `engram-sparse`). The
//! prompt is prefilled with exact attention into a [`SparseKv`], the index is built over it,
//! and every decoded token attends only the keys the method retrieves (sinks, a recent
//! window, `--sparse-budget` retrieved tokens per layer and KV head). Sampling, stop tokens
//! and strings go through the engine's [`Decoding`], as the exact path's do. With
//! `--sparse-offload`, the prefill is bounded: the prompt's KV past `--sparse-ram-mib` goes to
//! the file chunk by chunk as it is written, its index built segment by segment
//! ([`SparseKv::offload_streaming`]), so the KV in RAM never holds the whole prompt.
//!
//! Invariant: a configuration that cannot be sparse is refused or falls back to exact with a
//! warning, never run half-way: an unknown method or a zero budget is an error; a budget that
//! covers the whole prompt (nothing to leave out) runs exact and says so.

use std::time::Instant;

use anyhow::{Context, Result};
use engram_engine::{Decoding, FinishReason};
use engram_model::{Logits, Model, SeqStep};
use engram_sparse::{Method, SparseConfig, SparseKv};

use crate::common::stdout_sink;

/// The sparse configuration the flags ask for, checked against the prompt: `Ok(None)` where it
/// falls back to exact (with a warning on stderr).
pub fn config(method: &str, budget: usize, prompt_tokens: usize) -> Result<Option<SparseConfig>> {
    let method = Method::parse(method).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(budget > 0, "--sparse-budget must be at least 1 token");
    let cfg = SparseConfig { budget, ..SparseConfig::new(method) };
    if budget + cfg.sinks + cfg.recent >= prompt_tokens {
        eprintln!(
            "warning: --sparse-budget {budget} (+ {} sinks + {} recent) covers the whole prompt of {prompt_tokens} tokens: nothing to leave out; running exact attention",
            cfg.sinks, cfg.recent
        );
        return Ok(None);
    }
    Ok(Some(cfg))
}

/// Generates after `prompt` with `cfg` (`None`: exact over the same cache), streaming to stdout;
/// with `off`, the KV past its RAM budget goes to the file during the prefill (lossless: the
/// same tokens as in RAM).
pub fn generate(
    model: &Model,
    prompt: &[u32],
    params: &engram_engine::SamplingParams,
    cfg: Option<SparseConfig>,
    off: Option<engram_sparse::OffloadConfig>,
) -> Result<()> {
    params.validate()?;
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty");
    let ctx = model.config.max_positions;
    anyhow::ensure!(prompt.len() < ctx, "the prompt of {} tokens does not fit the model's context of {ctx}", prompt.len());
    let start = Instant::now();
    let mut kv = SparseKv::new(&model.config, cfg);
    let streamed = match (off, cfg) {
        (Some(off), Some(_)) => {
            let dir = off.dir.clone();
            kv.offload_streaming(off).with_context(|| format!("--sparse-offload {}", dir.display()))?;
            true
        }
        _ => false,
    };
    let mut logits = Vec::new();
    for part in prompt.chunks(engram_engine::DEFAULT_PREFILL_CHUNK) {
        kv.reserve(part.len());
        let slot = kv.len();
        logits = model.forward(&mut [SeqStep::new(part, slot, &mut kv, Logits::Last)])?.remove(0);
    }
    let prefill_ms = start.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    kv.build_index();
    let index_ms = t.elapsed().as_secs_f64() * 1e3;
    let prefill_peak = kv.peak_ram_kv_bytes();
    if let Some(e) = kv.offload_failure() {
        anyhow::bail!("prefilling the prompt: {e}");
    }
    if streamed && !kv.is_offloaded() {
        eprintln!("note: the prompt's KV fits --sparse-ram-mib: kept in RAM, nothing offloaded");
    }
    let mut out = Decoding::new(&model.tokenizer, prompt, params, 0);
    let decode_start = Instant::now();
    let finish = loop {
        if params.max_tokens == 0 {
            break FinishReason::Length;
        }
        let tok = out.sample(&mut logits);
        let step = out.accept(tok, kv.len() + 1 < ctx)?;
        if !step.release.is_empty() && !stdout_sink(&step.release) {
            break FinishReason::Cancelled;
        }
        if let Some(f) = step.done {
            break f;
        }
        kv.reserve(1);
        let slot = kv.len();
        // A failed read of the offloaded KV (file truncated, removed, EIO) ends the sequence
        // with the reason; the tokens streamed so far stand.
        logits = model
            .forward(&mut [SeqStep::new(&[tok], slot, &mut kv, Logits::Last)])
            .with_context(|| format!("decoding token {} of the sequence: it ends here", out.generated().len() + 1))?
            .remove(0);
    };
    println!();
    let n = out.generated().len();
    let (attended, _) = kv.mean_attended();
    eprintln!(
        "prompt {} tokens, prefill {:.1} tok/s, index {index_ms:.0} ms; generated {n} tokens, decode {:.1} tok/s; {}; finish: {}",
        prompt.len(),
        prompt.len() as f64 / (prefill_ms / 1e3),
        n as f64 / decode_start.elapsed().as_secs_f64(),
        match cfg {
            Some(c) => format!("sparse {} (budget {}, {attended:.0} keys attended per head on average)", c.method.name(), c.budget),
            None => "exact attention".into(),
        },
        finish.as_str()
    );
    if let Some(s) = kv.offload_stats() {
        eprintln!(
            "offloaded: {:.1} MiB of {:.1} MiB KV in RAM (at most {:.1} MiB during the prefill); read {:.1} MiB in {} reads, cluster cache hit rate {:.3}",
            kv.ram_kv_bytes() as f64 / (1 << 20) as f64,
            kv.kv_bytes() as f64 / (1 << 20) as f64,
            prefill_peak as f64 / (1 << 20) as f64,
            s.read_bytes as f64 / (1 << 20) as f64,
            s.read_ops,
            s.cache.hit_rows as f64 / (s.cache.hit_rows + s.cache.miss_rows).max(1) as f64
        );
    }
    Ok(())
}
