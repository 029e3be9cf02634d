//! Disk-store ids of persisted sessions and shared prefix chains.
//!
//! ```text
//!  session-<64 hex>   blake3 (derive-key mode, SESSION_CONTEXT) of len(owner) owner len(session) session
//!  prefix-<64 hex>    blake3 (derive-key mode, PREFIX_CONTEXT)  of cache fingerprint, salt, the chain's token ids
//! ```
//! Invariant: an id is a function of what it names, and two different names
//! never share an id (short of a blake3 collision). Every field is
//! length-prefixed, so no two inputs hash the same byte string.
//!
//! NOTE: plain (unkeyed) blake3, not a keyed hash. The threat is one tenant
//! choosing an owner or session name offline whose id equals another tenant's
//! (FNV-1a-64, used before, inverts step by step): blake3's collision
//! resistance (128 bits) closes that without a secret. A key would have to be
//! kept beside the data it protects (whoever can read the data dir can read
//! both), and would tie ids to one installation. Ids are never shown to
//! clients, and the store also checks an entry's stored owner on every read,
//! write and delete, so even a collision would be a miss or a refusal.
//!
//! Entries written under FNV ids (`session-<16 hex>`, `prefix-<16 hex>`) are
//! not at the id their owner maps to: [`crate::session_files::PersistedSessions`]
//! deletes them when it opens the store (a miss; the session is recomputed).

/// Domain-separation context of session ids.
const SESSION_CONTEXT: &str = "engram 2026-11 disk id: session (owner, session id)";
/// Domain-separation context of prefix-chain ids.
const PREFIX_CONTEXT: &str = "engram 2026-11 disk id: shared prefix (fingerprint, salt, tokens)";

fn update_field(h: &mut blake3::Hasher, bytes: &[u8]) {
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The store id of `owner`'s session `session_id`: `session-` and 64 hex digits.
pub fn session_disk_id(owner: &str, session_id: &str) -> String {
    let mut h = blake3::Hasher::new_derive_key(SESSION_CONTEXT);
    update_field(&mut h, owner.as_bytes());
    update_field(&mut h, session_id.as_bytes());
    format!("session-{}", h.finalize().to_hex())
}

/// The store id of the shared prefix chain `tokens` (whole blocks) indexed under
/// `salt` (`None`: shared across tenants) for the cache fingerprint `fingerprint`
/// (model and KV format, `engram_kv::cache_fingerprint`): `prefix-` and 64 hex digits.
pub fn prefix_disk_id(fingerprint: &str, salt: Option<&str>, tokens: &[u32]) -> String {
    let mut h = blake3::Hasher::new_derive_key(PREFIX_CONTEXT);
    update_field(&mut h, fingerprint.as_bytes());
    if let Some(s) = salt {
        h.update(&[1]);
        update_field(&mut h, s.as_bytes());
    } else {
        h.update(&[0]);
    }
    h.update(&(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    format!("prefix-{}", h.finalize().to_hex())
}

/// The owner metadata of a prefix chain entry indexed under `salt`: `salt/<tenant>`, or
/// empty for a chain shared across tenants.
pub fn prefix_owner(salt: Option<&str>) -> String {
    salt.map_or_else(String::new, |s| format!("salt/{s}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_separate_fields_and_kinds() {
        assert_ne!(session_disk_id("a", "bc"), session_disk_id("ab", "c"));
        assert_ne!(session_disk_id("a/b", "c"), session_disk_id("a", "b/c"));
        assert_eq!(session_disk_id("a", "b"), session_disk_id("a", "b"));
        assert_eq!(session_disk_id("a", "b").len(), "session-".len() + 64);
        let fp = "0123456789abcdef-f16";
        assert_ne!(prefix_disk_id(fp, None, &[1, 2]), prefix_disk_id(fp, Some(""), &[1, 2]));
        assert_ne!(prefix_disk_id(fp, Some("t"), &[1, 2]), prefix_disk_id("0123456789abcdef-q8", Some("t"), &[1, 2]));
        assert_ne!(prefix_disk_id(fp, Some("t"), &[1, 2]), prefix_disk_id(fp, Some("u"), &[1, 2]));
    }
}
