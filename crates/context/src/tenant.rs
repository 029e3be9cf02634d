//! Accounts: which tenant an owner key, or a cache entry's owner metadata, belongs to. Fair
//! admission, request quotas and disk shares all count by it.

/// The account an owner key belongs to: the text before the first U+001F (an agent's key is
/// `<tenant>\u{1f}agent:<id>`, a dual-stream user's `<tenant>\u{1f}user:<user>`), else the
/// whole key.
pub fn account(owner: &str) -> &str {
    engram_policy::OwnerKey::tenant_of(owner)
}

/// The account of a persisted entry's owner metadata (`session_files.rs`): a session's
/// `"<owner>/<session id>"`, a salted prefix chain's `"salt/<owner>"`; `""` for a chain
/// shared across tenants.
pub fn entry_account(meta_owner: &str) -> &str {
    if let Some(salt) = meta_owner.strip_prefix("salt/") {
        return account(salt);
    }
    account(meta_owner.rsplit_once('/').map_or(meta_owner, |(owner, _session)| owner))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_belong_to_their_owners_account() {
        assert_eq!(account("alice\u{1f}agent:bot"), "alice");
        assert_eq!(account("alice"), "alice");
        assert_eq!(entry_account("alice\u{1f}agent:bot/sess-1"), "alice");
        assert_eq!(entry_account("bob/sess-2"), "bob");
        assert_eq!(entry_account("salt/alice\u{1f}user:x"), "alice");
        assert_eq!(entry_account(""), "");
    }
}
