//! The chunk KV tree on disk (pycode-7m, f16 KV): a tree saved and loaded into a fresh process
//! state answers exactly as a cold prefill; damaged, truncated, mis-described and foreign files
//! are refused (damaged ones deleted, foreign ones kept) and the answer is computed cold.

use crate::common;
use std::path::Path;
use std::sync::Arc;

use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_rag::{tree_dir, CacheLevel, DocKind, KnowledgeBank, KvTree, QaBank, QueryOptions, Rag, RagConfig};

const DOCS: &[(&str, &str)] = &[
    ("mail-1", "From: Alice. Subject: Budget review. The budget review moved to Thursday at 3 pm in room Fjord. Bring the Q1 forecast."),
    (
        "notes-1",
        "Meeting notes, design sync. We agreed to ship the cache tier in June. Dana owns the disk format. Eli writes the benchmark.",
    ),
    ("cal-1", "Event: Dentist. When: Monday 8 am. Where: Smile Clinic. Event: Lunch with Carol. When: Friday noon."),
];

const KV_ONLY: QueryOptions = QueryOptions { use_qa: false, use_kv: true, threshold: 0.85 };
const NONE: QueryOptions = QueryOptions { use_qa: false, use_kv: false, threshold: 0.85 };
const Q: &str = "When is the budget review?";

fn model() -> Arc<Model> {
    Arc::new(Model::load(&common::pycode()).unwrap())
}

/// A pipeline over DOCS with an empty tree, KV in `format`.
fn rag(dir: &Path, model: Arc<Model>, format: KvFormat) -> Rag {
    let pool = KvPool::new(KvLayout::of(&model.config), format, 256 << 20);
    let mut bank = KnowledgeBank::open(&dir.join("bank"), common::words()).unwrap();
    for (id, text) in DOCS {
        bank.ingest_text(id, DocKind::Text, text).unwrap();
    }
    let tree = KvTree::new(model.fingerprint, pool.format(), pool.bytes_per_token(), usize::MAX);
    let qa = QaBank::in_memory(1 << 20);
    let mut config = RagConfig::default();
    config.top_k = 2;
    config.params.max_tokens = 10;
    Rag::new(model, pool, bank, qa, tree, config)
}

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir).map(|r| r.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_saved_tree_loaded_again_answers_as_a_cold_prefill() {
    let tmp = tempfile::tempdir().unwrap();
    let m = model();
    let mut first = rag(tmp.path(), m.clone(), KvFormat::F16);
    let dir = tree_dir(&tmp.path().join("kvtree"), m.fingerprint, KvFormat::F16);
    let cold = first.query(Q, &NONE).unwrap();
    first.query(Q, &KV_ONLY).unwrap();
    assert_eq!(first.tree.save(&dir).unwrap(), 1, "one leaf: (system, chunk, chunk)");
    assert_eq!(first.tree.save(&dir).unwrap(), 0, "nothing new to write");
    drop(first);

    let mut second = rag(tmp.path(), m.clone(), KvFormat::F16);
    let pool = second.pool().clone();
    let report = second.tree.load(&dir, &pool, m.config.vocab);
    assert_eq!((report.loaded, report.rejected.len()), (1, 0), "{report:?}");
    assert_eq!(second.tree.stats().entries, 3, "every prefix of the leaf's path is back");
    let warm = second.query(Q, &KV_ONLY).unwrap();
    assert_eq!(warm.cache_level, CacheLevel::Kv);
    assert!(warm.timings.cached_tokens > 0);
    assert_eq!(warm.tokens, cold.tokens, "restored KV changed the answer");

    // Removing a document forgets its paths; the next save deletes their file (and writes the
    // system prompt's entry, now a leaf).
    let before = files(&dir);
    second.remove(&warm.sources[0]).unwrap();
    second.tree.save(&dir).unwrap();
    let after = files(&dir);
    assert!(before.iter().all(|f| !after.contains(f)), "{before:?} {after:?}");
    assert_eq!(after.len(), 1);
}

#[test]
fn damaged_truncated_and_foreign_files_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let m = model();
    let dir = tree_dir(&tmp.path().join("kvtree"), m.fingerprint, KvFormat::F16);
    let mut r = rag(tmp.path(), m.clone(), KvFormat::F16);
    let cold = r.query(Q, &NONE).unwrap();
    r.query(Q, &KV_ONLY).unwrap();
    r.tree.save(&dir).unwrap();
    let good = files(&dir).pop().unwrap();
    let bytes = std::fs::read(&good).unwrap();
    // A foreign file: the same question's tree in f32 KV, copied into the f16 folder.
    let mut f32_rag = rag(&tmp.path().join("f32"), m.clone(), KvFormat::F32);
    f32_rag.query(Q, &KV_ONLY).unwrap();
    let f32_dir = tree_dir(&tmp.path().join("f32-tree"), m.fingerprint, KvFormat::F32);
    f32_rag.tree.save(&f32_dir).unwrap();
    let foreign = files(&f32_dir).pop().unwrap();
    drop(f32_rag);

    let n = bytes.len();
    let mut flipped = bytes.clone();
    flipped[n - 64] ^= 0x10;
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("bit flipped", flipped, true),
        ("truncated", bytes[..n / 2].to_vec(), true),
        ("empty", Vec::new(), true),
        ("not an entry", b"hello, this is not a KV file at all".to_vec(), true),
        ("another KV format", std::fs::read(&foreign).unwrap(), false),
    ];
    for (what, content, deleted) in cases {
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(good.file_name().unwrap());
        std::fs::write(&path, &content).unwrap();
        let mut fresh = rag(&tmp.path().join(what), m.clone(), KvFormat::F16);
        let pool = fresh.pool().clone();
        let report = fresh.tree.load(&dir, &pool, m.config.vocab);
        assert_eq!((report.loaded, report.rejected.len()), (0, 1), "{what}: {report:?}");
        assert_eq!(path.exists(), !deleted, "{what}: damaged files are deleted, foreign ones kept");
        assert_eq!(fresh.tree.stats().entries, 0, "{what}");
        let again = fresh.query(Q, &KV_ONLY).unwrap();
        assert_eq!(again.cache_level, CacheLevel::None, "{what}");
        assert_eq!(again.tokens, cold.tokens, "{what}");
    }

    // A sound file renamed to another leaf's name (its name no longer matches its path and
    // tokens) is refused too.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tree-00000000000000000000000000000000.kv"), &bytes).unwrap();
    let mut fresh = rag(&tmp.path().join("renamed"), m.clone(), KvFormat::F16);
    let pool = fresh.pool().clone();
    let report = fresh.tree.load(&dir, &pool, m.config.vocab);
    assert_eq!((report.loaded, report.rejected.len()), (0, 1), "{report:?}");
}
