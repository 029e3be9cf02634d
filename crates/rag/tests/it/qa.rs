//! The QA bank: threshold hits, LFU eviction under its byte cap, refresh on new or removed
//! chunks, and its file's checks.

use crate::common;
use common::words;
use engram_rag::{DocKind, KnowledgeBank, QaBank, RagError};

fn unit(i: usize, dim: usize) -> Vec<f32> {
    let mut v = vec![0.0; dim];
    v[i] = 1.0;
    v
}

#[test]
fn a_query_past_the_threshold_gets_the_stored_answer() {
    let mut qa = QaBank::in_memory(1 << 20);
    qa.insert("when is lunch", unit(0, 8), "noon", vec![1, 2], vec![], vec!["cal".into()], 1);
    let hit = qa.lookup(&unit(0, 8), 0.85).expect("the same vector");
    assert_eq!((hit.entry.answer.as_str(), hit.entry.hits), ("noon", 1));
    assert!((hit.similarity - 1.0).abs() < 1e-6);
    let mut near = unit(0, 8);
    near[1] = 0.5; // cosine 0.894
    assert!(qa.lookup(&near, 0.85).is_some());
    assert!(qa.lookup(&near, 0.9).is_none(), "the threshold is per request");
    assert!(qa.lookup(&unit(1, 8), 0.85).is_none());
}

#[test]
fn lfu_eviction_keeps_the_bank_under_its_cap() {
    let probe = {
        let mut qa = QaBank::in_memory(usize::MAX);
        qa.insert("q0", unit(0, 8), "a", vec![], vec![], vec![], 0);
        qa.entries()[0].bytes()
    };
    let mut qa = QaBank::in_memory(3 * probe);
    for i in 0..3 {
        qa.insert(&format!("q{i}"), unit(i, 8), "a", vec![], vec![], vec![], 0);
    }
    qa.lookup(&unit(0, 8), 0.9).unwrap();
    qa.lookup(&unit(2, 8), 0.9).unwrap();
    qa.lookup(&unit(2, 8), 0.9).unwrap();
    qa.insert("q3", unit(3, 8), "a", vec![], vec![], vec![], 0);
    let left: Vec<&str> = qa.entries().iter().map(|e| e.query.as_str()).collect();
    assert_eq!(left, ["q0", "q2", "q3"], "q1 had no hits");
    // Among equal hits (q3: 0 hits, newest) the least recently used goes first.
    qa.insert("q4", unit(4, 8), "a", vec![], vec![], vec![], 0);
    let left: Vec<&str> = qa.entries().iter().map(|e| e.query.as_str()).collect();
    assert_eq!(left, ["q0", "q2", "q4"]);
    assert!(qa.stats().bytes <= 3 * probe && qa.stats().evicted == 2);
}

#[test]
fn refresh_drops_answers_whose_retrieval_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bank = KnowledgeBank::open(&tmp.path().join("bank"), words()).unwrap();
    bank.ingest_text("car", DocKind::Text, "The car service is on Friday at the Main Street garage.").unwrap();
    bank.ingest_text("dentist", DocKind::Text, "Dentist appointment on Monday at eight with Dr. Osei.").unwrap();
    bank.ingest_text("garden", DocKind::Text, "Water the tomatoes every morning.").unwrap();
    let mut qa = QaBank::in_memory(1 << 20);
    let k = 1;
    for q in ["When is the car service?", "When is the dentist appointment?"] {
        let v = bank.embed(q).unwrap();
        let r = bank.search(q, &v, k).unwrap();
        qa.insert(q, v, "answer", vec![], r.iter().map(|r| r.chunk.clone()).collect(), vec![], bank.generation());
    }
    // A new document that becomes the car question's top-1, and not the dentist's.
    let rep =
        bank.ingest_text("car-2", DocKind::Text, "Car service moved: the car service is now on Saturday, car garage Main Street.").unwrap();
    let dropped = qa.refresh(&bank, &rep.chunks_added, k).unwrap();
    assert_eq!(dropped.len(), 1);
    assert_eq!(qa.entries().iter().map(|e| e.query.as_str()).collect::<Vec<_>>(), ["When is the dentist appointment?"]);
    assert_eq!(qa.stale(), ["When is the car service?"]);
    // Removing a source drops its answers too.
    let gone = bank.remove("dentist").unwrap();
    assert!(!gone.is_empty());
    qa.refresh(&bank, &[], k).unwrap();
    assert!(qa.entries().is_empty());
    assert_eq!(qa.stats().invalidated, 2);
}

/// Refresh also drops an answer whose sources are no longer the first chunks of its query's
/// top-k in order, though no chunk was added or removed: BM25's statistics move with every
/// document, so old chunks change places. An answer whose sources still lead is kept.
#[test]
fn refresh_drops_answers_whose_sources_no_longer_lead_the_retrieval() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bank = KnowledgeBank::open(&tmp.path().join("bank"), words()).unwrap();
    bank.ingest_text("car", DocKind::Text, "The car service is on Friday at the Main Street garage.").unwrap();
    bank.ingest_text("dentist", DocKind::Text, "Dentist appointment on Monday at eight with Dr. Osei.").unwrap();
    let mut qa = QaBank::in_memory(1 << 20);
    let k = 2;
    let q = "When is the car service?";
    let v = bank.embed(q).unwrap();
    let now: Vec<_> = bank.search(q, &v, k).unwrap().into_iter().map(|r| r.chunk).collect();
    assert_eq!(now.len(), 2);
    qa.insert(q, v.clone(), "kept", vec![], now.clone(), vec![], bank.generation());
    let swapped = vec![now[1].clone(), now[0].clone()];
    qa.insert("the same question, stored in another order", v, "dropped", vec![], swapped, vec![], bank.generation());
    let dropped = qa.refresh(&bank, &[], k).unwrap();
    assert_eq!(dropped.len(), 1);
    assert_eq!(qa.entries().iter().map(|e| e.answer.as_str()).collect::<Vec<_>>(), ["kept"]);
    assert_eq!(qa.stale(), ["the same question, stored in another order"]);
}

#[test]
fn the_file_round_trips_and_damage_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("qa.bank");
    let mut qa = QaBank::open(&path, 1 << 20).unwrap();
    qa.insert("q", unit(0, 4), "a", vec![7], vec![], vec!["d".into()], 3);
    qa.lookup(&unit(0, 4), 0.9).unwrap();
    qa.save().unwrap();
    let again = QaBank::open(&path, 1 << 20).unwrap();
    assert_eq!(again.entries(), qa.entries());
    let good = std::fs::read(&path).unwrap();
    for (name, bytes) in [("truncated", good[..good.len() / 2].to_vec()), ("foreign", b"engram-rag-bank v1 2 x\n{}".to_vec())] {
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(QaBank::open(&path, 1 << 20), Err(RagError::BadStore { .. })), "{name}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }
}
