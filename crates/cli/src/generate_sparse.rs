//! `engram generate --sparse METHOD`: the opt-in sparse path (DynaKV and baselines, `engram-sparse`). The
//! configured [`SparseKv`] is handed to the engine as the request's own cache
//! ([`generate_on_cache`]: the engine's step prefills it with exact attention, builds the index
//! at the prompt's end, and decodes — there is no other decode loop here); every decoded token
//! attends only the keys the method retrieves (sinks, a recent window, `--sparse-budget`
//! retrieved tokens per layer and KV head). Sampling, stop tokens and strings are the
//! engine's, as the exact path's are. With
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

use std::any::Any;
use std::time::Instant;

use anyhow::{Context, Result};
use engram_engine::{generate_on_cache, SchedulerConfig};
use engram_kv::{KvError, KvPool, SeqCache};
use engram_model::{KvCache, KvChunk, KvRead, Model};
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

/// The configured sparse cache as the engine's sequence cache: the engine's step prefills it
/// (exact attention) and decodes on it; the prompt's end builds its index. It charges nothing
/// to the KV pool (the flags bound its RAM: `--sparse-ram-mib`, `--sparse-cache-mib`).
struct SparseSeq {
    kv: SparseKv,
    /// How long building the index took, and the KV RAM at most held during the prefill.
    index_ms: f64,
    prefill_peak: usize,
}

/// The sparse cache's own reads and writes (the engine's step reaches them through
/// [`SeqCache::as_kv_cache`]).
impl KvCache for SparseSeq {
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        self.kv.write(layer, first_pos, keys, values, num_tokens)
    }

    fn place(&mut self, first_slot: usize, positions: &[u32]) -> Result<(), String> {
        self.kv.place(first_slot, positions)
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.kv.for_each_chunk(layer, f)
    }

    fn for_each_chunk_of(&self, read: &KvRead<'_>, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.kv.for_each_chunk_of(read, f)
    }

    fn read_failure(&self) -> Option<String> {
        self.kv.read_failure()
    }
}

impl SeqCache for SparseSeq {
    fn len(&self) -> usize {
        self.kv.len()
    }

    fn reserve(&mut self, n: usize) -> Result<(), KvError> {
        self.kv.reserve(n);
        Ok(())
    }

    /// Only to the length it holds: a sparse index cannot forget tokens.
    fn truncate(&mut self, n: usize) -> bool {
        self.kv.len() == n
    }

    fn allows_drafts(&self) -> bool {
        false
    }

    fn ram_bytes(&self) -> usize {
        self.kv.ram_kv_bytes()
    }

    fn prefilled(&mut self) {
        self.prefill_peak = self.kv.peak_ram_kv_bytes();
        let t = Instant::now();
        self.kv.build_index();
        self.index_ms = t.elapsed().as_secs_f64() * 1e3;
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }

    fn as_kv_cache(&mut self) -> &mut dyn KvCache {
        &mut self.kv
    }
}

/// Generates after `prompt` with `cfg` (`None`: exact over the same cache), streaming to stdout;
/// with `off`, the KV past its RAM budget goes to the file during the prefill (lossless: the
/// same tokens as in RAM). One request through the engine's step ([`generate_on_cache`]) on the
/// sparse cache: the step is its decode loop.
pub fn generate(
    model: &Model,
    pool: &KvPool,
    prompt: &[u32],
    params: &engram_engine::SamplingParams,
    cfg: Option<SparseConfig>,
    off: Option<engram_sparse::OffloadConfig>,
    state: Option<&std::path::Path>,
) -> Result<()> {
    params.validate()?;
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty");
    anyhow::ensure!(params.max_tokens > 0, "--max-tokens must be at least 1 with --sparse");
    let ctx = model.config.max_positions;
    anyhow::ensure!(prompt.len() < ctx, "the prompt of {} tokens does not fit the model's context of {ctx}", prompt.len());
    let resumed = match (state, cfg) {
        (Some(dir), Some(cfg)) => resume(model, dir, cfg, off.clone(), prompt),
        _ => None,
    };
    let from = resumed.as_ref().map_or(0, SparseKv::len);
    let (kv, streamed) = match resumed {
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
    let seq = Box::new(SparseSeq { kv, index_ms: 0.0, prefill_peak: 0 });
    let config = SchedulerConfig::default();
    // A failed read of the offloaded KV (file truncated, removed, EIO) ends the sequence with
    // the reason; the tokens streamed so far stand.
    let (g, cache) =
        generate_on_cache(model, pool, &config, seq, prompt, params, &mut |s| stdout_sink(s)).context("generating on the sparse cache")?;
    println!();
    let seq = cache
        .and_then(|c| c.into_any().downcast::<SparseSeq>().ok())
        .context("the sparse cache did not come back from the engine whole")?;
    let SparseSeq { kv, index_ms, prefill_peak } = *seq;
    if streamed && !kv.is_offloaded() {
        eprintln!("note: the prompt's KV fits --sparse-ram-mib: kept in RAM, nothing offloaded");
    }
    if let Some(dir) = state {
        // The cache holds the prompt and every generated token that was fed.
        let fed: Vec<u32> = prompt.iter().chain(&g.tokens).take(kv.len()).copied().collect();
        match kv.save_state(dir, &StateMeta { fingerprint: state_fingerprint(model), owner: String::new(), tokens: fed }) {
            Ok(bytes) => {
                eprintln!("saved the conversation's sparse state to {} ({:.1} MiB)", dir.display(), bytes as f64 / (1 << 20) as f64)
            }
            Err(e) => eprintln!("warning: the sparse state was not saved: {e}"),
        }
    }
    let n = g.tokens.len();
    let (attended, _) = kv.mean_attended();
    // The step that ends the prefill builds the index and samples the first token.
    let prefill_ms = (g.timings.ttft_ms - index_ms).max(1e-6);
    eprintln!(
        "prompt {} tokens ({from} resumed), prefill {:.1} tok/s, index {index_ms:.0} ms; generated {n} tokens, decode {:.1} tok/s; {}; finish: {}",
        prompt.len(),
        (prompt.len() - from) as f64 / (prefill_ms / 1e3),
        g.timings.decode_tok_s(),
        match cfg {
            Some(c) => format!("sparse {} (budget {}, {attended:.0} keys attended per head on average)", c.method.name(), c.budget),
            None => "exact attention".into(),
        },
        g.finish.as_str()
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
