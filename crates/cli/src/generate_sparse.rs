//! `engram generate --sparse METHOD`: the opt-in sparse path (DynaKV and baselines, `engram-sparse`). The
//! prompt is prefilled with exact attention into a [`SparseKv`], the index is built over it,
//! and every decoded token attends only the keys the method retrieves (sinks, a recent
//! window, `--sparse-budget` retrieved tokens per layer and KV head). Sampling, stop tokens
//! and strings go through the engine's [`Decoding`], as the exact path's do. With
//! `--sparse-offload`, the prefill is bounded: the prompt's KV past `--sparse-ram-mib` goes to
//! the file chunk by chunk as it is written, its index built segment by segment
//! ([`SparseKv::offload_streaming`]), so the KV in RAM never holds the whole prompt. With
//! `--sparse-state DIR`, a conversation saved there whose tokens the prompt extends is resumed
//! (only the new tokens prefilled) and the state is saved there at the end
//! ([`SparseKv::save_state`]); a missing, unsound or foreign state means a full prefill.
//!
//! Invariant: a configuration that cannot be sparse is refused or falls back to exact with a
//! warning, never run half-way: an unknown method or a zero budget is an error; a budget that
//! covers the whole prompt (nothing to leave out) runs exact and says so.

use std::time::Instant;

use anyhow::{Context, Result};
use engram_engine::{Decoding, FinishReason};
use engram_model::{Logits, Model, SeqStep};
use engram_sparse::{Method, SparseConfig, SparseKv, StateMeta};

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
    state: Option<&std::path::Path>,
) -> Result<()> {
    params.validate()?;
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty");
    let ctx = model.config.max_positions;
    anyhow::ensure!(prompt.len() < ctx, "the prompt of {} tokens does not fit the model's context of {ctx}", prompt.len());
    let start = Instant::now();
    let resumed = match (state, cfg) {
        (Some(dir), Some(cfg)) => resume(model, dir, cfg, off.clone(), prompt),
        _ => None,
    };
    let from = resumed.as_ref().map_or(0, SparseKv::len);
    let (mut kv, streamed) = match resumed {
        Some(kv) => (kv, false),
        None => {
            let mut kv = SparseKv::new(&model.config, cfg);
            let streamed = match (off, cfg) {
                (Some(off), Some(_)) => {
                    let dir = off.dir.clone();
                    kv.offload_streaming(off).with_context(|| format!("--sparse-offload {}", dir.display()))?;
                    true
                }
                _ => false,
            };
            (kv, streamed)
        }
    };
    let mut fed = prompt.to_vec();
    let mut logits = Vec::new();
    for part in prompt[from..].chunks(engram_engine::DEFAULT_PREFILL_CHUNK) {
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
        fed.push(tok);
        // A failed read of the offloaded KV (file truncated, removed, EIO) ends the sequence
        // with the reason; the tokens streamed so far stand.
        logits = model
            .forward(&mut [SeqStep::new(&[tok], slot, &mut kv, Logits::Last)])
            .with_context(|| format!("decoding token {} of the sequence: it ends here", out.generated().len() + 1))?
            .remove(0);
    };
    println!();
    if let Some(dir) = state {
        match kv.save_state(dir, &StateMeta { fingerprint: state_fingerprint(model), owner: String::new(), tokens: fed }) {
            Ok(bytes) => {
                eprintln!("saved the conversation's sparse state to {} ({:.1} MiB)", dir.display(), bytes as f64 / (1 << 20) as f64)
            }
            Err(e) => eprintln!("warning: the sparse state was not saved: {e}"),
        }
    }
    let n = out.generated().len();
    let (attended, _) = kv.mean_attended();
    eprintln!(
        "prompt {} tokens ({from} resumed), prefill {:.1} tok/s, index {index_ms:.0} ms; generated {n} tokens, decode {:.1} tok/s; {}; finish: {}",
        prompt.len(),
        (prompt.len() - from) as f64 / (prefill_ms / 1e3),
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

/// The model and KV format a saved state must come from (the f16 KV of a sparse cache).
fn state_fingerprint(model: &Model) -> String {
    engram_kv::persist::cache_fingerprint(model.fingerprint, engram_kv::KvFormat::F16)
}

/// The cache saved in `dir` when it is a sound state of this model and `cfg` whose tokens
/// `prompt` extends by at least one; else `None`, the reason on stderr (the prompt is prefilled).
fn resume(
    model: &Model,
    dir: &std::path::Path,
    cfg: SparseConfig,
    off: Option<engram_sparse::OffloadConfig>,
    prompt: &[u32],
) -> Option<SparseKv> {
    if !dir.join(engram_sparse::persist::STATE_FILE).exists() {
        return None;
    }
    let expect = StateMeta { fingerprint: state_fingerprint(model), owner: String::new(), tokens: Vec::new() };
    match SparseKv::resume_state(dir, &model.config, cfg, &expect, off) {
        Ok((kv, m)) if m.tokens.len() < prompt.len() && prompt.starts_with(&m.tokens) => {
            eprintln!("resumed {} tokens from {}", m.tokens.len(), dir.display());
            Some(kv)
        }
        Ok(_) => {
            eprintln!("note: the prompt does not extend the conversation saved in {}: prefilling it", dir.display());
            None
        }
        Err(e) => {
            eprintln!("warning: {e}; prefilling the prompt");
            None
        }
    }
}
