//! Tenants: every key of a tenant under its own prefix; an ACL user per tenant that can reach
//! only that prefix; records (agents) per tenant.

use engram_kv::{KvFormat, BLOCK_TOKENS};
use engram_remote::{tenant_key_pattern, RemoteConfig, RemoteTier};

use crate::common::*;

#[test]
fn acl_users_per_tenant_cannot_read_each_others_keys() {
    if !redis_available() {
        return;
    }
    let redis = Redis::start(&[]);
    for (user, tenant) in [("alice-user", "alice"), ("bob-user", "bob")] {
        let pattern = tenant_key_pattern(tenant);
        redis
            .cmd::<()>(&[
                "ACL",
                "SETUSER",
                user,
                "on",
                &format!(">{user}-pw"),
                "resetkeys",
                &format!("~{pattern}"),
                "-@all",
                "+@read",
                "+@write",
                "+@keyspace",
                "+@connection",
                "-@dangerous",
            ])
            .unwrap();
    }
    let url = |user: &str| format!("redis://{user}:{user}-pw@127.0.0.1:{}/", redis.port);
    // The default URL is a user with no keys at all: every tenant's keys go through its own.
    redis.cmd::<()>(&["ACL", "SETUSER", "nobody", "on", ">nobody-pw", "+@connection"]).unwrap();
    let mut c = RemoteConfig::new(url("nobody"));
    c.run_tokens = 2 * BLOCK_TOKENS;
    c.tenant_urls = vec![("alice".into(), url("alice-user")), ("bob".into(), url("bob-user"))];
    let t = RemoteTier::new(c).unwrap();
    let remote = t.for_model(FP.into());
    let p = pool(KvFormat::F16);
    let n = 3 * BLOCK_TOKENS;
    let (tokens, text, ends) = conversation(n, 2);
    for tenant in ["alice", "bob"] {
        remote.save_session(Some(tenant), tenant, "s", Some(tenant), &text, &tokens, &ends, make_kv(&p, n, 1));
        t.put_record(tenant, "agent", "helper", format!("{{\"tenant\":\"{tenant}\"}}"));
    }
    t.flush();
    assert_eq!(t.stats().write_errors, 0, "{:?}", t.stats());
    for tenant in ["alice", "bob"] {
        assert!(remote.find_manifest(Some(tenant), tenant, Some("s"), &text).is_some());
        assert_eq!(remote.fetch_kv(Some(tenant), Some(tenant), &tokens, n, &p, VOCAB).map(|k| k.len()), Some(n));
        assert_eq!(t.get_record(tenant, "agent", "helper"), Some(format!("{{\"tenant\":\"{tenant}\"}}")));
    }
    // Every key is under its tenant's prefix.
    let keys = redis.keys();
    let (a, b) = (tenant_key_pattern("alice"), tenant_key_pattern("bob"));
    let under = |k: &String, p: &str| k.starts_with(p.trim_end_matches('*'));
    assert!(keys.iter().all(|k| under(k, &a) || under(k, &b)), "{keys:?}");
    // Alice's user cannot read Bob's keys, nor the reverse.
    let mut alice = redis::Client::open(url("alice-user")).unwrap().get_connection().unwrap();
    let mut bob = redis::Client::open(url("bob-user")).unwrap().get_connection().unwrap();
    for k in &keys {
        let (mine, theirs) = if under(k, &a) { (&mut alice, &mut bob) } else { (&mut bob, &mut alice) };
        assert!(redis::cmd("STRLEN").arg(k).query::<usize>(mine).is_ok() || redis::cmd("SCARD").arg(k).query::<usize>(mine).is_ok());
        let denied = redis::cmd("GET").arg(k).query::<Option<Vec<u8>>>(theirs).unwrap_err();
        assert!(denied.to_string().to_lowercase().contains("noperm"), "{denied}");
    }
    // A tenant whose URL is the keyless default reaches nothing: misses, counted, no answer.
    assert!(remote.find_manifest(Some("carol"), "carol", Some("s"), &text).is_none());
    assert!(t.stats().read_errors > 0);
}

#[test]
fn records_are_per_tenant_and_deleted_behind_the_caller() {
    if !redis_available() {
        return;
    }
    let redis = Redis::start(&[]);
    let t = RemoteTier::new(RemoteConfig::new(redis.url())).unwrap();
    t.put_record("alice", "agent", "a1", "{\"name\":\"one\"}".into());
    t.put_record("alice", "agent", "a0", "{}".into());
    t.flush();
    assert_eq!(t.record_names("alice", "agent", 10), Some(vec!["a0".to_string(), "a1".to_string()]));
    assert_eq!(t.record_names("alice", "agent", 1), Some(vec!["a0".to_string()]));
    assert_eq!(t.record_names("bob", "agent", 10), Some(vec![]));
    assert_eq!(t.get_record("alice", "agent", "a1").as_deref(), Some("{\"name\":\"one\"}"));
    assert_eq!(t.get_record("bob", "agent", "a1"), None);
    assert_eq!(t.get_record("alice", "agent", "a2"), None);
    t.delete_record("alice", "agent", "a1");
    t.flush();
    assert_eq!(t.get_record("alice", "agent", "a1"), None);
    assert_eq!(t.record_names("alice", "agent", 10), Some(vec!["a0".to_string()]));
    // Forgetting an owner drops its manifests (a replica then finds nothing to continue).
    let remote = t.for_model(FP.into());
    let p = pool(KvFormat::F16);
    let (tokens, text, ends) = conversation(40, 1);
    remote.save_session(Some("alice"), "alice", "s", Some("alice"), &text, &tokens, &ends, make_kv(&p, 40, 1));
    t.flush();
    assert!(remote.find_manifest(Some("alice"), "alice", None, &text).is_some());
    // Bob's session with the same tokens: his own (salted) runs, which alice's forget leaves.
    remote.save_session(Some("bob"), "bob", "s", Some("bob"), &text, &tokens, &ends, make_kv(&p, 40, 1));
    t.flush();
    let runs = |r: &Redis| r.keys().iter().filter(|k| k.contains(":run:")).count();
    assert_eq!(runs(&redis), 2, "one run each (40 tokens in runs of 512)");
    remote.forget_owner(Some("alice"), "alice");
    t.flush();
    assert!(remote.find_manifest(Some("alice"), "alice", None, &text).is_none());
    assert!(remote.find_manifest(Some("alice"), "alice", Some("s"), &text).is_none());
    assert_eq!(runs(&redis), 1, "alice's run is gone, bob's stays");
    assert!(remote.find_manifest(Some("bob"), "bob", Some("s"), &text).is_some());
    let p2 = pool(KvFormat::F16);
    assert_eq!(remote.fetch_kv(Some("bob"), Some("bob"), &tokens, 40, &p2, VOCAB).map(|k| k.len()), Some(40));
}
