//! Small values: a session's manifest (what a replica needs to continue it: its text, tokens and
//! token ends, and how its KV is split into runs) and a record (an agent), each sealed in the
//! envelope every small Engram file uses (`engram_kv::envelope`: magic, version, length,
//! blake3), and checked against what the reader asked for.
//!
//! Invariant: [`Manifest::open`] and [`Record::open`] return a value only if the envelope is
//! sound and it names exactly the owner, session or record asked for, with consistent fields;
//! anything else is a miss.

use engram_kv::envelope;
use serde::{Deserialize, Serialize};

const SESSION_MAGIC: &str = "engram-remote-session";
const RECORD_MAGIC: &str = "engram-remote-record";
const VERSION: u32 = 1;

/// A session as the tier knows it: its KV lives in runs found by hashing `tokens`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// `engram_kv::cache_fingerprint` of the model and KV format.
    pub fingerprint: String,
    pub owner: String,
    pub session_id: String,
    /// The salt the session's chain is hashed under (`None`: shared across tenants).
    pub salt: Option<String>,
    /// Tokens per run.
    pub run_tokens: usize,
    /// The rendered text the tokens came from.
    pub text: String,
    pub tokens: Vec<u32>,
    /// Byte end of each token's text in `text` (non-decreasing).
    pub token_ends: Vec<usize>,
}

impl Manifest {
    /// The sealed bytes.
    pub fn seal(&self) -> Vec<u8> {
        envelope::seal(SESSION_MAGIC, VERSION, &serde_json::to_vec(self).expect("a manifest serializes"))
    }

    /// The manifest in `bytes` if it is sound and is `owner`'s session `session_id` for
    /// `fingerprint`; why not otherwise.
    pub fn open(bytes: &[u8], fingerprint: &str, owner: &str, session_id: Option<&str>) -> Result<Manifest, String> {
        let body = envelope::open(bytes, SESSION_MAGIC, VERSION).map_err(|e| e.to_string())?;
        let m: Manifest = serde_json::from_slice(body).map_err(|e| format!("manifest: {e}"))?;
        if m.fingerprint != fingerprint {
            return Err(format!("manifest of fingerprint {}, expected {fingerprint}", m.fingerprint));
        }
        if m.owner != owner || session_id.is_some_and(|id| id != m.session_id) {
            return Err("manifest of another owner or session".into());
        }
        if m.run_tokens == 0 || m.run_tokens % engram_kv::BLOCK_TOKENS != 0 {
            return Err(format!("runs of {} tokens are not whole blocks", m.run_tokens));
        }
        if m.tokens.len() != m.token_ends.len()
            || m.token_ends.windows(2).any(|w| w[0] > w[1])
            || m.token_ends.last().is_some_and(|&e| e > m.text.len())
            || m.token_ends.iter().any(|&e| !m.text.is_char_boundary(e))
        {
            return Err("token ends do not describe the text".into());
        }
        Ok(m)
    }
}

/// A small record of a tenant (an agent's definition): `body` is the caller's JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub tenant: String,
    pub kind: String,
    pub name: String,
    pub body: String,
}

impl Record {
    /// The sealed bytes.
    pub fn seal(&self) -> Vec<u8> {
        envelope::seal(RECORD_MAGIC, VERSION, &serde_json::to_vec(self).expect("a record serializes"))
    }

    /// The record in `bytes` if it is sound and is `tenant`'s record `name` of kind `kind`.
    pub fn open(bytes: &[u8], tenant: &str, kind: &str, name: &str) -> Result<Record, String> {
        let body = envelope::open(bytes, RECORD_MAGIC, VERSION).map_err(|e| e.to_string())?;
        let r: Record = serde_json::from_slice(body).map_err(|e| format!("record: {e}"))?;
        if r.tenant != tenant || r.kind != kind || r.name != name {
            return Err("record of another tenant, kind or name".into());
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            fingerprint: "fp-f16".into(),
            owner: "alice".into(),
            session_id: "s1".into(),
            salt: Some("alice".into()),
            run_tokens: 64,
            text: "héllo world".into(),
            tokens: vec![1, 2],
            token_ends: vec![6, 12],
        }
    }

    #[test]
    fn manifests_open_only_for_what_was_asked() {
        let m = manifest();
        let bytes = m.seal();
        assert_eq!(Manifest::open(&bytes, "fp-f16", "alice", Some("s1")).unwrap(), m);
        assert_eq!(Manifest::open(&bytes, "fp-f16", "alice", None).unwrap(), m);
        assert!(Manifest::open(&bytes, "fp-q8", "alice", Some("s1")).is_err());
        assert!(Manifest::open(&bytes, "fp-f16", "bob", Some("s1")).is_err());
        assert!(Manifest::open(&bytes, "fp-f16", "alice", Some("s2")).is_err());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x20;
            assert!(Manifest::open(&bad, "fp-f16", "alice", Some("s1")).is_err(), "flip at {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(Manifest::open(&bytes[..n], "fp-f16", "alice", Some("s1")).is_err());
        }
        let bad_ends = Manifest { token_ends: vec![2, 1], ..manifest() };
        assert!(Manifest::open(&bad_ends.seal(), "fp-f16", "alice", None).is_err());
        let mid_char = Manifest { token_ends: vec![2, 12], ..manifest() };
        assert!(Manifest::open(&mid_char.seal(), "fp-f16", "alice", None).is_err());
        let runs = Manifest { run_tokens: 40, ..manifest() };
        assert!(Manifest::open(&runs.seal(), "fp-f16", "alice", None).is_err());
    }

    #[test]
    fn records_open_only_for_what_was_asked() {
        let r = Record { tenant: "t".into(), kind: "agent".into(), name: "a1".into(), body: "{}".into() };
        let bytes = r.seal();
        assert_eq!(Record::open(&bytes, "t", "agent", "a1").unwrap(), r);
        assert!(Record::open(&bytes, "u", "agent", "a1").is_err());
        assert!(Record::open(&bytes, "t", "agent", "a2").is_err());
        assert!(Record::open(&Manifest::seal(&manifest()), "t", "agent", "a1").is_err(), "a foreign value");
    }
}
