//! The session store behind the engine's context-policy seam: [`SessionStore`] is the default
//! [`ContextPolicy`] (sessions matched by characters, the shared prefix index, the disk tier,
//! one RAM eviction path).
//!
//! Invariant: the seam's typed owner keys reach the store as their text form
//! ([`OwnerKey::as_str`]), the form its sessions and files are keyed by, so a key names the
//! same sessions before and after a restart.

use engram_policy::{
    AdmitRequest, BackgroundDone, BackgroundJob, Checkout, ContextPolicy, ControlError, ControlReply, GaugeKind, IdleInterrupt, OwnerKey,
    PendingRestore, PolicyControl, PolicyGauge, PolicyStats, Readiness, Retired,
};

use crate::SessionStore;

impl ContextPolicy for SessionStore {
    fn prepare(&mut self, _req: &AdmitRequest<'_>) -> Readiness {
        Readiness::Now
    }
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        let owner = req.owner.as_str();
        match req.text {
            Some(text) => self.checkout(owner, req.session, text, req.add_special, req.tok).map_err(|e| e.to_string()),
            None => Ok(self.checkout_tokens(owner, req.session, req.tokens)),
        }
    }

    /// Sessions are paged KV: the pool's own count, or with sliding layers what a prompt's
    /// cache holds once those layers release outside their window ([`SessionStore::admission_bytes`]).
    fn admission_bytes(&self, _owner: &OwnerKey, prompt_tokens: usize, _long_context_after: Option<usize>) -> Option<usize> {
        SessionStore::admission_bytes(self, prompt_tokens)
    }

    fn pin_owner(&mut self, owner: &OwnerKey) {
        SessionStore::pin_owner(self, owner.as_str())
    }

    fn make_room(&mut self, bytes: usize) -> bool {
        SessionStore::make_room(self, bytes)
    }

    fn verify_restore(&mut self, restore: PendingRestore) -> bool {
        SessionStore::verify_restore(self, restore)
    }

    fn retire(&mut self, r: Retired) {
        self.checkin(r.owner.as_str(), &r.session_id, r.text, r.tokens, r.token_ends, r.kv)
    }

    fn forget_owner(&mut self, owner: &OwnerKey) {
        SessionStore::forget_owner(self, owner.as_str())
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            sessions_idle: self.len() as u64,
            sessions_on_disk: self.on_disk_count() as u64,
            sessions_restored: self.restored_count(),
            disk_bytes_used: self.disk_used_bytes(),
            named: vec![PolicyGauge {
                name: "engram_disk_saves_shed_total",
                help: "Session saves dropped before the disk writer reached them, to free RAM for running requests.",
                kind: GaugeKind::Counter,
                value: self.saves_shed(),
            }],
        }
    }

    /// The store has no messages of its own.
    fn control(&mut self, msg: PolicyControl) -> Result<ControlReply, ControlError> {
        Err(msg.refuse())
    }

    /// Sessions are persisted as they retire; nothing waits for idle time.
    fn idle_slice(&mut self, _interrupt: &IdleInterrupt) -> bool {
        false
    }

    /// Sessions need no forward work besides their requests'.
    fn next_background(&mut self) -> Option<BackgroundJob> {
        None
    }

    fn background_done(&mut self, _done: BackgroundDone) {}
}
