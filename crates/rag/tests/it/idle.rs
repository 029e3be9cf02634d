//! Idle-time population: knowledge abstracts, query prediction, the cache
//! scheduler's decisions on hand-made cases, and population on the embedded pycode-7m — what
//! it stores answers exactly as the cold path does.

use crate::common;
use std::sync::Arc;

use engram_engine::LoneSequence;
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_rag::idle::abstracts::{extract, AbstractStore};
use engram_rag::idle::layer_choice::{decide, kv_to_qa, qa_to_kv, Candidate, Estimates, HitStats, LayerChoiceConfig, Strategy};
use engram_rag::idle::predict::{PredictConfig, Predictor, Source};
use engram_rag::synth::{self, Step, SynthConfig};
use engram_rag::{
    CacheLevel, DocKind, IdleConfig, KnowledgeBank, KvTree, PerCache, QaBank, QueryOptions, Rag, RagConfig, RagError, UnitKind,
};

/// A bank holding the first user's initial synthetic documents (3 topics).
fn synth_bank(dir: &std::path::Path) -> KnowledgeBank {
    let mut bank = KnowledgeBank::open(&dir.join("bank"), common::words()).unwrap();
    let users = synth::generate(&SynthConfig { users: 1, topics_per_user: 3, ..SynthConfig::default() });
    for s in &users[0].steps {
        match s {
            Step::Ingest(d) if !d.id.contains("update") => {
                bank.ingest_text(&d.id, d.kind, &d.text).unwrap();
            }
            _ => {}
        }
    }
    bank
}

#[test]
fn abstracts_name_subjects_people_and_dates() {
    let parsed = engram_rag::parse::parse_bytes("mail.eml", "mail", DocKind::Email, false, common::EMAIL.as_bytes()).unwrap();
    let a = extract(DocKind::Email, "h", &parsed[0].text);
    assert_eq!(a.subject.as_deref(), Some("budget review moved"));
    assert!(a.names.contains(&"Alice".to_string()) && a.names.contains(&"Bob".to_string()), "{:?}", a.names);
    assert!(a.dates.contains(&"Thursday".to_string()), "{:?}", a.dates);
    assert!(a.terms.contains(&"budget".to_string()) && a.terms.contains(&"review".to_string()), "{:?}", a.terms);
    assert_eq!(a, extract(DocKind::Email, "h", &parsed[0].text), "pure");
    let cal = engram_rag::parse::parse_bytes("cal.ics", "cal", DocKind::Calendar, false, common::ICS.as_bytes()).unwrap();
    let c = extract(DocKind::Calendar, "h", &cal[0].text);
    assert_eq!(c.subject.as_deref(), Some("budget review"));
    assert!(c.dates.contains(&"2026-03-05".to_string()), "{:?}", c.dates);

    // Topics fold a longer subject into the shorter one it contains.
    let tmp = tempfile::tempdir().unwrap();
    let bank = synth_bank(tmp.path());
    let mut store = AbstractStore::in_memory();
    store.sync(&bank).unwrap();
    let topics = store.topics();
    assert_eq!(topics.len(), 3, "{topics:?}");
    assert!(topics.iter().all(|t| t.docs == 3), "mail, notes and calendar of each topic: {topics:?}");
}

#[test]
fn the_abstract_file_follows_the_bank_and_damage_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bank = synth_bank(tmp.path());
    let path = tmp.path().join("abstracts");
    let mut store = AbstractStore::open(&path).unwrap();
    let r = store.sync(&bank).unwrap();
    assert_eq!(r.extracted.len(), 9);
    let again = AbstractStore::open(&path).unwrap();
    assert_eq!(again.docs(), store.docs(), "round trip");
    // A changed document is extracted again; a removed one dropped; the rest untouched.
    bank.ingest_text("u0-mail-0", DocKind::Text, "Subject: Garden party. Dana hosts the garden party on Sunday.").unwrap();
    bank.remove("u0-notes-1").unwrap();
    let mut store = AbstractStore::open(&path).unwrap();
    let r = store.sync(&bank).unwrap();
    assert_eq!(r.extracted, vec!["u0-mail-0".to_string()]);
    assert_eq!(r.dropped, vec!["u0-notes-1".to_string()]);
    assert_eq!(AbstractStore::open(&path).unwrap().docs().len(), 8);
    assert!(store.sync(&bank).unwrap().extracted.is_empty(), "in step: nothing to do");

    let good = std::fs::read(&path).unwrap();
    let mut flipped = good.clone();
    let n = flipped.len() - 10;
    flipped[n] ^= 1;
    let other_version = String::from_utf8_lossy(&good).replacen(" v1 ", " v9 ", 1).into_bytes();
    for (name, bytes) in [
        ("truncated", good[..good.len() / 2].to_vec()),
        ("bit-flipped", flipped),
        ("foreign", b"engram-rag-qa v1 2 x\n{}".to_vec()),
        ("other version", other_version),
        ("empty", Vec::new()),
    ] {
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(AbstractStore::open(&path), Err(RagError::BadStore { .. })), "{name}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}: left in place");
    }
}

#[test]
fn prediction_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let bank = synth_bank(tmp.path());
    let mut store = AbstractStore::in_memory();
    store.sync(&bank).unwrap();
    let topics = store.topics();
    let asked = topics[0].phrase.clone();
    let run = |seed: u64| {
        let mut p = Predictor::new(PredictConfig { stride: 5, seed, history: 10 });
        let mut out = Vec::new();
        out.push(p.predict(&store));
        p.observe(&format!("Where is the {asked} taking place?"));
        out.push(p.predict(&store));
        out.push(p.predict(&store));
        out
    };
    let a = run(1);
    assert_eq!(a, run(1), "same seed, same questions");
    let all: Vec<&String> = a.iter().flatten().map(|p| &p.query).collect();
    let mut uniq = all.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), all.len(), "no question twice: {all:?}");
    assert!(a.iter().all(|r| r.len() <= 5), "at most a stride per prediction");
    assert_eq!(a[0].len(), 5);
    assert!(a[0].iter().all(|p| p.source == Source::Knowledge));
    // After a query, history-based questions mirror its wording over the other topics.
    let hist: Vec<&String> = a[1].iter().filter(|p| p.source == Source::History).map(|p| &p.query).collect();
    assert_eq!(hist.len(), topics.len() - 1, "{:?}", a[1]);
    for q in hist {
        assert!(q.starts_with("Where is the ") && q.ends_with(" taking place?") && !q.contains(&asked), "{q}");
    }
    // The first round asks each topic's general question first.
    for t in &topics {
        assert!(a[0].iter().any(|p| p.query == format!("When is the {}?", t.phrase)), "{:?}", a[0]);
    }
}

fn est(p_qa: f64, p_kv: f64) -> Estimates {
    Estimates { p_qa, p_kv, prefill_ms_per_token: 1.0, decode_ms_per_token: 10.0 }
}

#[test]
fn scheduler_decisions_on_hand_made_cases() {
    let cfg = LayerChoiceConfig { tau: 0.95, idle_weight: 0.2, patience: 10 };
    let c = Candidate { rest_tokens: 300, rest_chunk_tokens: 280, decode_tokens: 32 };
    // Likely to be asked: answer (300 + 320 ms saved with p 0.6 beats 280 ms with p 0.6).
    let d = decide(&cfg, &est(0.6, 0.6), &c, 0.85);
    assert_eq!(d.strategy, Strategy::Answer);
    assert!((d.cost_ms - 620.0).abs() < 1e-9 && (d.benefit_ms - (0.6 * 620.0 + 0.4 * 0.6 * 280.0)).abs() < 1e-9);
    // QA hits unlikely but the chunks come back: prefill only.
    assert_eq!(decide(&cfg, &est(0.05, 0.6), &c, 0.85).strategy, Strategy::Prefill);
    // A threshold past τ turns answering off even when QA hits are likely.
    assert_eq!(decide(&cfg, &est(0.9, 0.6), &c, 0.96).strategy, Strategy::Prefill);
    // Neither pays for its compute: skip.
    assert_eq!(decide(&cfg, &est(0.05, 0.1), &c, 0.85).strategy, Strategy::Skip);
    assert_eq!(decide(&cfg, &est(0.9, 0.1), &c, 0.96).strategy, Strategy::Skip);
    // Idle compute free: anything with a chance is done.
    let free = LayerChoiceConfig { idle_weight: 0.0, ..cfg };
    assert_eq!(decide(&free, &est(0.01, 0.01), &c, 0.85).strategy, Strategy::Answer);
    // The chunks already in the tree: prefilling would compute nothing, so it is never chosen.
    let held = Candidate { rest_tokens: 20, rest_chunk_tokens: 0, decode_tokens: 32 };
    assert_eq!(decide(&cfg, &est(0.05, 0.9), &held, 0.85).strategy, Strategy::Skip);
    assert_eq!(decide(&cfg, &est(0.5, 0.9), &held, 0.85).strategy, Strategy::Answer);
    // Conversions.
    assert!(qa_to_kv(&cfg, 0, 10, 0.85) && !qa_to_kv(&cfg, 0, 9, 0.85) && !qa_to_kv(&cfg, 1, 50, 0.85));
    assert!(qa_to_kv(&cfg, 0, 0, 0.95), "past τ a predicted answer leaves the QA bank at once");
    assert!(kv_to_qa(&cfg, 1, 0.85) && !kv_to_qa(&cfg, 0, 0.85) && !kv_to_qa(&cfg, 3, 0.95));
    // Hit probabilities: a prior of one in four, then the observed shares.
    assert_eq!(HitStats::default().p_qa(), 0.25);
    let h = HitStats { issued: 50, qa_matched: 9, qa_missed: 27, kv_matched: 29, kv_missed: 7 };
    assert_eq!((h.p_qa(), h.p_kv()), (0.25, 0.75));
}

fn rag(dir: &std::path::Path) -> Rag {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 256 << 20);
    let bank = synth_bank(dir);
    let tree = KvTree::new(model.fingerprint, pool.format(), pool.bytes_per_token(), usize::MAX);
    let qa = QaBank::open(&dir.join("qa.bank"), 1 << 20).unwrap();
    let mut config = RagConfig::default();
    config.top_k = 2;
    config.params.max_tokens = 8;
    Rag::new(model, pool, bank, qa, tree, config)
}

#[test]
fn idle_population_leaves_answers_equal_to_the_cold_path() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rag(tmp.path());
    let cfg = IdleConfig { predict: PredictConfig { stride: 3, ..PredictConfig::default() }, ..IdleConfig::default() };
    let mut pc = PerCache::open(&tmp.path().join("abstracts"), cfg).unwrap();
    pc.after_ingest(&r, None).unwrap();
    let mut kinds = Vec::new();
    for _ in 0..8 {
        let u = pc.idle_unit(&mut r).unwrap().expect("predictions left");
        assert!(u.ms > 0.0);
        kinds.push(u.kind);
    }
    assert!(kinds.contains(&UnitKind::Prefill) && kinds.contains(&UnitKind::Answer), "{kinds:?}");
    assert!(pc.stats().longest_unit_ms >= pc.stats().idle_ms / pc.stats().units as f64);
    assert!(r.tree.stats().entries > 0 && !r.qa.entries().is_empty());

    // Every predicted answer is what a cold generation of its prompt gives.
    for e in r.qa.entries() {
        let p = r.build_prompt(&e.query, &e.sources).unwrap();
        let g = LoneSequence::new(r.model(), r.pool()).generate(&p.tokens, &r.config.params, &mut |_| true).unwrap();
        assert_eq!(g.tokens, e.answer_tokens, "{}", e.query);
    }
    // Real queries over the populated tree answer as a cold prefill does.
    let kv_only = QueryOptions { use_qa: false, use_kv: true, threshold: 0.85 };
    let cold = QueryOptions { use_qa: false, use_kv: false, threshold: 0.85 };
    let topic = pc.abstracts().topics()[0].phrase.clone();
    let mut kv_hits = 0;
    for q in [format!("When is the {topic}?"), format!("Who is leading the {topic}?"), format!("Is the {topic} on a Friday?")] {
        let warm = r.query(&q, &kv_only).unwrap();
        let c = r.query(&q, &cold).unwrap();
        assert_eq!(warm.tokens, c.tokens, "{q}");
        kv_hits += (warm.cache_level == CacheLevel::Kv) as usize;
        pc.after_query(&r, &q, &warm).unwrap();
    }
    assert!(kv_hits >= 1, "the predicted prefixes were used");
    assert_eq!(pc.stats().real_queries, 3);
    assert!(pc.stats().hits.kv_matched >= 1);

    // A document that changes a predicted answer's retrieval invalidates it like any other, and
    // the next unit regenerates it over the bank as it is now.
    let before: Vec<String> = r.qa.entries().iter().map(|e| e.query.clone()).collect();
    let text = format!("Subject: {topic} moved\n\nUpdate: the {topic} is moved to Friday. The {topic} on the old day is cancelled.");
    r.ingest_text("late-update", DocKind::Text, &text).unwrap();
    pc.after_ingest(&r, None).unwrap();
    let stale: Vec<String> = r.qa.stale().to_vec();
    assert!(!stale.is_empty() && stale.iter().all(|q| before.contains(q)), "{stale:?}");
    let u = pc.idle_unit(&mut r).unwrap().unwrap();
    assert_eq!((u.kind, &u.query), (UnitKind::Regenerate, &stale[0]));
    let e = r.qa.entries().iter().find(|e| e.query == stale[0]).unwrap();
    let p = r.build_prompt(&e.query, &e.sources).unwrap();
    let g = LoneSequence::new(r.model(), r.pool()).generate(&p.tokens, &r.config.params, &mut |_| true).unwrap();
    assert_eq!(g.tokens, e.answer_tokens);
    assert!(e.sources.iter().all(|c| r.bank.has_chunk(c)), "answered over the bank as it is now");
}

#[test]
fn past_tau_population_is_prefill_only_and_predicted_answers_convert_to_kv() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rag(tmp.path());
    // A strict threshold (≥ τ): nothing is answered, the chunks are prefilled.
    let strict = IdleConfig { threshold: 0.97, ..IdleConfig::default() };
    let mut pc = PerCache::in_memory(strict);
    pc.after_ingest(&r, None).unwrap();
    for _ in 0..6 {
        let u = pc.idle_unit(&mut r).unwrap().unwrap();
        assert!(matches!(u.kind, UnitKind::Prefill | UnitKind::Skip), "{u:?}");
        assert_eq!(u.decode_tokens, 0);
    }
    assert!(r.qa.entries().is_empty());
    assert!(pc.stats().prefilled >= 1);

    // Patience 0: a predicted answer with no hit is converted to KV at the next free unit.
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rag(tmp.path());
    let eager = IdleConfig {
        layer_choice: LayerChoiceConfig { patience: 0, idle_weight: 0.0, ..LayerChoiceConfig::default() },
        predict: PredictConfig { stride: 1, ..PredictConfig::default() },
        ..IdleConfig::default()
    };
    let mut pc = PerCache::in_memory(eager);
    pc.after_ingest(&r, None).unwrap();
    let mut kinds = Vec::new();
    for _ in 0..3 {
        kinds.push(pc.idle_unit(&mut r).unwrap().unwrap().kind);
    }
    assert_eq!(kinds, vec![UnitKind::Prefill, UnitKind::Answer, UnitKind::QaToKv]);
    assert!(r.qa.entries().is_empty(), "the converted answer left the QA bank");
    assert_eq!(pc.stats().qa_to_kv, 1);
    assert!(r.tree.stats().entries >= 2, "its chunks stay in the tree");
}
