//! TLS: a `redis-server` that listens only with TLS (`--tls-port`, certificates made here by
//! the `openssl` command: an authority and a certificate for 127.0.0.1 it signed). The tier
//! reaches it with `rediss://` and the authority's certificate; without it (the system's roots
//! do not know this authority) every lookup is a miss, counted — never a plaintext fallback.

use std::path::Path;
use std::process::{Command, Stdio};

use engram_kv::{KvFormat, BLOCK_TOKENS};
use engram_remote::{RemoteConfig, RemoteTier};

use crate::common::*;

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl").args(args).current_dir(dir).stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(ok.is_ok_and(|s| s.success()), "openssl {args:?} failed");
}

/// An authority (`ca.pem`) and a server certificate for 127.0.0.1 it signed (`server.pem`,
/// `server.key`) in `dir`.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=engram test CA",
        ],
    );
    openssl(dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

#[test]
fn a_tls_store_is_reached_with_its_authority_and_only_with_it() {
    if !redis_available() {
        return;
    }
    if Command::new("openssl").arg("version").stdout(Stdio::null()).status().is_err() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "openssl is not installed");
        eprintln!("skipped: openssl is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let file = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let tls_port = free_port();
    // Plaintext port too (the admin connection of the helper), TLS for the tier.
    let redis = Redis::start(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &file("server.pem"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.pem"),
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    let mut config = RemoteConfig::new(url.clone());
    config.run_tokens = 2 * BLOCK_TOKENS;
    config.ca_pem = Some(std::fs::read(dir.path().join("ca.pem")).unwrap());
    let t = RemoteTier::new(config.clone()).unwrap();
    let remote = t.for_model(FP.into());
    let p = pool(KvFormat::F16);
    let n = 3 * BLOCK_TOKENS + 5;
    let kv = make_kv(&p, n, 3);
    let (tokens, text, ends) = conversation(n, 2);
    remote.save_session(Some("t"), "t", "s", Some("t"), &text, &tokens, &ends, kv.fork(n));
    t.flush();
    assert_eq!(t.stats().write_errors, 0, "{:?}", t.stats());
    let got = remote.fetch_kv(Some("t"), Some("t"), &tokens, n, &p, VOCAB).expect("restored over TLS");
    assert!(rows(&got, n) == rows(&kv, n));
    assert!(redis.keys().iter().any(|k| k.contains(":run:")), "the values are in the store");

    // Without the authority: the certificate is not trusted, so nothing is read or written.
    let untrusted = RemoteTier::new(RemoteConfig { ca_pem: None, ..config }).unwrap();
    assert!(untrusted.for_model(FP.into()).find_manifest(Some("t"), "t", Some("s"), &text).is_none());
    assert!(untrusted.stats().read_errors >= 1);
}
