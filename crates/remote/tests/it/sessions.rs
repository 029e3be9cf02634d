//! Sessions and prefix chains through the store: exact round trips in every KV format, runs
//! shared by content, and values that fail a check treated as misses.

use engram_kv::{KvFormat, BLOCK_TOKENS};
use engram_remote::{RemoteConfig, RemoteTier};

use crate::common::*;

fn tier(redis: &Redis) -> RemoteTier {
    let mut c = RemoteConfig::new(redis.url());
    c.run_tokens = 2 * BLOCK_TOKENS;
    RemoteTier::new(c).unwrap()
}

#[test]
fn sessions_round_trip_exactly_in_every_format() {
    if !redis_available() {
        return;
    }
    let redis = Redis::start(&[]);
    for format in KvFormat::ALL {
        let fp = format!("0123456789abcdef-{format}");
        let remote = tier(&redis).for_model(fp);
        let p = pool(format);
        // One conversation's KV: runs are content-addressed, so every session saved here
        // must hold the same KV for the same tokens (as a model computes it).
        let full = make_kv(&p, 5 * BLOCK_TOKENS + 7, 1);
        for n in [5, 2 * BLOCK_TOKENS, 5 * BLOCK_TOKENS + 7] {
            let kv = full.fork(n);
            let (tokens, text, ends) = conversation(n, 3);
            let id = format!("s-{n}");
            remote.save_session(Some("alice"), "alice", &id, Some("alice"), &text, &tokens, &ends, kv.fork(n));
            remote.tier().flush();

            let m = remote.find_manifest(Some("alice"), "alice", Some(&id), &text).expect("the manifest");
            assert_eq!(
                (m.tokens.as_slice(), m.text.as_str(), m.token_ends.as_slice()),
                (tokens.as_slice(), text.as_str(), ends.as_slice())
            );
            let used = p.used();
            let got = remote.fetch_kv(Some("alice"), m.salt.as_deref(), &m.tokens, n, &p, VOCAB).expect("the KV");
            assert_eq!(got.len(), n);
            assert!(rows(&got, n) == rows(&kv, n), "{format}, {n} tokens: rows and window as saved");
            assert!(p.used() > used, "restored blocks are charged to the pool");

            // Part of it (a request that diverges inside a run): exactly that many tokens.
            let part = n * 2 / 3;
            let got = remote.fetch_kv(Some("alice"), m.salt.as_deref(), &m.tokens, part, &p, VOCAB).expect("a part");
            assert_eq!(got.len(), part, "{format}, {n} tokens: cut back to {part}");
            assert!(rows(&got, part).0 == rows(&kv, part).0, "{format}, {part} of {n} tokens");
            // Without an id: the owner's session sharing the most text.
            let longer = format!("{text}and more");
            assert_eq!(remote.find_manifest(Some("alice"), "alice", None, &longer).map(|m| m.session_id), Some(id.clone()));
            // Another owner, tenant or model finds nothing.
            assert!(remote.find_manifest(Some("alice"), "bob", Some(&id), &text).is_none());
            assert!(remote.find_manifest(Some("bob"), "alice", Some(&id), &text).is_none());
            let other = tier(&redis).for_model("fedcba9876543210-f16".into());
            assert!(other.find_manifest(Some("alice"), "alice", Some(&id), &text).is_none());
        }
    }
    let s = tier(&redis).stats();
    assert_eq!(s.bad_values, 0);
}

#[test]
fn runs_are_content_addressed_and_shared() {
    if !redis_available() {
        return;
    }
    let redis = Redis::start(&[]);
    let t = tier(&redis);
    let remote = t.for_model(FP.into());
    let p = pool(KvFormat::F16);
    let n = 6 * BLOCK_TOKENS;
    let kv = make_kv(&p, n, 1);
    let (tokens, text, ends) = conversation(n, 9);
    remote.save_session(Some("t"), "t", "a", Some("t"), &text, &tokens, &ends, kv.fork(n));
    t.flush();
    let runs = redis.keys().iter().filter(|k| k.contains(":run:")).count();
    assert_eq!(runs, 3, "three runs of two blocks");
    // A second session with the same first four blocks writes only its own last run.
    let kv2 = extended(&kv.fork(4 * BLOCK_TOKENS), &make_kv(&p, 2 * BLOCK_TOKENS, 2));
    let mut tokens2 = tokens.clone();
    tokens2[5 * BLOCK_TOKENS] += 1;
    remote.save_session(Some("t"), "t", "b", Some("t"), &text, &tokens2, &ends, kv2.fork(n));
    t.flush();
    assert_eq!(redis.keys().iter().filter(|k| k.contains(":run:")).count(), 4);
    assert_eq!(t.stats().runs_skipped, 2);
    // A prompt that starts with the chain finds its whole runs, without any manifest.
    let mut prompt = tokens[..5 * BLOCK_TOKENS].to_vec();
    prompt.extend([1, 2, 3]);
    let got = remote.fetch_prefix(Some("t"), Some("t"), &prompt, 0, &p, VOCAB).expect("the chain");
    assert_eq!(got.len(), 4 * BLOCK_TOKENS, "whole runs only");
    assert!(rows(&got, got.len()).0 == rows(&kv, 4 * BLOCK_TOKENS).0);
    assert!(
        remote.fetch_prefix(Some("t"), Some("t"), &prompt, 4 * BLOCK_TOKENS, &p, VOCAB).is_none(),
        "nothing beyond what the caller has"
    );
    // Another salt's chain does not reach these runs.
    assert!(remote.fetch_prefix(Some("t"), Some("u"), &prompt, 0, &p, VOCAB).is_none());
}

#[test]
fn damaged_foreign_and_missing_values_are_misses() {
    if !redis_available() {
        return;
    }
    let redis = Redis::start(&[]);
    let t = tier(&redis);
    let remote = t.for_model(FP.into());
    let p = pool(KvFormat::F16);
    let n = 6 * BLOCK_TOKENS;
    let kv = make_kv(&p, n, 5);
    let (tokens, text, ends) = conversation(n, 1);
    remote.save_session(Some("t"), "t", "s", Some("t"), &text, &tokens, &ends, kv.fork(n));
    t.flush();
    let run_keys = |r: &Redis| {
        let mut keys: Vec<String> = r.keys().into_iter().filter(|k| k.contains(":run:")).collect();
        keys.sort();
        keys
    };
    // Which key is the second run: the restore stops just before it once it is damaged.
    let keys = run_keys(&redis);
    assert_eq!(keys.len(), 3);
    let m = remote.find_manifest(Some("t"), "t", Some("s"), &text).unwrap();
    for key in &keys {
        // Flip one byte of the KV in the middle of this run's value.
        let len: usize = redis.cmd(&["STRLEN", key]).unwrap();
        let original: Vec<u8> = redis.cmd(&["GETRANGE", key, &(len / 2).to_string(), &(len / 2).to_string()]).unwrap();
        let flipped = [original[0] ^ 0x10];
        let mut c = redis.client().get_connection().unwrap();
        redis::cmd("SETRANGE").arg(key).arg(len / 2).arg(&flipped[..]).query::<()>(&mut c).unwrap();
        let bad_before = t.stats().bad_values;
        let got = remote.fetch_kv(Some("t"), Some("t"), &m.tokens, n, &p, VOCAB);
        assert_eq!(t.stats().bad_values, bad_before + 1, "a damaged run is counted");
        let got_len = got.as_ref().map_or(0, |k| k.len());
        assert!(got_len < n && got_len % (2 * BLOCK_TOKENS) == 0, "the restore stops before the damaged run");
        if let Some(g) = got {
            assert!(rows(&g, got_len).0 == rows(&kv, got_len).0, "what is restored is exact");
        }
        redis::cmd("SETRANGE").arg(key).arg(len / 2).arg(&original[..]).query::<()>(&mut c).unwrap();
    }
    // A run value moved under another run's key (right bytes, wrong place) is refused.
    let v0: Vec<u8> = redis.cmd(&["GET", &keys[0]]).unwrap();
    let v1: Vec<u8> = redis.cmd(&["GET", &keys[1]]).unwrap();
    let mut c = redis.client().get_connection().unwrap();
    redis::cmd("SET").arg(&keys[0]).arg(&v1).query::<()>(&mut c).unwrap();
    redis::cmd("SET").arg(&keys[1]).arg(&v0).query::<()>(&mut c).unwrap();
    assert!(remote.fetch_kv(Some("t"), Some("t"), &m.tokens, n, &p, VOCAB).is_none());
    // A damaged manifest is a miss; a vanished run shortens the restore.
    let sess: Vec<String> = redis.keys().into_iter().filter(|k| k.contains(":sess:")).collect();
    redis::cmd("SETRANGE").arg(&sess[0]).arg(30).arg("X").query::<()>(&mut c).unwrap();
    let bad = t.stats().bad_values;
    assert!(remote.find_manifest(Some("t"), "t", Some("s"), &text).is_none());
    assert_eq!(t.stats().bad_values, bad + 1);
    redis::cmd("FLUSHALL").query::<()>(&mut c).unwrap();
    assert!(remote.fetch_kv(Some("t"), Some("t"), &m.tokens, n, &p, VOCAB).is_none(), "an evicted key is a miss");
}

/// Two replicas save the same session with different continuations at once: the last manifest
/// wins, and what a third reads is one of them whole, its KV exactly that one's (runs are
/// content-addressed, so neither can lend the other wrong rows).
#[test]
fn concurrent_writers_of_one_session_never_mix() {
    if !redis_available() {
        return;
    }
    let redis = Redis::start(&[]);
    let p = pool(KvFormat::F16);
    let n = 5 * BLOCK_TOKENS + 3;
    let (tokens, text, ends) = conversation(n, 1);
    // The same first 3 blocks (a shared history), then different continuations.
    let common = make_kv(&p, 3 * BLOCK_TOKENS, 1);
    let versions: Vec<(Vec<u32>, engram_kv::SeqKv)> = (0..2u32)
        .map(|v| {
            let kv = extended(&common, &make_kv(&p, n - 3 * BLOCK_TOKENS, 10 + v as u64));
            let mut t = tokens.clone();
            for x in &mut t[3 * BLOCK_TOKENS..] {
                *x = (*x + 1 + v) % VOCAB as u32;
            }
            (t, kv)
        })
        .collect();
    for round in 0..5 {
        let tiers: Vec<RemoteTier> = (0..2).map(|_| tier(&redis)).collect();
        let (text, ends) = (&text, &ends);
        std::thread::scope(|s| {
            for (t, (toks, kv)) in tiers.iter().zip(&versions) {
                s.spawn(move || {
                    t.for_model(FP.into()).save_session(Some("t"), "t", "shared", Some("t"), text, toks, ends, kv.fork(n));
                    t.flush();
                });
            }
        });
        let reader = tier(&redis).for_model(FP.into());
        let m = reader.find_manifest(Some("t"), "t", Some("shared"), text).expect("one manifest");
        let which = versions.iter().position(|(t, _)| *t == m.tokens).expect("the manifest is one writer's, whole");
        let got = reader.fetch_kv(Some("t"), Some("t"), &m.tokens, n, &p, VOCAB).expect("its runs");
        assert_eq!(got.len(), n, "round {round}");
        assert!(rows(&got, n) == rows(&versions[which].1, n), "round {round}: the KV is writer {which}'s exactly");
    }
}

#[test]
fn runs_are_read_as_the_urls_user_on_its_database() {
    if !redis_available() {
        return;
    }
    let redis = Redis::start(&[]);
    redis.cmd::<()>(&["ACL", "SETUSER", "eve", "on", ">pw", "~*", "+@all"]).unwrap();
    redis.cmd::<()>(&["ACL", "SETUSER", "mallory", "on", ">pw", "~nothing:*", "+@all"]).unwrap();
    let at = |user: &str, pass: &str, db: u8| {
        let mut c = RemoteConfig::new(format!("redis://{user}:{pass}@127.0.0.1:{}/{db}", redis.port));
        c.run_tokens = 2 * BLOCK_TOKENS;
        RemoteTier::new(c).unwrap()
    };
    let fp = "0123456789abcdef-f16".to_string();
    let p = pool(KvFormat::F16);
    let n = 5 * BLOCK_TOKENS + 3;
    let kv = make_kv(&p, n, 1);
    let (tokens, text, ends) = conversation(n, 3);
    let eve = at("eve", "pw", 3);
    eve.for_model(fp.clone()).save_session(Some("t"), "t", "s", Some("t"), &text, &tokens, &ends, kv.fork(n));
    eve.flush();
    assert!(redis.keys().is_empty(), "written to database 3, not 0");
    // Read back exactly, as eve on database 3 (the runs through the lean reader).
    let got = eve.for_model(fp.clone()).fetch_kv(Some("t"), Some("t"), &tokens, n, &p, VOCAB).expect("the KV");
    assert!(rows(&got, n) == rows(&kv, n));
    // On database 0 nothing is found; a wrong password and a user the store refuses the keys to
    // are read errors, counted, and the refused link stays usable.
    assert!(at("eve", "pw", 0).for_model(fp.clone()).fetch_kv(Some("t"), Some("t"), &tokens, n, &p, VOCAB).is_none());
    let wrong = at("eve", "nope", 3);
    assert!(wrong.for_model(fp.clone()).fetch_kv(Some("t"), Some("t"), &tokens, n, &p, VOCAB).is_none());
    assert!(wrong.stats().read_errors >= 1);
    let refused = at("mallory", "pw", 3).for_model(fp);
    for round in 1..=2 {
        assert!(refused.fetch_kv(Some("t"), Some("t"), &tokens, n, &p, VOCAB).is_none());
        assert_eq!(refused.tier().stats().read_errors, round, "NOPERM is a read error");
        assert!(refused.tier().stats().connected, "a refusal keeps the connection");
    }
}
