//! Position-independent chunk reuse (`ChunkReuse::Blend`) on the embedded pycode-7m, against
//! the cold path: ratio 1 answers equal cold answers token for token; a prompt with one chunk
//! (the chunk where it was computed) recomputes nothing and equals the exact tree path; chunks
//! are reused in any order; the store keeps under its cap, forgets removed documents' chunks,
//! never hits for another KV format; bad modes and ratios are clear errors.

use crate::common;
use std::sync::Arc;

use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_rag::{CacheLevel, ChunkReuse, ChunkStore, DocKind, KnowledgeBank, KvTree, QaBank, QueryOptions, Rag, RagConfig};

const DOCS: &[(&str, &str)] = &[
    ("mail-1", "From: Alice. Subject: Budget review. The budget review moved to Thursday at 3 pm in room Fjord. Bring the Q1 forecast and the hiring plan. Carol will join remotely from Oslo."),
    ("mail-2", "From: Bob. Subject: Offsite. The team offsite is in Porto from May 4 to May 6. Flights leave Lisbon at noon. Hotel Ribeira is booked for everyone."),
    ("notes-1", "Meeting notes, design sync. We agreed to ship the cache tier in June. Dana owns the disk format. Eli writes the benchmark. Next sync is Tuesday."),
    ("cal-1", "Event: Dentist. When: Monday 8 am. Where: Smile Clinic. Event: Lunch with Carol. When: Friday noon. Where: Green Cafe."),
];

const QS: &[&str] = &[
    "When is the budget review?",
    "Where is the team offsite?",
    "Who owns the disk format?",
    "When is lunch with Carol?",
    "Where does the budget review happen?",
];

const KV_ONLY: QueryOptions = QueryOptions { use_qa: false, use_kv: true, threshold: 0.85 };
const NONE: QueryOptions = QueryOptions { use_qa: false, use_kv: false, threshold: 0.85 };

fn rag(dir: &std::path::Path, top_k: usize, reuse: ChunkReuse, cap_tokens: Option<usize>) -> Rag {
    let model = Arc::new(Model::load(&common::pycode()).unwrap());
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 256 << 20);
    let mut bank = KnowledgeBank::open(&dir.join("bank"), common::words()).unwrap();
    for (id, text) in DOCS {
        bank.ingest_text(id, DocKind::Text, text).unwrap();
    }
    let cap = cap_tokens.map_or(usize::MAX, |t| t * pool.bytes_per_token());
    let tree = KvTree::new(model.fingerprint, pool.format(), pool.bytes_per_token(), cap);
    let qa = QaBank::open(&dir.join("qa.bank"), 1 << 20).unwrap();
    let config = RagConfig {
        top_k,
        chunk_reuse: reuse,
        params: engram_engine::SamplingParams { max_tokens: 10, ..Default::default() },
        ..RagConfig::default()
    };
    Rag::new(model, pool, bank, qa, tree, config)
}

#[test]
fn ratio_one_answers_equal_cold_answers_and_chunks_are_reused_in_any_order() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rag(tmp.path(), 3, ChunkReuse::Blend { ratio: 1.0 }, None);
    let mut reused = 0;
    for q in QS {
        let warm = r.query(q, &KV_ONLY).unwrap();
        let cold = r.query(q, &NONE).unwrap();
        assert_eq!(warm.tokens, cold.tokens, "{q}: ratio 1 must be the full prefill");
        let b = warm.blend.expect("a blended answer says so");
        assert_eq!(b.recomputed_tokens, b.moved_tokens, "{q}");
        assert_eq!(b.chunks_reused + b.chunks_computed, warm.chunks.len());
        if b.chunks_computed == 0 {
            assert!(warm.timings.cached_tokens > 0, "{q}: every chunk from the store");
        }
        assert!(warm.timings.cached_tokens < warm.timings.prompt_tokens);
        if b.chunks_reused > 0 {
            assert_eq!(warm.cache_level, CacheLevel::Kv);
            reused += 1;
        }
    }
    assert!(reused >= 2, "later queries over known chunks reuse them ({reused})");
    assert!(r.tree.stats().entries == 0, "blend mode leaves the exact tree alone");
}

#[test]
fn a_chunk_where_it_was_computed_needs_no_recomputation_and_equals_the_tree_path() {
    let tmp = tempfile::tempdir().unwrap();
    let mut blend = rag(&tmp.path().join("b"), 1, ChunkReuse::Blend { ratio: 0.15 }, None);
    let mut tree = rag(&tmp.path().join("t"), 1, ChunkReuse::Prefix, None);
    for q in QS {
        for _ in 0..2 {
            let b = blend.query(q, &KV_ONLY).unwrap();
            let t = tree.query(q, &KV_ONLY).unwrap();
            assert_eq!(b.tokens, t.tokens, "{q}");
            let s = b.blend.unwrap();
            assert_eq!((s.moved_tokens, s.recomputed_tokens, s.probed_tokens), (0, 0, 0), "{q}: one chunk, nothing moved");
        }
    }
}

#[test]
fn partial_and_zero_ratios_recompute_their_share_of_moved_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    for ratio in [0.0f32, 0.15, 0.5] {
        let mut r = rag(&tmp.path().join(format!("{ratio}")), 3, ChunkReuse::Blend { ratio }, None);
        for q in QS {
            let a = r.query(q, &KV_ONLY).unwrap();
            let s = a.blend.unwrap();
            assert_eq!(s.recomputed_tokens, (ratio as f64 * s.moved_tokens as f64).ceil() as usize, "{q} at {ratio}");
            let probed = if s.recomputed_tokens > 0 && s.recomputed_tokens < s.moved_tokens { s.moved_tokens } else { 0 };
            assert_eq!(s.probed_tokens, probed);
            assert!(!a.tokens.is_empty());
        }
    }
}

#[test]
fn the_store_stays_under_its_cap_and_forgets_removed_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rag(tmp.path(), 3, ChunkReuse::Blend { ratio: 0.15 }, Some(120));
    for q in QS {
        r.query(q, &KV_ONLY).unwrap();
        let s = r.chunks.stats();
        assert!(s.bytes <= s.cap_bytes, "{} > {}", s.bytes, s.cap_bytes);
    }
    assert!(r.chunks.stats().evicted > 0, "a 120-token cap cannot hold every chunk");

    let mut r = rag(&tmp.path().join("all"), 3, ChunkReuse::Blend { ratio: 0.15 }, None);
    let a = r.query(QS[0], &KV_ONLY).unwrap();
    let before = r.chunks.stats().entries;
    let removed = r.remove("mail-1").unwrap();
    assert!(!removed.is_empty());
    assert!(r.chunks.stats().entries < before || !a.chunks.iter().any(|c| removed.contains(c)));
    let (fp, fmt) = (r.model().fingerprint, r.pool().format());
    let sys = r.build_prompt(QS[0], &[]).unwrap().path[0].clone();
    for c in &removed {
        assert!(!r.chunks.contains(fp, fmt, &sys, &c.0), "{} survived its document's removal", c.0);
    }
}

#[test]
fn another_kv_format_never_hits_and_bad_modes_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let r = rag(tmp.path(), 3, ChunkReuse::Blend { ratio: 0.15 }, None);
    let prompt = r
        .build_prompt(
            QS[0],
            &r.bank.search(QS[0], &r.bank.embed(QS[0]).unwrap(), 3).unwrap().into_iter().map(|x| x.chunk).collect::<Vec<_>>(),
        )
        .unwrap();
    let model = r.model().clone();
    let mut store = ChunkStore::new(model.fingerprint, KvFormat::F32, 4, usize::MAX);
    let f16 = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20);
    for _ in 0..2 {
        let a = store.assemble(&model, &f16, &prompt).unwrap();
        assert_eq!(a.chunks_reused, 0, "an f32 store must not serve f16 KV");
        assert_eq!(a.tokens.len(), a.kv.len());
    }
    assert_eq!(store.stats().entries, 0, "nothing stored for a foreign format");

    assert!(ChunkReuse::parse("blend", 1.5).is_err());
    assert!(ChunkReuse::parse("blend", -0.1).is_err());
    assert!(ChunkReuse::parse("moved", 0.1).is_err());
    assert_eq!(ChunkReuse::parse("prefix", 9.0).unwrap(), ChunkReuse::Prefix);
    assert_eq!(ChunkReuse::parse("blend", 0.3).unwrap(), ChunkReuse::Blend { ratio: 0.3 });
}
