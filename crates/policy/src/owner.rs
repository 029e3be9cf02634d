//! [`OwnerKey`]: whose state a job may reuse — a tenant (an API key's account), and within it
//! what kind of owner (the tenant's own sessions, a named agent, a dual-stream user, a RAG
//! query) and which one.
//!
//! ```text
//!  OwnerKey { tenant: "alice", kind: Agent, id: "bot" }   key: "alice␟agent:bot"
//!  OwnerKey { tenant: "alice", kind: Tenant, id: "" }     key: "alice"
//! ```
//! The key's text form (tenant, U+001F, `kind:id`) is what files and metadata written before
//! the typed key store, so [`OwnerKey::as_str`] is kept byte for byte: a session persisted
//! under an owner is found again under the same key.
//!
//! Invariant: `OwnerKey::parse(k.as_str()) == k` for every key, and two keys are equal exactly
//! when their text forms are.

use std::fmt;

/// The separator between a tenant and the rest of an owner key's text form.
const SEPARATOR: char = '\u{1f}';

/// What kind of owner a key names within its tenant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OwnerKind {
    /// The tenant's own sessions (the key is the tenant alone).
    Tenant,
    /// A named agent (`/v1/agents/{id}`, a scenario's agent).
    Agent,
    /// A dual-stream user (its persistent stream, facts and threads).
    User,
    /// One RAG query's job.
    Rag,
    /// Any other kind, by its name in the text form.
    Other(String),
}

impl OwnerKind {
    /// The kind's name in the text form (`""` for [`OwnerKind::Tenant`]).
    pub fn name(&self) -> &str {
        match self {
            OwnerKind::Tenant => "",
            OwnerKind::Agent => "agent",
            OwnerKind::User => "user",
            OwnerKind::Rag => "rag",
            OwnerKind::Other(k) => k,
        }
    }

    fn from_name(name: &str) -> OwnerKind {
        match name {
            "agent" => OwnerKind::Agent,
            "user" => OwnerKind::User,
            "rag" => OwnerKind::Rag,
            k => OwnerKind::Other(k.to_string()),
        }
    }
}

/// Whose state a job may reuse. See the module doc.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OwnerKey {
    /// The text form, kept as written (see the module doc).
    key: String,
    kind: OwnerKind,
}

impl OwnerKey {
    /// The tenant's own sessions.
    pub fn tenant_own(tenant: &str) -> OwnerKey {
        OwnerKey::parse(tenant)
    }

    /// `tenant`'s owner of `kind` named `id`.
    pub fn new(tenant: &str, kind: OwnerKind, id: &str) -> OwnerKey {
        debug_assert!(!tenant.contains(SEPARATOR), "a tenant name never holds the owner-key separator");
        if kind == OwnerKind::Tenant {
            return OwnerKey::parse(tenant);
        }
        OwnerKey { key: format!("{tenant}{SEPARATOR}{}:{id}", kind.name()), kind }
    }

    /// `tenant`'s named agent `id`.
    pub fn agent(tenant: &str, id: &str) -> OwnerKey {
        OwnerKey::new(tenant, OwnerKind::Agent, id)
    }

    /// `tenant`'s dual-stream user `id`.
    pub fn user(tenant: &str, id: &str) -> OwnerKey {
        OwnerKey::new(tenant, OwnerKind::User, id)
    }

    /// `tenant`'s RAG job number `n`.
    pub fn rag(tenant: &str, n: u64) -> OwnerKey {
        OwnerKey::new(tenant, OwnerKind::Rag, &n.to_string())
    }

    /// The key whose text form is `key` (what a job, a file's metadata or an older caller
    /// carries): the text before the first U+001F is the tenant, the rest `kind:id` (a rest
    /// without `:` is a kind of that name with an empty id).
    pub fn parse(key: &str) -> OwnerKey {
        let kind = match key.split_once(SEPARATOR) {
            None => OwnerKind::Tenant,
            Some((_, rest)) => OwnerKind::from_name(rest.split_once(':').map_or(rest, |(k, _)| k)),
        };
        OwnerKey { key: key.to_string(), kind }
    }

    /// The account the key belongs to (fair admission, quotas and disk shares count by it).
    pub fn tenant(&self) -> &str {
        OwnerKey::tenant_of(&self.key)
    }

    /// The tenant of the key whose text form is `key` (without parsing the rest): the text
    /// before the first U+001F, else the whole key.
    pub fn tenant_of(key: &str) -> &str {
        key.split(SEPARATOR).next().unwrap_or(key)
    }

    /// What kind of owner it is.
    pub fn kind(&self) -> &OwnerKind {
        &self.kind
    }

    /// Which one of its kind (`""` for the tenant's own sessions).
    pub fn id(&self) -> &str {
        match self.key.split_once(SEPARATOR) {
            None => "",
            Some((_, rest)) => rest.split_once(':').map_or("", |(_, id)| id),
        }
    }

    /// The text form (see the module doc).
    pub fn as_str(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for OwnerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

impl From<String> for OwnerKey {
    fn from(key: String) -> OwnerKey {
        OwnerKey::parse(&key)
    }
}

impl From<&str> for OwnerKey {
    fn from(key: &str) -> OwnerKey {
        OwnerKey::parse(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_keys_keep_their_text_form() {
        let a = OwnerKey::agent("alice", "bot");
        assert_eq!(a.as_str(), "alice\u{1f}agent:bot");
        assert_eq!((a.tenant(), a.kind(), a.id()), ("alice", &OwnerKind::Agent, "bot"));
        assert_eq!(OwnerKey::parse(a.as_str()), a);
        let u = OwnerKey::user("t", "ann");
        assert_eq!((u.as_str(), u.tenant(), u.kind()), ("t\u{1f}user:ann", "t", &OwnerKind::User));
        assert_eq!(OwnerKey::rag("t", 7).as_str(), "t\u{1f}rag:7");
        let own = OwnerKey::tenant_own("bob");
        assert_eq!((own.as_str(), own.tenant(), own.kind(), own.id()), ("bob", "bob", &OwnerKind::Tenant, ""));
    }

    #[test]
    fn any_text_parses_back_to_itself() {
        for k in ["", "x", "a\u{1f}b", "a\u{1f}b:", "a\u{1f}:c", "a\u{1f}b:c:d", "a\u{1f}b\u{1f}c:d", "a\u{1f}note:1"] {
            let key = OwnerKey::parse(k);
            assert_eq!(key.as_str(), k);
            assert_eq!(OwnerKey::parse(&key.to_string()), key);
        }
        assert_eq!(OwnerKey::parse("a\u{1f}note:1").kind(), &OwnerKind::Other("note".into()));
        assert_eq!(OwnerKey::parse("a\u{1f}b\u{1f}c:d").tenant(), "a");
    }
}
