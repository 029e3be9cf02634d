//! `TreePolicy` composes with the policy it wraps through `PolicyLayer`: for owners that are
//! not RAG jobs, every seam method reaches the inner policy (a recording one here).

use crate::common;
use std::sync::Arc;

use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_rag::{SegmentRegistry, TreePolicy};

#[test]
fn every_seam_method_reaches_the_wrapped_policy() {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 16 << 20);
    engram_policy::testing::exercise_every_method(|inner| {
        Box::new(TreePolicy::new(inner, SegmentRegistry::default(), pool.clone(), model.clone(), 1 << 20))
    });
}
