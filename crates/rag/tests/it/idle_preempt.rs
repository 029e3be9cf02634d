//! Idle units yield to user requests at once: a unit told to
//! stop at its k-th model step (a prefill chunk or a decode step) stores nothing — the QA bank,
//! its stale queue and the chunk KV tree are exactly as before it — and is put back, so the
//! units that follow are the ones an uninterrupted run makes, with the same answers (pycode-7m,
//! f16 KV).

use crate::common;
use std::sync::Arc;

use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_rag::idle::layer_choice::LayerChoiceConfig;
use engram_rag::idle::predict::PredictConfig;
use engram_rag::synth::{self, Step, SynthConfig};
use engram_rag::{DocKind, IdleConfig, KnowledgeBank, KvTree, PerCache, QaBank, Rag, RagConfig, UnitKind, UnitReport};

fn rag(dir: &std::path::Path) -> Rag {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 256 << 20);
    let mut bank = KnowledgeBank::open(&dir.join("bank"), common::words()).unwrap();
    let users = synth::generate(&SynthConfig { users: 1, topics_per_user: 2, ..SynthConfig::default() });
    for s in &users[0].steps {
        if let Step::Ingest(d) = s {
            if !d.id.contains("update") {
                bank.ingest_text(&d.id, d.kind, &d.text).unwrap();
            }
        }
    }
    let tree = KvTree::new(model.fingerprint, pool.format(), pool.bytes_per_token(), usize::MAX);
    let qa = QaBank::open(&dir.join("qa.bank"), 1 << 20).unwrap();
    let mut config = RagConfig::default();
    config.top_k = 2;
    config.params.max_tokens = 6;
    Rag::new(model, pool, bank, qa, tree, config)
}

/// What the caches hold (answers, the stale queue, tree paths and tokens), without ids, times
/// or recency.
type Snapshot = (Vec<(String, Vec<u32>, Vec<engram_rag::ChunkId>, u64)>, Vec<String>, Vec<(Vec<String>, Vec<u32>)>);

fn snapshot(r: &Rag) -> Snapshot {
    let qa = r.qa.entries().iter().map(|e| (e.query.clone(), e.answer_tokens.clone(), e.sources.clone(), e.hits)).collect();
    (qa, r.qa.stale().to_vec(), r.tree.entries())
}

/// Runs the next unit, first stopping it at its 1st, 2nd, … step until it finishes: every
/// stopped try leaves the caches as they were. Returns the finished unit and the stops made.
fn unit_through_every_stop(pc: &mut PerCache, r: &mut Rag) -> (Option<UnitReport>, u64) {
    let mut stops = 0;
    for k in 1.. {
        let before = snapshot(r);
        let mut asked = 0;
        let u = pc
            .idle_unit_over(&mut r.stores(), &mut || {
                asked += 1;
                asked >= k
            })
            .unwrap();
        match u {
            Some(u) if u.interrupted => {
                assert_eq!(asked, k, "stopped at the first ask that said stop");
                assert_eq!((u.prefill_tokens, u.decode_tokens), (0, 0));
                assert_eq!(snapshot(r), before, "{:?} stopped at step {k} changed the caches", u.kind);
                stops += 1;
            }
            u => {
                assert!(asked < k, "a finished unit was never told to stop");
                return (u, stops);
            }
        }
    }
    unreachable!()
}

/// The same units run once without stops and once stopped at every step: same kinds, queries,
/// QA answers and tree.
fn compare(cfg: IdleConfig, units: usize, after: impl Fn(&mut Rag, &mut PerCache)) -> Vec<UnitKind> {
    let (t1, t2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut plain, mut stopped) = (rag(t1.path()), rag(t2.path()));
    let (mut pc1, mut pc2) = (PerCache::in_memory(cfg), PerCache::in_memory(cfg));
    pc1.after_ingest(&plain, None).unwrap();
    pc2.after_ingest(&stopped, None).unwrap();
    let mut stops = 0;
    let mut seen = Vec::new();
    let mut longest_finished_step = 0.0f64;
    for phase in 0..2 {
        if phase == 1 {
            after(&mut plain, &mut pc1);
            after(&mut stopped, &mut pc2);
        }
        for _ in 0..units {
            let a = pc1.idle_unit(&mut plain).unwrap();
            let (b, n) = unit_through_every_stop(&mut pc2, &mut stopped);
            stops += n;
            let key = |u: &Option<UnitReport>| u.as_ref().map(|u| (u.kind, u.query.clone(), u.prefill_tokens, u.decode_tokens));
            assert_eq!(key(&a), key(&b), "the unit after the stops is the uninterrupted run's");
            // A step is part of its unit: a finished unit's longest step is within its time.
            assert!(b.as_ref().is_none_or(|u| !u.interrupted && u.longest_step_ms > 0.0 && u.longest_step_ms <= u.ms + 1e-9));
            longest_finished_step = b.as_ref().map_or(longest_finished_step, |u| longest_finished_step.max(u.longest_step_ms));
            seen.extend(b.map(|u| u.kind));
            assert_eq!(snapshot(&plain), snapshot(&stopped));
        }
    }
    assert!(stops > 0, "units were stopped: {seen:?}");
    assert_eq!(pc2.stats().interrupted, stops);
    assert_eq!(pc2.stats().units, pc1.stats().units, "interrupted units are not counted as run");
    // The stats' longest step also counts the interrupted runs' steps (each timed apart, so on
    // a busy machine one can outlast a whole finished unit): it is at least every finished
    // unit's, never bounded by the longest finished unit.
    assert!(pc2.stats().longest_step_ms >= longest_finished_step && longest_finished_step > 0.0);
    seen
}

#[test]
fn an_interrupted_unit_leaves_the_caches_as_before() {
    // Prefill and answer units, then a refresh's regeneration of an invalidated answer.
    let cfg = IdleConfig { predict: PredictConfig { stride: 2, ..PredictConfig::default() }, ..IdleConfig::default() };
    let kinds = compare(cfg, 3, |r, pc| {
        let q = r.qa.entries().first().map(|e| e.query.clone()).expect("an answer was stored");
        let topic = pc.abstracts().topics()[0].phrase.clone();
        let text = format!("Subject: {topic} moved\n\n{q} Update: the {topic} is moved to Friday; the old day is cancelled.");
        r.ingest_text("late-update", DocKind::Text, &text).unwrap();
        pc.after_ingest(r, None).unwrap();
    });
    for k in [UnitKind::Prefill, UnitKind::Answer, UnitKind::Regenerate] {
        assert!(kinds.contains(&k), "{k:?} not among {kinds:?}");
    }
}

#[test]
fn an_interrupted_conversion_keeps_its_answer() {
    // Patience 0: prefill, answer, then the answer leaves the QA bank for the tree (QA→KV).
    let cfg = IdleConfig {
        layer_choice: LayerChoiceConfig { patience: 0, idle_weight: 0.0, ..LayerChoiceConfig::default() },
        predict: PredictConfig { stride: 1, ..PredictConfig::default() },
        ..IdleConfig::default()
    };
    let kinds = compare(cfg, 3, |_, _| {});
    assert!(kinds.contains(&UnitKind::QaToKv), "{kinds:?}");
}

#[test]
fn an_interrupted_llm_prediction_runs_again_the_same() {
    // pycode-7m has a chat template: the model is asked (it writes Python, so the templates
    // fill in); a prediction stopped at any prefill chunk or decode step records nothing.
    let cfg = IdleConfig {
        predictor: engram_rag::idle::predict::By::Llm,
        predict: PredictConfig { stride: 2, ..PredictConfig::default() },
        ..IdleConfig::default()
    };
    let kinds = compare(cfg, 3, |_, _| {});
    assert_eq!(kinds.first(), Some(&UnitKind::Predict), "{kinds:?}");
}
