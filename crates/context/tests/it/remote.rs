//! The remote tier under the session store, against a real `redis-server`: a conversation
//! continued by another store (another replica: its own pool, nothing local) reuses what the
//! first saved — EXTEND from the remote session, a shared prefix from the remote runs — and
//! every turn equals a cold run (the checks of `sessions::turn_on`). Skipped without
//! `redis-server`, except under CI=true.

use crate::common::model;
use crate::sessions::turn_on;
use engram_context::{MatchKind, SessionStore};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_remote::testing::TestRedis;
use engram_remote::{RemoteConfig, RemoteTier};

fn redis() -> Option<TestRedis> {
    TestRedis::start_if_available()
}

/// A replica's store: its own pool, no disk, the shared tier (runs of one block, so short
/// texts span several).
fn replica(tier: &RemoteTier, format: KvFormat, share: bool) -> SessionStore {
    let m = model();
    let pool = KvPool::new(KvLayout::of(&m.config), format, 256 << 20);
    let fp = engram_kv::cache_fingerprint(m.fingerprint, format);
    SessionStore::new(pool, m.fingerprint).with_shared_prefixes_across_tenants(share).with_remote(tier.for_model(fp))
}

#[test]
fn another_replica_continues_a_conversation_exactly() {
    let Some(r) = redis() else { return };
    let m = model();
    // Exact formats only, as the local reuse tests: q8/q4 reuse is approximate against a cold
    // run by design (the reused part is read quantized), locally and remotely alike.
    for format in [KvFormat::F32, KvFormat::F16] {
        let mut config = RemoteConfig::new(format!("redis://127.0.0.1:{}/", r.port));
        config.run_tokens = engram_kv::BLOCK_TOKENS;
        let tier = RemoteTier::new(config).unwrap();
        let mut a = replica(&tier, format, false);
        let system = "You are a careful assistant who keeps every fact about the user's week. ".repeat(3);
        let t1 = format!("{system}User: plan my Monday.\nAssistant:");
        let (k1, _, out1) = turn_on(m, &mut a, "alice", &t1, 8);
        assert_eq!(k1, MatchKind::Miss);
        a.flush();
        // Replica B never saw alice: it finds her session in the tier and extends it.
        let mut b = replica(&tier, format, false);
        let t2 = format!("{t1}{out1}\nUser: and Tuesday?\nAssistant:");
        let (k2, r2, out2) = turn_on(m, &mut b, "alice", &t2, 8);
        assert_eq!(k2, MatchKind::Extend, "{format:?}");
        assert!(r2 > 20, "{format:?}: reused {r2}");
        assert_eq!(b.restored_count(), 1);
        b.flush();
        // Back on A, which holds turn 1 only: B's newer session in the tier covers more of
        // turn 3, so A takes it (replacing its own) and reuses turn 2 as well, exactly.
        let t3 = format!("{t2}{out2}\nUser: and Wednesday?\nAssistant:");
        let (k3, r3, _) = turn_on(m, &mut a, "alice", &t3, 4);
        assert!(matches!(k3, MatchKind::Extend | MatchKind::Diverge), "{k3:?}");
        assert!(r3 > r2 + 8, "{format:?}: turn 3 reused {r3}, turn 2 {r2}: B's turn was not taken");
        assert_eq!(a.restored_count(), 1, "{format:?}");
        // Bob is another owner: nothing of alice's reaches him.
        let mut c = replica(&tier, format, false);
        let (k4, r4, _) = turn_on(m, &mut c, "bob", &t1, 4);
        assert_eq!((k4, r4), (MatchKind::Miss, 0), "{format:?}");
    }
}

#[test]
fn a_shared_system_prompt_is_found_by_its_runs_on_another_replica() {
    let Some(r) = redis() else { return };
    let m = model();
    let mut config = RemoteConfig::new(format!("redis://127.0.0.1:{}/", r.port));
    config.run_tokens = engram_kv::BLOCK_TOKENS;
    let tier = RemoteTier::new(config).unwrap();
    let system = "You are a careful assistant who keeps every fact about the user's week. ".repeat(3);
    // Sharing across tenants opted into: the chain has no salt and lives under the shared keys.
    let mut a = replica(&tier, KvFormat::F32, true);
    turn_on(m, &mut a, "alice", &format!("{system}User: plan my Monday.\nAssistant:"), 4);
    a.flush();
    let mut b = replica(&tier, KvFormat::F32, true);
    let (kind, reused, _) = turn_on(m, &mut b, "bob", &format!("{system}User: hello\nAssistant:"), 4);
    assert_eq!(kind, MatchKind::Prefix);
    assert!(reused >= 32 && reused % 32 == 0, "whole runs: {reused}");
    assert!(tier.stats().hits >= 1);
}
