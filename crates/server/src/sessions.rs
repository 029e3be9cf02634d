//! Sessions: cached token sequences kept across requests, per tenant.
//!
//! ```text
//!  prompt:   [ shared with a cached session | new tokens ............ ]
//!  session:  [ shared with the prompt      | diverging tail ]
//!             ^ reused (cached_len)          ^ dropped (or kept in the original, see below)
//! ```
//! A request either names its session (`session_id`) or the store finds the
//! tenant's session whose tokens share the longest prefix with the prompt.
//! A named session is taken over and trimmed to the common prefix. An
//! anonymous request takes over an anonymous session it fully extends (the
//! usual "client resends the whole conversation" turn) and otherwise forks
//! the shared prefix (blocks are shared copy-on-write), leaving the original
//! intact for whoever owns it.
//!
//! Invariant: a session's `tokens` are exactly the tokens its `SeqKv` holds;
//! sessions never cross tenants. This module is the narrow seam that the
//! `engram-context` crate (character-level EXACT/EXTEND/DIVERGE matching and
//! persistence) will replace: the scheduler only calls [`SessionStore::checkout`],
//! [`SessionStore::checkin`], [`SessionStore::evict_lru`] and [`SessionStore::forget_tenant`].

use std::collections::HashMap;

use engram_kv::{KvPool, SeqKv};

/// A session taken out of the store for one request.
pub struct Checkout {
    pub session_id: String,
    /// Holds exactly `tokens`.
    pub kv: SeqKv,
    /// The reused prompt prefix (`prompt[..cached_len]`).
    pub tokens: Vec<u32>,
    /// Prompt tokens served from the cache; always `< prompt.len()` so the
    /// last prompt token is recomputed (its logits start generation).
    pub cached_len: usize,
    /// Whether the client named the session.
    pub named: bool,
}

struct Entry {
    id: String,
    named: bool,
    kv: SeqKv,
    tokens: Vec<u32>,
    last_used: u64,
}

/// Idle sessions of all tenants. Owned by the engine thread.
pub struct SessionStore {
    tenants: HashMap<String, Vec<Entry>>,
    max_sessions: usize,
    clock: u64,
    next_id: u64,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl SessionStore {
    /// A store keeping at most `max_sessions` idle sessions (LRU beyond).
    pub fn new(max_sessions: usize) -> SessionStore {
        SessionStore { tenants: HashMap::new(), max_sessions: max_sessions.max(1), clock: 0, next_id: 0 }
    }

    /// Idle sessions held.
    pub fn len(&self) -> usize {
        self.tenants.values().map(Vec::len).sum()
    }

    /// True when no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn fresh_id(&mut self) -> String {
        self.next_id += 1;
        format!("sess-{}", self.next_id)
    }

    /// Takes (or creates) the session for a request; see the module doc.
    pub fn checkout(&mut self, tenant: &str, session_id: Option<&str>, prompt: &[u32], pool: &KvPool) -> Checkout {
        let max_reuse = prompt.len().saturating_sub(1);
        let entries = self.tenants.entry(tenant.to_string()).or_default();
        if let Some(id) = session_id {
            let Some(at) = entries.iter().position(|e| e.id == id) else {
                return Checkout { session_id: id.to_string(), kv: SeqKv::new(pool), tokens: Vec::new(), cached_len: 0, named: true };
            };
            let mut e = entries.swap_remove(at);
            let keep = common_prefix(&e.tokens, prompt).min(max_reuse);
            e.kv.truncate(keep);
            e.tokens.truncate(keep);
            return Checkout { session_id: e.id, kv: e.kv, tokens: e.tokens, cached_len: keep, named: true };
        }
        let best = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt).min(max_reuse)))
            .max_by_key(|&(i, n)| (n, entries[i].last_used));
        match best {
            Some((i, n)) if n > 0 => {
                if !entries[i].named && n == entries[i].tokens.len() {
                    let e = entries.swap_remove(i);
                    Checkout { session_id: e.id, kv: e.kv, tokens: e.tokens, cached_len: n, named: false }
                } else {
                    let kv = entries[i].kv.fork(n);
                    let tokens = prompt[..n].to_vec();
                    Checkout { session_id: self.fresh_id(), kv, tokens, cached_len: n, named: false }
                }
            }
            _ => Checkout { session_id: self.fresh_id(), kv: SeqKv::new(pool), tokens: Vec::new(), cached_len: 0, named: false },
        }
    }

    /// Returns a session after its request; `tokens` must be what `kv` holds.
    pub fn checkin(&mut self, tenant: &str, session_id: String, named: bool, kv: SeqKv, tokens: Vec<u32>) {
        debug_assert_eq!(kv.len(), tokens.len());
        self.clock += 1;
        let entries = self.tenants.entry(tenant.to_string()).or_default();
        entries.retain(|e| e.id != session_id);
        if !tokens.is_empty() {
            entries.push(Entry { id: session_id, named, kv, tokens, last_used: self.clock });
        }
        while self.len() > self.max_sessions && self.evict_lru() {}
    }

    /// Drops the least recently used idle session; false if there is none.
    pub fn evict_lru(&mut self) -> bool {
        let victim = self
            .tenants
            .iter()
            .flat_map(|(t, es)| es.iter().enumerate().map(move |(i, e)| (e.last_used, t.clone(), i)))
            .min();
        match victim {
            Some((_, t, i)) => {
                let es = self.tenants.get_mut(&t).expect("tenant listed");
                es.swap_remove(i);
                if es.is_empty() {
                    self.tenants.remove(&t);
                }
                true
            }
            None => false,
        }
    }

    /// Drops every idle session of `tenant` (an agent was deleted).
    pub fn forget_tenant(&mut self, tenant: &str) {
        self.tenants.remove(tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_kv::{KvFormat, KvLayout};

    fn pool() -> KvPool {
        KvPool::new(KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4 }, KvFormat::F32, 1 << 20)
    }

    #[test]
    fn empty_sessions_are_not_kept() {
        let p = pool();
        let mut s = SessionStore::new(8);
        let c = s.checkout("t", None, &[1, 2, 3], &p);
        assert_eq!(c.cached_len, 0);
        s.checkin("t", c.session_id, false, SeqKv::new(&p), vec![]);
        assert!(s.is_empty());
        assert!(!s.evict_lru());
    }

    #[test]
    fn tenants_never_share() {
        let p = pool();
        let mut s = SessionStore::new(8);
        let c = s.checkout("a", None, &[1, 2, 3], &p);
        assert_eq!(c.cached_len, 0);
        let c2 = s.checkout("b", Some("x"), &[1, 2, 3], &p);
        assert_eq!(c2.cached_len, 0);
        assert_eq!(c2.session_id, "x");
    }
}
