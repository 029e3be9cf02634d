//! The key scheme: what every value is stored under.
//!
//! ```text
//!  engram:v1:t:<tenant tag>:<model tag>:run:<chain hash>     one run of KV blocks (an entry value)
//!  engram:v1:t:<tenant tag>:<model tag>:sess:<session hash>  a session's manifest (text, tokens, ends)
//!  engram:v1:t:<tenant tag>:<model tag>:owner:<owner hash>   the set of an owner's session ids
//!  engram:v1:t:<tenant tag>:doc:<kind>:<name hash>           a small record (an agent), any model
//!  engram:v1:t:<tenant tag>:doc:<kind>:index                 the set of a tenant's record names
//!  engram:v1:t:<tenant tag>:doc:<kind>:<name hash>:gone      a deleted record's tombstone
//!  engram:v1:shared:<model tag>:run:<chain hash>             a run of a chain shared across tenants
//! ```
//! `tenant tag` is 16 hex digits of a blake3 hash of the tenant name, so every key of a tenant
//! starts with `engram:v1:t:<tag>:` — the pattern a per-tenant Redis ACL user is given
//! ([`tenant_key_pattern`]). `model tag` hashes the cache fingerprint (model, KV format), so
//! another model or format never reads these runs. A run's `chain hash` covers the fingerprint,
//! the salt its chain is indexed under and every token from position 0 to the run's end: a
//! value is found only by a sequence with exactly those tokens (content addressing, shared by
//! every replica and every session with that prefix).
//!
//! Invariant: every field is length-prefixed before hashing, so two different inputs never
//! hash the same byte string; every hash is domain-separated by its own context.

/// The prefix of every key this version writes.
pub const NAMESPACE: &str = "engram:v1";

const TENANT_CONTEXT: &str = "engram 2026-11 remote tier: tenant tag";
const MODEL_CONTEXT: &str = "engram 2026-11 remote tier: model tag";
const CHAIN_CONTEXT: &str = "engram 2026-11 remote tier: run chain";
const NAME_CONTEXT: &str = "engram 2026-11 remote tier: name";

fn field(h: &mut blake3::Hasher, bytes: &[u8]) {
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

fn hex(h: &blake3::Hasher, digits: usize) -> String {
    h.finalize().to_hex()[..digits].to_string()
}

/// The 16-hex-digit tag of `tenant` in keys.
pub fn tenant_tag(tenant: &str) -> String {
    let mut h = blake3::Hasher::new_derive_key(TENANT_CONTEXT);
    field(&mut h, tenant.as_bytes());
    hex(&h, 16)
}

/// The Redis key pattern that covers every key of `tenant` (for an ACL rule `~<pattern>`).
pub fn tenant_key_pattern(tenant: &str) -> String {
    format!("{NAMESPACE}:t:{}:*", tenant_tag(tenant))
}

/// Keys of one tenant (or of chains shared across tenants) for one cache fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpace {
    /// `engram:v1:t:<tag>:` or `engram:v1:shared:`.
    tenant_prefix: String,
    /// `<model tag>`.
    model: String,
}

impl KeySpace {
    /// The keys of `tenant` (`None`: chains shared across tenants) for caches with
    /// `fingerprint` (`engram_kv::cache_fingerprint`).
    pub fn new(tenant: Option<&str>, fingerprint: &str) -> KeySpace {
        let tenant_prefix = match tenant {
            Some(t) => format!("{NAMESPACE}:t:{}:", tenant_tag(t)),
            None => format!("{NAMESPACE}:shared:"),
        };
        let mut h = blake3::Hasher::new_derive_key(MODEL_CONTEXT);
        field(&mut h, fingerprint.as_bytes());
        KeySpace { tenant_prefix, model: hex(&h, 16) }
    }

    /// The key of the run whose chain hash is `chain`.
    pub fn run(&self, chain: &ChainHash) -> String {
        format!("{}{}:run:{}", self.tenant_prefix, self.model, chain.0)
    }

    /// The key of `owner`'s session `session_id`'s manifest.
    pub fn session(&self, owner: &str, session_id: &str) -> String {
        let mut h = blake3::Hasher::new_derive_key(NAME_CONTEXT);
        field(&mut h, b"session");
        field(&mut h, owner.as_bytes());
        field(&mut h, session_id.as_bytes());
        format!("{}{}:sess:{}", self.tenant_prefix, self.model, hex(&h, 32))
    }

    /// The key of the set of `owner`'s session ids.
    pub fn owner(&self, owner: &str) -> String {
        let mut h = blake3::Hasher::new_derive_key(NAME_CONTEXT);
        field(&mut h, b"owner");
        field(&mut h, owner.as_bytes());
        format!("{}{}:owner:{}", self.tenant_prefix, self.model, hex(&h, 32))
    }

    /// The key of the set of the names of this tenant's records of kind `kind`.
    pub fn doc_index(&self, kind: &str) -> String {
        format!("{}doc:{kind}:index", self.tenant_prefix)
    }

    /// The key of the record `name` of kind `kind` (any model: records are not KV).
    pub fn doc(&self, kind: &str, name: &str) -> String {
        let mut h = blake3::Hasher::new_derive_key(NAME_CONTEXT);
        field(&mut h, b"doc");
        field(&mut h, kind.as_bytes());
        field(&mut h, name.as_bytes());
        format!("{}doc:{kind}:{}", self.tenant_prefix, hex(&h, 32))
    }

    /// The key of the tombstone of the record `name` of kind `kind`: set while the record is
    /// deleted, removed when it is written again.
    pub fn doc_tombstone(&self, kind: &str, name: &str) -> String {
        format!("{}:gone", self.doc(kind, name))
    }
}

/// The hash of a chain of runs: fingerprint, salt and every token up to a run's end
/// (32 hex digits).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChainHash(pub String);

/// The chain hashes at the end of each run of `run_tokens` tokens of `tokens`, and at
/// `tokens.len()` if it is not a run boundary (the last, partial run): one per run, in order.
pub fn chain_hashes(fingerprint: &str, salt: Option<&str>, tokens: &[u32], run_tokens: usize) -> Vec<ChainHash> {
    let mut h = blake3::Hasher::new_derive_key(CHAIN_CONTEXT);
    field(&mut h, fingerprint.as_bytes());
    match salt {
        Some(s) => {
            h.update(&[1]);
            field(&mut h, s.as_bytes());
        }
        None => {
            h.update(&[0]);
        }
    }
    let mut out = Vec::with_capacity(tokens.len().div_ceil(run_tokens));
    for run in tokens.chunks(run_tokens) {
        for t in run {
            h.update(&t.to_le_bytes());
        }
        // The hash so far, with the length so far: a run boundary's hash never equals another
        // prefix's.
        let mut at = h.clone();
        at.update(&(out.len() as u64 * run_tokens as u64 + run.len() as u64).to_le_bytes());
        out.push(ChainHash(hex(&at, 32)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_tenants_models_and_names() {
        let a = KeySpace::new(Some("alice"), "fp-f16");
        let b = KeySpace::new(Some("bob"), "fp-f16");
        let q = KeySpace::new(Some("alice"), "fp-q8");
        let s = KeySpace::new(None, "fp-f16");
        let c = &chain_hashes("fp-f16", Some("x"), &[1, 2, 3], 2)[0];
        assert_ne!(a.run(c), b.run(c));
        assert_ne!(a.run(c), q.run(c));
        assert_ne!(a.run(c), s.run(c));
        assert!(a.run(c).starts_with(tenant_key_pattern("alice").trim_end_matches('*')));
        assert!(a.doc("agent", "x").starts_with(tenant_key_pattern("alice").trim_end_matches('*')));
        assert_ne!(a.session("o", "ab"), a.session("oa", "b"));
        assert_ne!(a.session("o", "s"), a.owner("o"));
    }

    #[test]
    fn chain_hashes_cover_every_token_before_them() {
        let fp = "fp-f16";
        let h = chain_hashes(fp, Some("o"), &[1, 2, 3, 4, 5], 2);
        assert_eq!(h.len(), 3);
        // A shared prefix shares the runs' hashes; a change anywhere before a run changes it.
        assert_eq!(chain_hashes(fp, Some("o"), &[1, 2, 3, 4, 9, 9], 2)[..2], h[..2]);
        assert_ne!(chain_hashes(fp, Some("o"), &[7, 2, 3, 4, 5], 2)[1], h[1]);
        assert_ne!(chain_hashes(fp, Some("p"), &[1, 2, 3, 4, 5], 2)[0], h[0]);
        assert_ne!(chain_hashes(fp, None, &[1, 2, 3, 4, 5], 2)[0], h[0]);
        assert_ne!(chain_hashes("fp-q8", Some("o"), &[1, 2, 3, 4, 5], 2)[0], h[0]);
        // A partial run and a full one that starts the same differ.
        assert_ne!(chain_hashes(fp, Some("o"), &[1], 2)[0], chain_hashes(fp, Some("o"), &[1, 2], 2)[0]);
    }
}
