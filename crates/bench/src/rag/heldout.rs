//! `engram bench rag --predictor llm,template`: which predictor fills a QA bank that answers
//! questions nobody wrote templates for. Per user of the synthetic corpus (its documents
//! only, no timeline), fresh stores per variant:
//!
//! ```text
//!  naive:        each held-out question retrieved and generated cold (the reference answers)
//!  <predictor>:  ingest ─ idle phase: PerCache units until none is left or --idle-units ran
//!                (the LLM's prediction units count) ─ each held-out question with the QA bank
//!                (threshold) and the chunk KV tree; no idle unit runs between questions
//! ```
//! The held-out questions (`crates/bench/data/rag_heldout.json`) are forms in a user's own
//! wording, asked once per topic. Reported per variant: QA hit rate, questions an idle-time
//! prediction matched at the threshold, answers equal to naive's tokens, mean and p50 latency,
//! idle compute (ms, units, questions predicted and by whom).
//!
//! Invariant: every variant sees the same documents and the same questions in the same order;
//! a generated answer (QA miss) equals naive's tokens (the exact KV path), so agreement below
//! 100% comes from QA hits alone.

use std::sync::Arc;

use anyhow::{Context, Result};
use engram_embed::TextEncoder;
use engram_model::Model;
use engram_rag::idle::predict::{By, PredictConfig};
use engram_rag::synth::{self, Step, SynthConfig, SynthUser};
use engram_rag::{CacheLevel, IdleConfig, KnowledgeBank, KvTree, PerCache, QaBank, QueryOptions, Rag, RagConfig};

use super::{mean, p50, Args};
use crate::common::kv_pool;

/// The committed held-out question forms.
const HELDOUT: &str = include_str!("../../data/rag_heldout.json");

/// The held-out questions for `topics`: every form of `file` (JSON with a `forms` list, each
/// with a `{topic}` slot) once per topic, topic by topic.
pub fn questions(file: &str, topics: &[String]) -> Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(file).context("held-out question file")?;
    let forms: Vec<String> = v["forms"]
        .as_array()
        .context("held-out question file: no \"forms\" list")?
        .iter()
        .map(|f| f.as_str().map(str::to_string).context("a form is not a string"))
        .collect::<Result<_>>()?;
    anyhow::ensure!(forms.iter().all(|f| f.contains("{topic}")), "every form needs a {{topic}} slot");
    Ok(topics.iter().flat_map(|t| forms.iter().map(move |f| f.replace("{topic}", t))).collect())
}

/// The user's topics, in the order the timeline first asks about them.
fn topics_of(user: &SynthUser) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in &user.steps {
        if let Step::Query { topic, .. } = s {
            if !out.contains(topic) {
                out.push(topic.clone());
            }
        }
    }
    out
}

struct Row {
    variant: String,
    user: String,
    query: String,
    level: CacheLevel,
    matched: Option<String>,
    total_ms: f64,
    tokens: Vec<u32>,
}

/// Runs the comparison for `predictors` (`llm`, `template`).
pub fn run(a: &Args, model: Arc<Model>, enc: Arc<dyn TextEncoder>, predictors: &[By]) -> Result<()> {
    let users = synth::generate(&SynthConfig { seed: a.seed, users: a.users, topics_per_user: a.topics, ..SynthConfig::default() });
    let mut rows: Vec<Row> = Vec::new();
    let mut idle = serde_json::Map::new();
    let variants: Vec<Option<By>> = std::iter::once(None).chain(predictors.iter().copied().map(Some)).collect();
    for by in variants {
        let name = match by {
            None => "naive".to_string(),
            Some(b) => serde_json::to_value(b)?.as_str().unwrap_or("?").to_string(),
        };
        let mut stats = Vec::new();
        let mut examples: Vec<serde_json::Value> = Vec::new();
        for user in &users {
            let tmp = tempfile::tempdir()?;
            let pool = kv_pool(&model, &a.model)?;
            let bank = KnowledgeBank::open(&tmp.path().join("bank"), enc.clone())?;
            let qa = QaBank::open(&tmp.path().join("qa.bank"), engram_rag::DEFAULT_QA_CAP_BYTES)?;
            let tree = KvTree::new(model.fingerprint, pool.format(), pool.bytes_per_token(), pool.budget() / 2);
            let mut config = RagConfig { top_k: a.top_k, ..RagConfig::default() };
            config.params.max_tokens = a.max_tokens;
            let mut rag = Rag::new(model.clone(), pool, bank, qa, tree, config);
            let mut pc = by.map(|b| {
                PerCache::in_memory(IdleConfig {
                    predict: PredictConfig { stride: a.stride, seed: a.seed, ..PredictConfig::default() },
                    threshold: a.threshold,
                    predictor: b,
                    // Units run alone here (never interrupted): the engine's full chunk.
                    prefill_chunk: engram_engine::DEFAULT_PREFILL_CHUNK,
                    ..IdleConfig::default()
                })
            });
            for s in &user.steps {
                if let Step::Ingest(d) = s {
                    if d.id.contains("update") {
                        continue;
                    }
                    let r = rag.ingest_text(&d.id, d.kind, &d.text)?;
                    if let Some(pc) = &mut pc {
                        pc.after_ingest(&rag, Some(&r))?;
                    }
                }
            }
            if let Some(pc) = &mut pc {
                let mut n = 0;
                while n < a.idle_units_total && pc.idle_unit(&mut rag)?.is_some() {
                    n += 1;
                }
                eprintln!("[{name}] {}: {n} idle units, {:.0} ms", user.name, pc.stats().idle_ms);
            }
            let opts = match by {
                None => QueryOptions { use_qa: false, use_kv: false, threshold: a.threshold },
                Some(_) => QueryOptions { use_qa: true, use_kv: true, threshold: a.threshold },
            };
            for q in questions(HELDOUT, &topics_of(user))? {
                let ans = rag.query(&q, &opts)?;
                if let Some(pc) = &mut pc {
                    pc.after_query(&rag, &q, &ans)?;
                }
                rows.push(Row {
                    variant: name.clone(),
                    user: user.name.clone(),
                    query: q,
                    level: ans.cache_level,
                    matched: ans.matched_query,
                    total_ms: ans.timings.total_ms,
                    tokens: ans.tokens,
                });
            }
            if let Some(pc) = pc {
                examples.extend(
                    pc.predictions().iter().take(12).map(|p| serde_json::json!({"query": p.query, "by": p.by, "source": p.source})),
                );
                stats.push(pc.stats().clone());
            }
        }
        if !stats.is_empty() {
            let sum = |f: fn(&engram_rag::IdleStats) -> u64| stats.iter().map(f).sum::<u64>();
            idle.insert(
                name.clone(),
                serde_json::json!({"idle_ms": stats.iter().map(|s| s.idle_ms).sum::<f64>(), "units": sum(|s| s.units),
                    "predicted": sum(|s| s.predicted), "llm_predictions": sum(|s| s.llm_predictions), "llm_questions": sum(|s| s.llm_questions),
                    "template_fallbacks": sum(|s| s.template_fallbacks), "answered": sum(|s| s.answered), "prefilled": sum(|s| s.prefilled),
                    "matched_by_prediction": sum(|s| s.matched_by_prediction), "served_by_prediction": sum(|s| s.served_by_prediction),
                    "example_predictions": examples}),
            );
        }
    }
    report(a, &rows, idle)
}

fn report(a: &Args, rows: &[Row], idle: serde_json::Map<String, serde_json::Value>) -> Result<()> {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.variant.as_str()) {
            names.push(&r.variant);
        }
    }
    let mut summary = Vec::new();
    for v in names {
        let r: Vec<&Row> = rows.iter().filter(|r| r.variant == v).collect();
        let same = r
            .iter()
            .filter(|x| {
                rows.iter().find(|n| n.variant == "naive" && n.user == x.user && n.query == x.query).is_none_or(|n| n.tokens == x.tokens)
            })
            .count();
        let lat: Vec<f64> = r.iter().map(|r| r.total_ms).collect();
        let i = idle.get(v).cloned().unwrap_or(serde_json::Value::Null);
        summary.push(serde_json::json!({"variant": v, "questions": r.len(),
            "qa_hit_rate": r.iter().filter(|r| r.level == CacheLevel::Qa).count() as f64 / r.len().max(1) as f64,
            "answers_equal_to_naive": same, "mean_ms": mean(&lat), "p50_ms": p50(&lat),
            "matched_by_prediction": i["matched_by_prediction"], "idle": i}));
    }
    if a.json {
        let per_query: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({"variant": r.variant, "user": r.user, "query": r.query, "cache_level": r.level, "matched_query": r.matched, "total_ms": r.total_ms}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"bench": "rag-heldout", "seed": a.seed, "users": a.users, "topics": a.topics, "threshold": a.threshold,
                "stride": a.stride, "idle_units": a.idle_units_total, "max_tokens": a.max_tokens, "threads": engram_kernels::num_threads(),
                "summary": summary, "per_query": per_query})
        );
        return Ok(());
    }
    println!(
        "{:<9} {:>9} {:>7} {:>13} {:>9} {:>9} {:>8} {:>10} {:>6} {:>16}",
        "variant", "questions", "qa hit", "pred. matched", "=naive", "mean ms", "p50 ms", "idle ms", "units", "predicted (llm)"
    );
    for s in &summary {
        let i = &s["idle"];
        println!(
            "{:<9} {:>9} {:>6.0}% {:>13} {:>4}/{:<4} {:>9.1} {:>8.1} {:>10.0} {:>6} {:>10} ({})",
            s["variant"].as_str().unwrap_or(""),
            s["questions"],
            100.0 * s["qa_hit_rate"].as_f64().unwrap_or(0.0),
            i["matched_by_prediction"].as_u64().unwrap_or(0),
            s["answers_equal_to_naive"],
            s["questions"],
            s["mean_ms"].as_f64().unwrap_or(0.0),
            s["p50_ms"].as_f64().unwrap_or(0.0),
            i["idle_ms"].as_f64().unwrap_or(0.0),
            i["units"].as_u64().unwrap_or(0),
            i["predicted"].as_u64().unwrap_or(0),
            i["llm_questions"].as_u64().unwrap_or(0),
        );
    }
    for (v, i) in &idle {
        let ex: Vec<&str> = i["example_predictions"].as_array().into_iter().flatten().filter_map(|e| e["query"].as_str()).take(6).collect();
        println!("{v}: first predictions: {ex:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heldout_forms_fill_every_topic_and_differ_from_the_templates() {
        let q = questions(HELDOUT, &["budget review".into(), "team offsite".into()]).unwrap();
        assert_eq!(q.len() % 2, 0);
        assert!(q.len() >= 12, "{q:?}");
        assert!(q[0].contains("budget review") && q[q.len() - 1].contains("team offsite"));
        // None is one of the template predictor's forms nor one of the timeline's.
        for t in
            ["When is the", "What is the", "Where is the", "Who is leading", "What should I", "Who is attending", "Has the", "Who leads"]
        {
            assert!(q.iter().all(|x| !x.starts_with(t)), "{t}");
        }
        assert!(questions("{\"forms\": [\"no slot\"]}", &["x".into()]).is_err());
        assert!(questions("not json", &["x".into()]).is_err());
    }
}
