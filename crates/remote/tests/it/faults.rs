//! Faults: the store down at start, killed mid-run, restarted empty, full, paused. The tier
//! answers misses within its timeout, counts the errors, and writes again once the store is
//! back (after its backoff).

use std::time::{Duration, Instant};

use engram_kv::{KvFormat, BLOCK_TOKENS};
use engram_remote::{RemoteConfig, RemoteKv, RemoteTier, BACKOFF_MAX};

use crate::common::*;

fn config(url: String) -> RemoteConfig {
    let mut c = RemoteConfig::new(url);
    c.run_tokens = 2 * BLOCK_TOKENS;
    c.timeout = Duration::from_millis(200);
    c
}

/// Tokens of one conversation's KV ([`conversation_kv`]): every session saved here is a prefix
/// of it, so the same tokens always carry the same KV (as a model computes it; runs are
/// content-addressed).
const LONGEST: usize = 16 * BLOCK_TOKENS;

/// The KV of the conversation's first `n` tokens.
fn conversation_kv(p: &engram_kv::KvPool, n: usize) -> engram_kv::SeqKv {
    assert!(n <= LONGEST);
    make_kv(p, LONGEST, 3).fork(n)
}

fn save(remote: &RemoteKv, id: &str, n: usize) -> (Vec<u32>, String) {
    let p = pool(KvFormat::F16);
    let (tokens, text, ends) = conversation(n, 4);
    remote.save_session(Some("t"), "t", id, Some("t"), &text, &tokens, &ends, conversation_kv(&p, n));
    (tokens, text)
}

/// Waits out the longest backoff, so the next call tries the store again.
fn wait_backoff() {
    std::thread::sleep(BACKOFF_MAX + Duration::from_millis(200));
}

#[test]
fn a_store_down_at_start_is_a_quick_miss_and_is_used_once_up() {
    if !redis_available() {
        return;
    }
    let port = free_port();
    let t = RemoteTier::new(config(format!("redis://127.0.0.1:{port}/"))).unwrap();
    let remote = t.for_model(FP.into());
    let start = Instant::now();
    for _ in 0..20 {
        assert!(remote.find_manifest(Some("t"), "t", Some("s"), "x").is_none());
    }
    assert!(start.elapsed() < Duration::from_secs(2), "misses while down take {:?}", start.elapsed());
    assert!(t.stats().read_errors >= 20);
    save(&remote, "s", 3 * BLOCK_TOKENS);
    t.flush();
    assert_eq!(t.stats().writes, 0, "nothing written while down");
    assert!(!t.stats().connected);

    // Up now, on that port: after the backoff the tier connects by itself.
    let _redis = Redis::start_on(port, &[]);
    wait_backoff();
    let (_, text) = save(&remote, "s", 3 * BLOCK_TOKENS);
    t.flush();
    assert!(t.stats().writes >= 1);
    assert!(remote.find_manifest(Some("t"), "t", Some("s"), &text).is_some(), "written and read once the store is up");
    assert!(t.stats().connected);
}

#[test]
fn a_store_killed_and_restarted_empty_is_a_miss_then_used_again() {
    if !redis_available() {
        return;
    }
    let mut redis = Redis::start(&[]);
    let t = RemoteTier::new(config(redis.url())).unwrap();
    let remote = t.for_model(FP.into());
    let (tokens, text) = save(&remote, "s", 3 * BLOCK_TOKENS);
    t.flush();
    let p = pool(KvFormat::F16);
    assert!(remote.fetch_kv(Some("t"), Some("t"), &tokens, tokens.len(), &p, VOCAB).is_some());

    redis.kill();
    let start = Instant::now();
    assert!(remote.find_manifest(Some("t"), "t", Some("s"), &text).is_none());
    assert!(remote.fetch_kv(Some("t"), Some("t"), &tokens, tokens.len(), &p, VOCAB).is_none());
    save(&remote, "s2", 2 * BLOCK_TOKENS);
    t.flush();
    assert!(start.elapsed() < Duration::from_secs(2), "a dead store cost {:?}", start.elapsed());
    let errors = t.stats();
    assert!(errors.read_errors >= 2 && errors.write_errors + errors.writes_dropped >= 1, "{errors:?}");

    redis.restart();
    wait_backoff();
    assert!(remote.find_manifest(Some("t"), "t", Some("s"), &text).is_none(), "restarted empty: a miss");
    let (_, text) = save(&remote, "s3", 2 * BLOCK_TOKENS);
    t.flush();
    assert!(remote.find_manifest(Some("t"), "t", Some("s3"), &text).is_some(), "writes resume");
}

#[test]
fn a_paused_store_costs_a_read_no_more_than_its_timeout() {
    if !redis_available() {
        return;
    }
    let redis = Redis::start(&[]);
    let t = RemoteTier::new(config(redis.url())).unwrap();
    let remote = t.for_model(FP.into());
    let (tokens, text) = save(&remote, "s", 3 * BLOCK_TOKENS);
    t.flush();
    assert!(remote.find_manifest(Some("t"), "t", Some("s"), &text).is_some());
    // The store stops answering every client for 3 s.
    redis.cmd::<()>(&["CLIENT", "PAUSE", "3000", "ALL"]).unwrap();
    let start = Instant::now();
    assert!(remote.find_manifest(Some("t"), "t", Some("s"), &text).is_none());
    let p = pool(KvFormat::F16);
    assert!(remote.fetch_kv(Some("t"), Some("t"), &tokens, tokens.len(), &p, VOCAB).is_none());
    let took = start.elapsed();
    assert!(took < Duration::from_millis(1500), "two reads against a paused store took {took:?} (timeout 200 ms, then backoff)");
    assert!(t.stats().read_errors >= 2);
}

#[test]
fn a_full_store_refuses_writes_and_reads_still_work() {
    if !redis_available() {
        return;
    }
    // 2 MiB, no eviction: writes past it fail with OOM (counted), the session saved before
    // stays readable.
    let redis = Redis::start(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]);
    let t = RemoteTier::new(config(redis.url())).unwrap();
    let remote = t.for_model(FP.into());
    let (tokens, text) = save(&remote, "first", 2 * BLOCK_TOKENS);
    t.flush();
    for i in 0..40 {
        save(&remote, &format!("more-{i}"), 8 * BLOCK_TOKENS + i);
        t.flush();
    }
    assert!(t.stats().write_errors > 0, "{:?}", t.stats());
    assert!(remote.find_manifest(Some("t"), "t", Some("first"), &text).is_some());
    let p = pool(KvFormat::F16);
    assert_eq!(remote.fetch_kv(Some("t"), Some("t"), &tokens, tokens.len(), &p, VOCAB).map(|k| k.len()), Some(tokens.len()));

    // With an LRU policy the store evicts instead of refusing: writes succeed, and keys vanish
    // (old ones, and — Redis's LRU being approximate — sometimes new ones): a vanished key is a
    // miss, and whatever is restored is exact.
    let redis = Redis::start(&["--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"]);
    let t = RemoteTier::new(config(redis.url())).unwrap();
    let remote = t.for_model(FP.into());
    for i in 0..40 {
        save(&remote, &format!("s-{i}"), 8 * BLOCK_TOKENS + i);
    }
    t.flush();
    assert_eq!(t.stats().write_errors, 0, "{:?}", t.stats());
    let sessions = redis.keys().iter().filter(|k| k.contains(":sess:")).count();
    assert!(sessions < 40, "nothing was evicted ({sessions} manifests of 40 sessions in 3 MB)");
    for i in (0..40).step_by(7) {
        let n = 8 * BLOCK_TOKENS + i;
        let (tokens, text, _) = conversation(n, 4);
        let Some(m) = remote.find_manifest(Some("t"), "t", Some(&format!("s-{i}")), &text) else { continue };
        assert_eq!(m.tokens, tokens);
        if let Some(kv) = remote.fetch_kv(Some("t"), Some("t"), &m.tokens, n, &p, VOCAB) {
            let k = kv.len();
            assert!(k == n || k % (2 * BLOCK_TOKENS) == 0, "a restore of {k} of {n} tokens is not whole runs");
            assert!(rows(&kv, k).0 == rows(&conversation_kv(&p, n), k).0, "session s-{i}: what is restored is exact");
        }
    }
}
