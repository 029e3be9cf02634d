//! The idle budget in the engine's idle hook: `TreePolicy::idle_slice` runs a unit, then rests
//! for the share the load leaves (no unit runs while it rests, the counters say so), and runs
//! units back to back when the machine is quiet. Load and battery are fed, not read.

use crate::common;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_policy::{ContextPolicy, IdleInterrupt};
use engram_rag::idle::budget::{FixedLoad, LoadSample, DEFAULT_FLOOR};
use engram_rag::idle::predict::PredictConfig;
use engram_rag::synth::{self, Step, SynthConfig};
use engram_rag::{IdleConfig, IdleTenants, KnowledgeBank, Library, PerCache, QaBank, RagConfig, SegmentRegistry, TreePolicy};

fn policy(dir: &std::path::Path, load: LoadSample) -> (TreePolicy, IdleTenants) {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20);
    let mut bank = KnowledgeBank::open(&dir.join("bank"), common::words()).unwrap();
    let users = synth::generate(&SynthConfig { users: 1, topics_per_user: 1, ..SynthConfig::default() });
    for s in &users[0].steps {
        if let Step::Ingest(d) = s {
            bank.ingest_text(&d.id, d.kind, &d.text).unwrap();
        }
    }
    let mut config = RagConfig::default();
    config.params.max_tokens = 4;
    let mut lib = Library::new(model.clone(), bank, QaBank::in_memory(1 << 20), config);
    let cfg = IdleConfig { predict: PredictConfig { stride: 4, ..PredictConfig::default() }, ..IdleConfig::default() };
    lib.enable_idle(PerCache::in_memory(cfg)).unwrap();
    let tenants = IdleTenants::with_load_source(Box::new(FixedLoad(load)));
    tenants.add("t", Arc::new(Mutex::new(lib)), None);
    let (inner, _) = engram_policy::testing::Recording::new();
    let p = TreePolicy::new(Box::new(inner), SegmentRegistry::default(), pool, model, 16 << 20).with_idle(tenants.clone());
    (p, tenants)
}

fn units(t: &IdleTenants) -> u64 {
    let c = t.counters();
    c.total_units() + c.interrupted.load(Relaxed)
}

#[test]
fn a_loaded_machine_rests_between_units_and_a_quiet_one_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    // Far more load than cores: the floor share, four times a unit's time of rest after it.
    let busy = LoadSample { load1: Some(1000.0), cores: Some(2), battery: None };
    let (mut p, t) = policy(tmp.path(), busy);
    assert!(p.idle_slice(&IdleInterrupt::never()));
    assert_eq!(units(&t), 1, "the first slice runs a unit");
    assert_eq!(t.counters().budget_share(), DEFAULT_FLOOR);
    let rest = t.counters().rest_us.load(Relaxed);
    assert!(rest > 0, "a rest was charged");
    // Slices within the rest run nothing (each naps at most 5 ms).
    let start = std::time::Instant::now();
    while start.elapsed().as_micros() < (rest as u128) / 2 {
        assert!(p.idle_slice(&IdleInterrupt::never()));
        assert_eq!(units(&t), 1, "no unit while resting");
    }

    let tmp = tempfile::tempdir().unwrap();
    let quiet = LoadSample { load1: Some(0.0), cores: Some(2), battery: None };
    let (mut p, t) = policy(tmp.path(), quiet);
    for n in 1..=3 {
        assert!(p.idle_slice(&IdleInterrupt::never()));
        assert_eq!(units(&t), n, "back to back");
    }
    assert_eq!(t.counters().budget_share(), 1.0);
    assert_eq!(t.counters().rest_us.load(Relaxed), 0);
}
