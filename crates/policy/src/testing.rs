//! Seam tests for wrapper policies: [`Recording`], an inner policy that notes every seam method
//! that reaches it, and [`exercise_every_method`], which calls every method of
//! [`ContextPolicy`] through a wrapper around one and fails naming any method that did not
//! arrive. Each wrapper's test runs it, so a wrapper that stops forwarding a method fails.
//!
//! Invariant: [`exercise_every_method`] calls each method of [`ContextPolicy`] exactly once,
//! in trait order, with a plain tenant owner (no kind a wrapper would route elsewhere).
//! NOTE: a method added to the trait is added here too ([`Recording`] implements the trait,
//! so it cannot compile without it; [`METHODS`] lists what is checked).

use std::sync::{Arc, Mutex};

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_tokenizer::Tokenizer;

use crate::{
    AdmitRequest, BackgroundDone, BackgroundJob, Checkout, ContextPolicy, ControlError, ControlReply, IdleInterrupt, MatchKind, OwnerKey,
    PendingRestore, PolicyControl, PolicyStats, Readiness, Retired,
};

/// Every seam method, in trait order.
pub const METHODS: [&str; 13] = [
    "prepare",
    "admit",
    "admission_bytes",
    "pin_owner",
    "make_room",
    "verify_restore",
    "retire",
    "forget_owner",
    "stats",
    "control",
    "idle_slice",
    "next_background",
    "background_done",
];

/// The message [`exercise_every_method`] sends through [`ContextPolicy::control`]: only
/// [`Recording`] takes it.
#[derive(Debug)]
pub struct Ping;

/// An inner policy that records which seam methods reached it and otherwise does the least a
/// policy may (reuses nothing, keeps nothing).
pub struct Recording {
    pool: KvPool,
    calls: Arc<Mutex<Vec<&'static str>>>,
}

impl Recording {
    /// A recording policy and the list its calls are written to.
    pub fn new() -> (Recording, Arc<Mutex<Vec<&'static str>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        (Recording { pool: small_pool(), calls: calls.clone() }, calls)
    }

    fn note(&self, method: &'static str) {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(method);
    }
}

impl ContextPolicy for Recording {
    fn prepare(&mut self, _req: &AdmitRequest<'_>) -> Readiness {
        self.note("prepare");
        Readiness::Now
    }
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.note("admit");
        let n = req.tokens.len();
        Ok(Checkout::own("recorded".into(), MatchKind::Miss, req.tokens.to_vec(), vec![0; n], 0, SeqKv::new(&self.pool)))
    }
    fn admission_bytes(&self, _owner: &OwnerKey, _prompt_tokens: usize, _long_context_after: Option<usize>) -> Option<usize> {
        self.note("admission_bytes");
        None
    }
    fn pin_owner(&mut self, _owner: &OwnerKey) {
        self.note("pin_owner");
    }
    fn make_room(&mut self, _bytes: usize) -> bool {
        self.note("make_room");
        true
    }
    fn verify_restore(&mut self, _restore: PendingRestore) -> bool {
        self.note("verify_restore");
        true
    }
    fn retire(&mut self, _retired: Retired) {
        self.note("retire");
    }
    fn forget_owner(&mut self, _owner: &OwnerKey) {
        self.note("forget_owner");
    }
    fn stats(&self) -> PolicyStats {
        self.note("stats");
        PolicyStats::default()
    }
    fn control(&mut self, msg: PolicyControl) -> Result<ControlReply, ControlError> {
        self.note("control");
        msg.take::<Ping>().map(|_| ControlReply::done()).map_err(PolicyControl::refuse)
    }
    fn idle_slice(&mut self, _interrupt: &IdleInterrupt) -> bool {
        self.note("idle_slice");
        false
    }
    fn next_background(&mut self) -> Option<BackgroundJob> {
        self.note("next_background");
        None
    }
    fn background_done(&mut self, _done: BackgroundDone) {
        self.note("background_done");
    }
}

/// A pool for the KV a seam test hands around (one small layer; nothing is computed).
pub fn small_pool() -> KvPool {
    KvPool::new(KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 64 }, KvFormat::F16, 1 << 20)
}

/// The smallest tokenizer `admit` can be given (a word-level vocabulary of one word).
pub fn tokenizer() -> Tokenizer {
    let vocab = [("hi".to_string(), 0u32), ("[UNK]".to_string(), 1)].into_iter().collect();
    let model = tokenizers::models::wordlevel::WordLevel::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .build()
        .expect("a word-level vocabulary");
    Tokenizer::from_tokenizers(tokenizers::Tokenizer::new(model)).expect("a bare tokenizer")
}

/// Wraps a [`Recording`] policy with `wrap`, calls every seam method through the wrapper once,
/// and panics naming the methods that never reached the recording policy. Returns the calls
/// that arrived, in order (a wrapper may call its inner policy more than once).
pub fn exercise_every_method(wrap: impl FnOnce(Box<dyn ContextPolicy>) -> Box<dyn ContextPolicy>) -> Vec<&'static str> {
    let (inner, calls) = Recording::new();
    let mut policy = wrap(Box::new(inner));
    let tok = tokenizer();
    let owner = OwnerKey::tenant_own("tenant");
    let pool = small_pool();
    let req =
        AdmitRequest { owner: &owner, session: None, text: None, add_special: false, tokens: &[0, 0], tok: &tok, long_context_after: None };
    assert_eq!(policy.prepare(&req), Readiness::Now, "the recording policy admits everything now");
    let checkout = policy.admit(&req).expect("the recording policy admits everything");
    drop(checkout);
    let _ = policy.admission_bytes(&owner, 2, None);
    policy.pin_owner(&owner);
    policy.make_room(1);
    policy.verify_restore(PendingRestore::new(Ping));
    policy.retire(Retired {
        owner: owner.clone(),
        session_id: "recorded".into(),
        text: String::new(),
        tokens: Vec::new(),
        token_ends: Vec::new(),
        kv: SeqKv::new(&pool),
        cache: None,
        unfed: None,
    });
    policy.forget_owner(&owner);
    let _ = policy.stats();
    policy.control(PolicyControl::new(Ping)).expect("the recording policy takes a Ping");
    policy.idle_slice(&IdleInterrupt::never());
    let _ = policy.next_background();
    policy.background_done(BackgroundDone { owner: owner.clone(), tag: 0, outcome: Err("exercised".into()) });
    let calls = calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let missing: Vec<&str> = METHODS.iter().copied().filter(|m| !calls.contains(m)).collect();
    assert!(missing.is_empty(), "the wrapper did not forward {missing:?} to its inner policy (calls that arrived: {calls:?})");
    calls
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicyLayer;

    /// A wrapper that overrides nothing.
    struct Plain(Box<dyn ContextPolicy>);

    impl PolicyLayer for Plain {
        fn inner(&self) -> &dyn ContextPolicy {
            &*self.0
        }
        fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
            &mut *self.0
        }
    }

    /// A wrapper that swallows one method, as a hand-written forwarder that forgot it would.
    struct Forgetful(Box<dyn ContextPolicy>);

    impl PolicyLayer for Forgetful {
        fn inner(&self) -> &dyn ContextPolicy {
            &*self.0
        }
        fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
            &mut *self.0
        }
        fn idle_slice(&mut self, _interrupt: &IdleInterrupt) -> bool {
            false
        }
    }

    #[test]
    fn a_layer_forwards_every_method_by_default() {
        assert_eq!(exercise_every_method(|p| Box::new(Plain(p))), METHODS);
    }

    #[test]
    fn a_dropped_method_is_named() {
        let e = std::panic::catch_unwind(|| exercise_every_method(|p| Box::new(Forgetful(p)))).unwrap_err();
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("[\"idle_slice\"]"), "{msg}");
    }

    #[test]
    fn a_message_no_policy_takes_is_refused_with_its_name() {
        let (mut p, _) = Recording::new();
        let e = p.control(PolicyControl::new(42u8)).unwrap_err();
        assert_eq!(e, ControlError::NotAccepted { message: "u8" });
    }
}
