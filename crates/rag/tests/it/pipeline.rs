//! The pipeline on the embedded pycode-7m: answers that start from the chunk KV tree are the
//! tokens of a cold prefill of the same prompt; a repeated query is a QA hit; an ingest that
//! changes a stored query's retrieval means the next ask is generated again (never stale);
//! bad queries are clear errors that store nothing.

use crate::common;
use std::sync::Arc;

use engram_engine::LoneSequence;
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_rag::{CacheLevel, DocKind, KnowledgeBank, KvTree, QaBank, QueryOptions, Rag, RagConfig, RagError};

const DOCS: &[(&str, &str)] = &[
    ("mail-1", "From: Alice. Subject: Budget review. The budget review moved to Thursday at 3 pm in room Fjord. Bring the Q1 forecast and the hiring plan. Carol will join remotely from Oslo."),
    ("mail-2", "From: Bob. Subject: Offsite. The team offsite is in Porto from May 4 to May 6. Flights leave Lisbon at noon. Hotel Ribeira is booked for everyone."),
    ("notes-1", "Meeting notes, design sync. We agreed to ship the cache tier in June. Dana owns the disk format. Eli writes the benchmark. Next sync is Tuesday."),
    ("cal-1", "Event: Dentist. When: Monday 8 am. Where: Smile Clinic. Event: Lunch with Carol. When: Friday noon. Where: Green Cafe."),
];

/// The pipeline over DOCS; its KV tree holds at most `cap_tokens` tokens' bytes (None: no cap).
fn rag(dir: &std::path::Path, cap_tokens: Option<usize>) -> Rag {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 256 << 20);
    let mut bank = KnowledgeBank::open(&dir.join("bank"), common::words()).unwrap();
    for (id, text) in DOCS {
        bank.ingest_text(id, DocKind::Text, text).unwrap();
    }
    let cap = cap_tokens.map_or(usize::MAX, |t| t * pool.bytes_per_token());
    let tree = KvTree::new(model.fingerprint, pool.format(), pool.bytes_per_token(), cap);
    let qa = QaBank::open(&dir.join("qa.bank"), 1 << 20).unwrap();
    let mut config = RagConfig::default();
    config.top_k = 2;
    config.params.max_tokens = 12;
    Rag::new(model, pool, bank, qa, tree, config)
}

const KV_ONLY: QueryOptions = QueryOptions { use_qa: false, use_kv: true, threshold: 0.85 };
const NONE: QueryOptions = QueryOptions { use_qa: false, use_kv: false, threshold: 0.85 };

#[test]
fn answers_from_the_kv_tree_equal_a_cold_prefill() {
    let tmp = tempfile::tempdir().unwrap();
    for cap_tokens in [None, Some(300)] {
        let mut r = rag(tmp.path(), cap_tokens);
        let cap = r.tree.stats().cap_bytes;
        let qs = [
            "When is the budget review?",
            "Where is the budget review?",
            "Who joins the budget review remotely?",
            "When is the offsite in Porto?",
            "Where does the team offsite happen?",
            "When is the budget review?",
        ];
        let mut kv_hits = 0;
        for q in qs {
            let warm = r.query(q, &KV_ONLY).unwrap();
            let cold = r.query(q, &NONE).unwrap();
            assert_eq!(warm.tokens, cold.tokens, "{q}: reuse changed the answer (cap {cap})");
            assert_eq!(warm.chunks, cold.chunks);
            // The cold path is also what a cold lone sequence makes of the prompt's tokens.
            let p = r.build_prompt(q, &cold.chunks).unwrap();
            let g = LoneSequence::new(r.model(), r.pool()).generate(&p.tokens, &r.config.params, &mut |_| true).unwrap();
            assert_eq!(g.tokens, cold.tokens);
            if warm.cache_level == CacheLevel::Kv {
                kv_hits += 1;
                assert!(warm.timings.cached_tokens > p.ends[0], "chunks were reused, not only the system prompt");
            }
            assert_eq!(cold.cache_level, CacheLevel::None);
            assert_eq!(cold.timings.cached_tokens, 0);
        }
        assert!(kv_hits >= 2, "repeated chunk sets reuse KV ({kv_hits} hits, cap {cap})");
        assert!(r.tree.stats().bytes <= cap);
        if cap_tokens.is_some() {
            assert!(r.tree.stats().evicted > 0, "the small cap evicted");
        }
        // Removing a document drops the tree's paths through its chunks; answers stay exact.
        let before = r.tree.stats().entries;
        r.remove("mail-1").unwrap();
        assert!(r.tree.stats().entries < before || before == 0);
        let q = "When is the budget review?";
        assert_eq!(r.query(q, &KV_ONLY).unwrap().tokens, r.query(q, &NONE).unwrap().tokens);
    }
}

#[test]
fn a_repeated_query_is_a_qa_hit_until_an_ingest_changes_its_retrieval() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rag(tmp.path(), None);
    let q = "When is the dentist appointment?";
    let first = r.query(q, &QueryOptions::default()).unwrap();
    assert_ne!(first.cache_level, CacheLevel::Qa);
    let again = r.query(q, &QueryOptions::default()).unwrap();
    assert_eq!(again.cache_level, CacheLevel::Qa);
    assert_eq!((again.tokens.clone(), again.sources.clone()), (first.tokens.clone(), first.sources.clone()));
    assert!(again.similarity.unwrap() > 0.999);
    // A document that enters this query's top-2: the stored answer is dropped.
    r.ingest_text(
        "cal-2",
        DocKind::Text,
        "Event: Dentist appointment moved. When is the dentist appointment? Now Wednesday 9 am, dentist Smile Clinic.",
    )
    .unwrap();
    let after = r.query(q, &QueryOptions::default()).unwrap();
    assert_ne!(after.cache_level, CacheLevel::Qa, "a stale answer was served");
    assert!(after.sources.contains(&"cal-2".to_string()), "{:?}", after.sources);
    let cold = r.query(q, &NONE).unwrap();
    assert_eq!(after.tokens, cold.tokens);
    // Idle time: nothing stale is left to regenerate (the query was asked again); a second
    // update makes it stale, and regeneration stores the answer a cold run gives.
    r.ingest_text(
        "cal-3",
        DocKind::Text,
        "Dentist appointment update: when is the dentist appointment? Dentist moved again, Thursday 10 am.",
    )
    .unwrap();
    assert!(r.qa.stale().contains(&q.to_string()));
    assert_eq!(r.regenerate_stale(8).unwrap(), vec![q.to_string()]);
    let regenerated = r.query(q, &QueryOptions::default()).unwrap();
    assert_eq!(regenerated.cache_level, CacheLevel::Qa);
    let cold2 = r.query(q, &NONE).unwrap();
    assert_eq!((regenerated.tokens.clone(), regenerated.chunks.clone()), (cold2.tokens.clone(), cold2.chunks.clone()));
    let after = r.query(q, &NONE).unwrap();
    // The QA bank on disk holds the new answer, and survives a reopen.
    let reopened = QaBank::open(&tmp.path().join("qa.bank"), 1 << 20).unwrap();
    assert!(reopened.entries().iter().any(|e| e.query == q && e.sources == after.chunks));
}

#[test]
fn bad_queries_are_errors_that_store_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rag(tmp.path(), None);
    let before = common::snapshot(tmp.path());
    assert!(matches!(r.query("   ", &QueryOptions::default()), Err(RagError::BadInput { .. })));
    let huge: String = (0..1500).map(|i| format!("w{i} ")).collect();
    assert!(matches!(r.query(&huge, &QueryOptions::default()), Err(RagError::QueryTooLong { .. })));
    let bad = QueryOptions { threshold: 1.5, ..QueryOptions::default() };
    assert!(matches!(r.query("When is lunch?", &bad), Err(RagError::BadInput { .. })));
    assert!(matches!(r.remove("nope"), Err(RagError::UnknownId(_))));
    assert_eq!(common::snapshot(tmp.path()), before);
    assert_eq!((r.qa.stats().entries, r.tree.stats().entries), (0, 0));
}
