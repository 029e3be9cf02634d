//! The chunk store on disk (pycode-7m, f16 KV; blend reuse at the default 15%): a store saved and
//! loaded into a fresh pipeline answers exactly as before the restart, every chunk from the
//! files; bit-flipped, truncated, non-entry and renamed files are refused and deleted, a file of
//! another KV format refused and kept — each a miss whose chunk is computed again (the same
//! answers), never wrong KV; evicted chunks' files go at the next save.

use crate::common;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_rag::{tree_dir, ChunkReuse, DocKind, KnowledgeBank, KvTree, QaBank, QueryOptions, Rag, RagConfig};

const DOCS: &[(&str, &str)] = &[
    ("mail-1", "From: Alice. Subject: Budget review. The budget review moved to Thursday at 3 pm in room Fjord. Bring the Q1 forecast."),
    (
        "notes-1",
        "Meeting notes, design sync. We agreed to ship the cache tier in June. Dana owns the disk format. Eli writes the benchmark.",
    ),
    ("cal-1", "Event: Dentist. When: Monday 8 am. Where: Smile Clinic. Event: Lunch with Carol. When: Friday noon."),
];
const QS: &[&str] = &["When is the budget review?", "Who owns the disk format?", "When is lunch with Carol?"];
const KV_ONLY: QueryOptions = QueryOptions { use_qa: false, use_kv: true, threshold: 0.85 };

fn model() -> Arc<Model> {
    Arc::new(Model::load(&common::pycode()).unwrap())
}

/// A blend pipeline over DOCS, KV in `format`, chunk store within `cap_tokens` (None: no cap).
fn rag(dir: &Path, model: Arc<Model>, format: KvFormat, cap_tokens: Option<usize>) -> Rag {
    let pool = KvPool::new(KvLayout::of(&model.config), format, 256 << 20);
    let mut bank = KnowledgeBank::open(&dir.join("bank"), common::words()).unwrap();
    for (id, text) in DOCS {
        bank.ingest_text(id, DocKind::Text, text).unwrap();
    }
    let cap = cap_tokens.map_or(usize::MAX, |t| t * pool.bytes_per_token());
    let tree = KvTree::new(model.fingerprint, pool.format(), pool.bytes_per_token(), cap);
    let config = RagConfig {
        top_k: 2,
        chunk_reuse: ChunkReuse::Blend { ratio: 0.15 },
        params: engram_engine::SamplingParams { max_tokens: 8, ..Default::default() },
        ..RagConfig::default()
    };
    Rag::new(model, pool, bank, QaBank::in_memory(1 << 20), tree, config)
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut f: Vec<PathBuf> = std::fs::read_dir(dir).map(|r| r.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
    f.sort();
    f
}

/// Answers and chunks computed (not from the store) per question.
fn ask(r: &mut Rag) -> Vec<(Vec<u32>, usize)> {
    QS.iter()
        .map(|q| {
            let a = r.query(q, &KV_ONLY).unwrap();
            (a.tokens, a.blend.expect("blended").chunks_computed)
        })
        .collect()
}

#[test]
fn a_saved_store_answers_after_a_restart_as_before_it() {
    let tmp = tempfile::tempdir().unwrap();
    let m = model();
    let mut r = rag(tmp.path(), m.clone(), KvFormat::F16, None);
    let before = ask(&mut r);
    let dir = tree_dir(&tmp.path().join("chunks"), m.fingerprint, KvFormat::F16);
    let written = r.chunks.save(&dir).unwrap();
    assert_eq!(written, r.chunks.stats().entries);
    assert_eq!(files(&dir).len(), written);
    assert_eq!(r.chunks.save(&dir).unwrap(), 0, "nothing new to write");

    let mut again = rag(tmp.path(), model(), KvFormat::F16, None);
    let pool = again.pool().clone();
    let report = again.chunks.load(&dir, &pool, m.config.vocab);
    assert_eq!(report.loaded, written, "{:?}", report.rejected);
    let after = ask(&mut again);
    for ((q, b), a) in QS.iter().zip(&before).zip(&after) {
        assert_eq!(a.0, b.0, "{q}: the answer changed across the restart");
        assert_eq!(a.1, 0, "{q}: every chunk came from the files");
    }
}

#[test]
fn damaged_and_foreign_files_are_refused_and_their_chunks_recomputed() {
    let tmp = tempfile::tempdir().unwrap();
    let m = model();
    let mut r = rag(tmp.path(), m.clone(), KvFormat::F16, None);
    let before = ask(&mut r);
    let dir = tree_dir(&tmp.path().join("chunks"), m.fingerprint, KvFormat::F16);
    r.chunks.save(&dir).unwrap();
    let saved = files(&dir);
    assert!(saved.len() >= 3, "{saved:?}");
    // A bit flipped in the KV, a truncated file, a renamed one.
    let mut b = std::fs::read(&saved[0]).unwrap();
    let n = b.len();
    b[n - 64] ^= 0x10;
    std::fs::write(&saved[0], &b).unwrap();
    let b = std::fs::read(&saved[1]).unwrap();
    std::fs::write(&saved[1], &b[..b.len() / 2]).unwrap();
    let renamed = dir.join("chunk-00000000000000000000000000000000.kv");
    std::fs::rename(&saved[2], &renamed).unwrap();
    // Not an entry at all; and a sound entry of another KV format (f32) put in this folder.
    let junk = dir.join("chunk-ffffffffffffffffffffffffffffffff.kv");
    std::fs::write(&junk, b"not a cache entry").unwrap();
    let mut other = rag(&tmp.path().join("f32"), m.clone(), KvFormat::F32, None);
    other.query(QS[0], &KV_ONLY).unwrap();
    let other_dir = tree_dir(&tmp.path().join("f32"), m.fingerprint, KvFormat::F32);
    other.chunks.save(&other_dir).unwrap();
    let foreign_src = files(&other_dir).pop().unwrap();
    let foreign = dir.join(foreign_src.file_name().unwrap());
    std::fs::copy(&foreign_src, &foreign).unwrap();

    let mut again = rag(tmp.path(), model(), KvFormat::F16, None);
    let pool = again.pool().clone();
    let report = again.chunks.load(&dir, &pool, m.config.vocab);
    let refused: Vec<&PathBuf> = report.rejected.iter().map(|(f, _)| f).collect();
    for f in [&saved[0], &saved[1], &renamed, &junk, &foreign] {
        assert!(refused.contains(&f), "{} was not refused: {:?}", f.display(), report.rejected);
    }
    for f in [&saved[0], &saved[1], &renamed, &junk] {
        assert!(!f.exists(), "{} should be deleted", f.display());
    }
    assert!(foreign.exists(), "another format's sound file is kept");
    assert!(report.rejected.iter().any(|(f, why)| f == &foreign && why.contains("fingerprint")), "{:?}", report.rejected);
    assert_eq!(report.loaded, saved.len() - 3);
    let after = ask(&mut again);
    let computed: usize = after.iter().map(|a| a.1).sum();
    assert!(computed >= 3, "the refused chunks were computed again");
    for ((q, b), a) in QS.iter().zip(&before).zip(&after) {
        assert_eq!(a.0, b.0, "{q}: a refused file changed an answer");
    }
}

#[test]
fn files_of_evicted_chunks_go_at_the_next_save() {
    let tmp = tempfile::tempdir().unwrap();
    let m = model();
    // Room for the system prompt and about one chunk.
    let mut r = rag(tmp.path(), m.clone(), KvFormat::F16, Some(120));
    let dir = tree_dir(&tmp.path().join("chunks"), m.fingerprint, KvFormat::F16);
    for q in QS {
        r.query(q, &KV_ONLY).unwrap();
        r.chunks.save(&dir).unwrap();
        let s = r.chunks.stats();
        assert!(s.bytes <= s.cap_bytes);
        assert!(files(&dir).len() <= s.entries, "{} files for {} entries", files(&dir).len(), s.entries);
    }
    assert!(r.chunks.stats().evicted > 0);
}
