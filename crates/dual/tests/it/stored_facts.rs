//! `FactStore`: append, supersede, tombstone and clear; every refused change
//! leaves memory and the file as they were; logs survive a reopen; damaged, truncated,
//! foreign, other-version and oversized files are moved aside, never half-used.

use engram_dual::{FactError, FactLimits, FactStore};

fn limits() -> FactLimits {
    FactLimits { max_facts: 4, max_text_bytes: 64, max_file_bytes: 1 << 20 }
}

fn bad_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".bad-")).count()
}

#[test]
fn facts_are_appended_superseded_tombstoned_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = FactStore::open(dir.path(), limits());
    let mut seen = Vec::new();
    let a = store.append("t\u{1f}user:ann", "Ann keeps bees.", None, |live| seen.push(live.len())).unwrap();
    let b = store.append("t\u{1f}user:ann", "Ann keeps wasps.", Some(a.id), |live| seen.push(live.len())).unwrap();
    assert_eq!((a.id, b.id, b.replaces), (1, 2, Some(1)));
    assert_eq!(seen, vec![1, 1], "`then` sees the live facts after each change");
    let listed = store.list("t\u{1f}user:ann").unwrap();
    assert!(listed[0].tombstoned && listed[0].replaced_by == Some(2) && !listed[1].tombstoned);
    store.tombstone("t\u{1f}user:ann", 2, |live| assert!(live.is_empty())).unwrap();
    drop(store);

    let store = FactStore::open(dir.path(), limits());
    assert_eq!(store.list("t\u{1f}user:ann").unwrap(), {
        let mut l = listed.clone();
        l[1].tombstoned = true;
        l
    });
    assert!(store.live("t\u{1f}user:ann").is_empty());
    assert_eq!(store.list("t\u{1f}user:bob"), None, "another user has no log");
    store.clear("t\u{1f}user:ann", |_| {}).unwrap();
    assert_eq!(store.list("t\u{1f}user:ann"), None);
    assert_eq!(FactStore::open(dir.path(), limits()).list("t\u{1f}user:ann"), None, "cleared on disk too");
}

#[test]
fn refused_changes_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = FactStore::open(dir.path(), limits());
    let owner = "t\u{1f}user:ann";
    store.append(owner, "one", None, |_| {}).unwrap();
    store.append(owner, "two", Some(1), |_| {}).unwrap();
    let file = store.file(owner).unwrap();
    let (before, bytes) = (store.list(owner), std::fs::read(&file).unwrap());
    let never = |_: &[engram_dual::Fact]| panic!("`then` runs only after a change");
    assert_eq!(store.append(owner, " ", None, never), Err(FactError::Empty));
    assert_eq!(store.append(owner, &"x".repeat(65), None, never), Err(FactError::TooLong { bytes: 65, max: 64 }));
    assert_eq!(store.append(owner, "three", Some(9), never), Err(FactError::UnknownFact(9)));
    assert_eq!(store.append(owner, "three", Some(1), never), Err(FactError::Tombstoned(1)));
    assert_eq!(store.tombstone(owner, 1, never), Err(FactError::Tombstoned(1)));
    assert_eq!(store.tombstone("t\u{1f}user:nobody", 1, never), Err(FactError::UnknownOwner));
    assert_eq!(store.clear("t\u{1f}user:nobody", never), Err(FactError::UnknownOwner));
    assert_eq!(store.append("t\u{1f}user:nobody", "x", Some(1), never), Err(FactError::UnknownFact(1)));
    assert_eq!(store.list("t\u{1f}user:nobody"), None, "a refused first fact creates no log");
    store.append(owner, "three", None, |_| {}).unwrap();
    store.append(owner, "four", None, |_| {}).unwrap();
    let full = (store.list(owner), std::fs::read(&file).unwrap());
    assert_eq!(store.append(owner, "five", None, never), Err(FactError::Full { max: 4 }));
    assert_eq!((store.list(owner), std::fs::read(&file).unwrap()), full);
    assert_ne!(before, full.0);
    assert_ne!(bytes, full.1);
}

#[test]
fn untrusted_files_are_moved_aside() {
    let owner = "t\u{1f}user:ann";
    let damage: Vec<(&str, Box<dyn Fn(Vec<u8>) -> Vec<u8>>)> = vec![
        ("truncated", Box::new(|b: Vec<u8>| b[..b.len() - 5].to_vec())),
        (
            "bit flip",
            Box::new(|mut b: Vec<u8>| {
                let n = b.len() - 3;
                b[n] ^= 1;
                b
            }),
        ),
        ("foreign", Box::new(|_| b"{\"hello\": 1}".to_vec())),
        ("other version", Box::new(|b: Vec<u8>| String::from_utf8(b).unwrap().replacen(" v1 ", " v9 ", 1).into_bytes())),
        ("empty", Box::new(|_| Vec::new())),
    ];
    for (what, f) in damage {
        let dir = tempfile::tempdir().unwrap();
        let store = FactStore::open(dir.path(), limits());
        store.append(owner, "Ann keeps bees.", None, |_| {}).unwrap();
        let file = store.file(owner).unwrap();
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, f(bytes)).unwrap();
        let store = FactStore::open(dir.path(), limits());
        assert_eq!(store.list(owner), None, "{what}: not used");
        assert_eq!(bad_files(dir.path()), 1, "{what}: moved aside, kept");
        assert!(!file.exists(), "{what}");
    }
    // Another owner's file at this owner's name (a copied file) is foreign too.
    let dir = tempfile::tempdir().unwrap();
    let store = FactStore::open(dir.path(), limits());
    store.append("t\u{1f}user:bob", "Bob keeps goats.", None, |_| {}).unwrap();
    std::fs::copy(store.file("t\u{1f}user:bob").unwrap(), store.file(owner).unwrap()).unwrap();
    let store = FactStore::open(dir.path(), limits());
    assert_eq!(store.list(owner), None);
    assert_eq!(store.list("t\u{1f}user:bob").unwrap().len(), 1);
    // Over the size limit: not even read.
    let small = FactLimits { max_file_bytes: 16, ..limits() };
    let store = FactStore::open(dir.path(), small);
    assert_eq!(store.list("t\u{1f}user:bob"), None);
}

#[test]
fn another_replicas_newer_log_is_imported_and_an_older_one_is_not() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (FactStore::open(da.path(), limits()), FactStore::open(db.path(), limits()));
    let ann = "t\u{1f}user:ann";
    assert_eq!(a.export(ann), None, "nothing known of a user without facts");
    a.append(ann, "Ann keeps bees.", None, |_| {}).unwrap();
    let v1 = a.export(ann).unwrap();
    assert!(v1.stamp > 0 && v1.facts.len() == 1);
    let mut seen = Vec::new();
    assert!(b.import(ann, v1.clone(), |live| seen.push(live.len())).unwrap());
    assert_eq!((b.list(ann).unwrap(), seen), (a.list(ann).unwrap(), vec![1]));
    assert!(!b.import(ann, v1.clone(), |_| panic!("the same version changes nothing")).unwrap());
    // A change on B after the import stamps past A's version: A takes it, and B ignores A's old one.
    b.append(ann, "Ann keeps wasps.", Some(1), |_| {}).unwrap();
    let v2 = b.export(ann).unwrap();
    assert!(v2.stamp > v1.stamp);
    assert!(!b.import(ann, v1.clone(), |_| {}).unwrap(), "an older version is not imported");
    assert!(a.import(ann, v2.clone(), |live| assert_eq!(live.len(), 1)).unwrap());
    assert_eq!(a.live(ann)[0].text, "Ann keeps wasps.");
    // Imported logs are saved: a reopened store has them.
    assert_eq!(FactStore::open(da.path(), limits()).export(ann), Some(v2.clone()));
    // Forgetting is a version too: exported as no facts, imported as a clear, never undone by
    // an older version.
    a.clear(ann, |_| {}).unwrap();
    let gone = a.export(ann).unwrap();
    assert!(gone.facts.is_empty() && gone.stamp > v2.stamp);
    assert!(!a.import(ann, v2.clone(), |_| {}).unwrap());
    assert!(b.import(ann, gone, |live| assert!(live.is_empty())).unwrap());
    assert_eq!(b.list(ann), None);
    assert_eq!(FactStore::open(db.path(), limits()).list(ann), None, "cleared on disk too");
    // A log that breaks the limits changes nothing.
    let mut big = v2.clone();
    big.stamp = u64::MAX;
    big.facts = (1..=5).map(|i| engram_dual::Fact { id: i, ..v2.facts[0].clone() }).collect();
    big.next_id = 5;
    assert!(b.import(ann, big, |_| panic!("refused")).is_err());
    assert_eq!(b.list(ann), None);
}
