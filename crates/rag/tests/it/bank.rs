//! The knowledge bank on disk: ingest, hybrid search, replacement on re-ingest, removal, and
//! the store's refusals — bad inputs and unknown ids change nothing; damaged, truncated and
//! foreign manifests are errors; an index out of step with the manifest (a crash between the
//! two commits, a damaged folder) is rebuilt from the manifest.

use crate::common;
use common::{snapshot, words, write, EMAIL, ICS};
use engram_rag::{DocKind, KnowledgeBank, RagError, MANIFEST_FILE};

fn search(bank: &KnowledgeBank, q: &str, k: usize) -> Vec<String> {
    let v = bank.embed(q).unwrap();
    bank.search(q, &v, k).unwrap().into_iter().map(|r| bank.chunk(&r.chunk).unwrap().text.clone()).collect()
}

#[test]
fn ingested_files_are_found_and_reopened_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, docs) = (tmp.path().join("bank"), tmp.path().join("docs"));
    std::fs::create_dir_all(&docs).unwrap();
    let mut bank = KnowledgeBank::open(&store, words()).unwrap();
    bank.ingest_file(&write(&docs, "mail.eml", EMAIL)).unwrap();
    bank.ingest_file(&write(&docs, "cal.ics", ICS)).unwrap();
    bank.ingest_file(&write(&docs, "notes.md", "# Garden\n\nThe tomatoes need water every morning.\n")).unwrap();
    assert_eq!(bank.docs().len(), 3);
    let top = search(&bank, "tomatoes water", 1);
    assert!(top[0].contains("tomatoes"), "{top:?}");
    let top = search(&bank, "lunch Green Cafe Carol", 1);
    assert!(top[0].contains("Green Cafe"), "{top:?}");
    let before = search(&bank, "budget forecast", 3);
    let generation = bank.generation();
    drop(bank);
    let bank = KnowledgeBank::open(&store, words()).unwrap();
    assert!(!bank.index_was_rebuilt());
    assert_eq!(bank.generation(), generation);
    assert_eq!(search(&bank, "budget forecast", 3), before);
}

#[test]
fn re_ingesting_a_changed_file_replaces_its_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bank = KnowledgeBank::open(&tmp.path().join("bank"), words()).unwrap();
    let p = write(tmp.path(), "plan.txt", "The offsite is in Porto. Flights leave at noon.");
    let first = bank.ingest_file(&p).unwrap();
    assert!(!first.unchanged && first.chunks_added.len() == 1);
    assert!(bank.ingest_file(&p).unwrap().unchanged, "same text: nothing to do");
    write(tmp.path(), "plan.txt", "The offsite moved to Madrid. Flights leave at nine.");
    let second = bank.ingest_file(&p).unwrap();
    assert_eq!(second.chunks_removed, first.chunks_added);
    assert!(!bank.has_chunk(&first.chunks_added[0]));
    assert_eq!(bank.docs().len(), 1);
    let all = search(&bank, "offsite Porto Madrid flights", 10);
    assert_eq!(all, vec!["The offsite moved to Madrid. Flights leave at nine.".to_string()], "the old text is gone from both rankings");
}

#[test]
fn bad_inputs_and_unknown_ids_change_nothing_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("bank");
    let mut bank = KnowledgeBank::open(&store, words()).unwrap();
    bank.ingest_text("note-1", DocKind::Text, "Dentist on Monday at eight.").unwrap();
    let before = snapshot(&store);
    let g = bank.generation();
    let bin = tmp.path().join("photo.txt");
    std::fs::write(&bin, b"\x89PNG\r\n\x1a\n\x00\x00\x00").unwrap();
    assert!(matches!(bank.ingest_file(&bin), Err(RagError::BadInput { .. })));
    assert!(matches!(bank.ingest_text("note-2", DocKind::Text, "  \n "), Err(RagError::BadInput { .. })));
    assert!(matches!(bank.ingest_text("", DocKind::Text, "text"), Err(RagError::BadInput { .. })));
    assert!(matches!(bank.remove("no-such-doc"), Err(RagError::UnknownId(_))));
    assert!(bank.ingest_file(&tmp.path().join("missing.txt")).is_err());
    assert_eq!(bank.generation(), g);
    assert_eq!(snapshot(&store), before, "no store file changed");
    bank.remove("note-1").unwrap();
    assert!(bank.docs().is_empty() && search(&bank, "dentist", 5).is_empty());
}

#[test]
fn damaged_truncated_foreign_and_other_encoder_manifests_are_refused_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("bank");
    let mut bank = KnowledgeBank::open(&store, words()).unwrap();
    bank.ingest_text("n", DocKind::Text, "Pay the electricity bill by the 20th.").unwrap();
    drop(bank);
    let path = store.join(MANIFEST_FILE);
    let good = std::fs::read(&path).unwrap();
    let mut flipped = good.clone();
    let i = flipped.len() - 10;
    flipped[i] ^= 0x20;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bit flip", flipped, "checksum"),
        ("truncated", good[..good.len() - 7].to_vec(), "truncated"),
        ("header only", good[..good.iter().position(|&b| b == b'\n').unwrap()].to_vec(), "no header"),
        ("foreign", b"{\"docs\": {}}\n".to_vec(), "not a engram-rag-bank file"),
        ("empty", Vec::new(), "no header"),
        ("other version", String::from_utf8_lossy(&good).replacen(" v1 ", " v9 ", 1).into_bytes(), "format v9"),
    ];
    for (name, bytes, why) in cases {
        std::fs::write(&path, &bytes).unwrap();
        match KnowledgeBank::open(&store, words()) {
            Err(RagError::BadStore { why: w, .. }) => assert!(w.contains(why), "{name}: {w:?} should say {why:?}"),
            Err(e) => panic!("{name}: wrong error {e}"),
            Ok(_) => panic!("{name}: a bad manifest was accepted"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}: the file is left for inspection");
    }
    std::fs::write(&path, &good).unwrap();
    #[derive(Debug)]
    struct Other;
    impl engram_embed::TextEncoder for Other {
        fn id(&self) -> &str {
            "other"
        }
        fn dim(&self) -> usize {
            64
        }
        fn describe(&self) -> String {
            String::new()
        }
        fn encode(&self, t: &[String]) -> engram_embed::Result<engram_embed::Embeddings> {
            common::Words.encode(t)
        }
    }
    match KnowledgeBank::open(&store, std::sync::Arc::new(Other)) {
        Err(RagError::BadStore { why, .. }) => assert!(why.contains("encoder test-words"), "{why}"),
        _ => panic!("vectors of another encoder must not be mixed"),
    }
    assert!(KnowledgeBank::open(&store, words()).is_ok());
}

#[test]
fn an_index_out_of_step_with_the_manifest_is_rebuilt_from_it() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("bank");
    let mut bank = KnowledgeBank::open(&store, words()).unwrap();
    bank.ingest_text("a", DocKind::Text, "The car is booked for its service on Friday.").unwrap();
    let old_manifest = std::fs::read(store.join(MANIFEST_FILE)).unwrap();
    bank.ingest_text("b", DocKind::Text, "The car needs new winter tyres before December.").unwrap();
    drop(bank);
    // A crash after the index's commit, before the manifest's rename: the old manifest.
    std::fs::write(store.join(MANIFEST_FILE), &old_manifest).unwrap();
    let bank = KnowledgeBank::open(&store, words()).unwrap();
    assert!(bank.index_was_rebuilt());
    assert_eq!(search(&bank, "car tyres winter", 5), vec!["The car is booked for its service on Friday.".to_string()]);
    drop(bank);
    // A damaged index folder: every file garbled.
    for e in std::fs::read_dir(store.join("bm25")).unwrap().flatten() {
        std::fs::write(e.path(), b"garbage").unwrap();
    }
    let bank = KnowledgeBank::open(&store, words()).unwrap();
    assert!(bank.index_was_rebuilt());
    assert_eq!(search(&bank, "car service", 5).len(), 1);
    drop(bank);
    std::fs::remove_dir_all(store.join("bm25")).unwrap();
    assert!(KnowledgeBank::open(&store, words()).unwrap().index_was_rebuilt());
}

#[test]
fn hybrid_retrieval_with_the_real_encoder_finds_paraphrases() {
    let Some(enc) = common::real() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut bank = KnowledgeBank::open(&tmp.path().join("bank"), enc).unwrap();
    bank.ingest_text("dentist", DocKind::Text, "Reminder: your dental check-up is on Monday at 8 am with Dr. Osei.").unwrap();
    bank.ingest_text("garden", DocKind::Text, "The tomatoes need water every morning during the heat wave.").unwrap();
    bank.ingest_text("flight", DocKind::Text, "Your flight to Lisbon departs from gate B12 at 14:05.").unwrap();
    // No word in common with the dentist note except "Monday": cosine carries it.
    let q = "When do I see the tooth doctor?";
    let v = bank.embed(q).unwrap();
    let r = bank.search(q, &v, 3).unwrap();
    assert_eq!(r[0].doc, "dentist", "{r:?}");
    assert!(r[0].dense_rank == Some(1));
}
