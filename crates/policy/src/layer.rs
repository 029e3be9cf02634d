//! [`PolicyLayer`]: the one way a wrapper policy composes with the policy it wraps. A wrapper
//! names its inner policy and overrides only the methods it changes; every other method
//! forwards to the inner policy by default, and every `PolicyLayer` is a
//! [`ContextPolicy`] through the blanket implementation below.
//!
//! ```text
//!  engine ──► NoReuse (admit overridden) ──► TreePolicy (admit, retire, make_room, idle) ──► SessionStore
//!              everything else forwards        everything else forwards
//! ```
//!
//! Invariant: a wrapper reaches its inner policy for every seam method it does not override.
//! A method added to [`ContextPolicy`] (which has no defaults) cannot compile until the
//! blanket implementation forwards it here, and its default here forwards to the inner
//! policy, so no wrapper drops it; `testing::exercise_every_method` checks it per wrapper.

use crate::{
    AdmitRequest, BackgroundDone, BackgroundJob, Checkout, ContextPolicy, ControlError, ControlReply, IdleInterrupt, OwnerKey,
    PendingRestore, PolicyControl, PolicyStats, Readiness, Retired,
};

/// A policy that wraps another. See the module doc.
pub trait PolicyLayer: Send {
    /// The wrapped policy.
    fn inner(&self) -> &dyn ContextPolicy;
    /// The wrapped policy, mutably.
    fn inner_mut(&mut self) -> &mut dyn ContextPolicy;

    /// [`ContextPolicy::prepare`]; forwards by default.
    fn prepare(&mut self, req: &AdmitRequest<'_>) -> Readiness {
        self.inner_mut().prepare(req)
    }
    /// [`ContextPolicy::admit`]; forwards by default.
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.inner_mut().admit(req)
    }
    /// [`ContextPolicy::admission_bytes`]; forwards by default.
    fn admission_bytes(&self, owner: &OwnerKey, prompt_tokens: usize, long_context_after: Option<usize>) -> Option<usize> {
        self.inner().admission_bytes(owner, prompt_tokens, long_context_after)
    }
    /// [`ContextPolicy::pin_owner`]; forwards by default.
    fn pin_owner(&mut self, owner: &OwnerKey) {
        self.inner_mut().pin_owner(owner)
    }
    /// [`ContextPolicy::make_room`]; forwards by default.
    fn make_room(&mut self, bytes: usize) -> bool {
        self.inner_mut().make_room(bytes)
    }
    /// [`ContextPolicy::verify_restore`]; forwards by default.
    fn verify_restore(&mut self, restore: PendingRestore) -> bool {
        self.inner_mut().verify_restore(restore)
    }
    /// [`ContextPolicy::retire`]; forwards by default.
    fn retire(&mut self, retired: Retired) {
        self.inner_mut().retire(retired)
    }
    /// [`ContextPolicy::forget_owner`]; forwards by default.
    fn forget_owner(&mut self, owner: &OwnerKey) {
        self.inner_mut().forget_owner(owner)
    }
    /// [`ContextPolicy::stats`]; forwards by default.
    fn stats(&self) -> PolicyStats {
        self.inner().stats()
    }
    /// [`ContextPolicy::control`]; forwards by default (a wrapper that takes messages of its
    /// own type hands the others on).
    fn control(&mut self, msg: PolicyControl) -> Result<ControlReply, ControlError> {
        self.inner_mut().control(msg)
    }
    /// [`ContextPolicy::idle_slice`]; forwards by default.
    fn idle_slice(&mut self, interrupt: &IdleInterrupt) -> bool {
        self.inner_mut().idle_slice(interrupt)
    }
    /// [`ContextPolicy::next_background`]; forwards by default.
    fn next_background(&mut self) -> Option<BackgroundJob> {
        self.inner_mut().next_background()
    }
    /// [`ContextPolicy::background_done`]; forwards by default.
    fn background_done(&mut self, done: BackgroundDone) {
        self.inner_mut().background_done(done)
    }
}

impl<L: PolicyLayer> ContextPolicy for L {
    fn prepare(&mut self, req: &AdmitRequest<'_>) -> Readiness {
        PolicyLayer::prepare(self, req)
    }
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        PolicyLayer::admit(self, req)
    }
    fn admission_bytes(&self, owner: &OwnerKey, prompt_tokens: usize, long_context_after: Option<usize>) -> Option<usize> {
        PolicyLayer::admission_bytes(self, owner, prompt_tokens, long_context_after)
    }
    fn pin_owner(&mut self, owner: &OwnerKey) {
        PolicyLayer::pin_owner(self, owner)
    }
    fn make_room(&mut self, bytes: usize) -> bool {
        PolicyLayer::make_room(self, bytes)
    }
    fn verify_restore(&mut self, restore: PendingRestore) -> bool {
        PolicyLayer::verify_restore(self, restore)
    }
    fn retire(&mut self, retired: Retired) {
        PolicyLayer::retire(self, retired)
    }
    fn forget_owner(&mut self, owner: &OwnerKey) {
        PolicyLayer::forget_owner(self, owner)
    }
    fn stats(&self) -> PolicyStats {
        PolicyLayer::stats(self)
    }
    fn control(&mut self, msg: PolicyControl) -> Result<ControlReply, ControlError> {
        PolicyLayer::control(self, msg)
    }
    fn idle_slice(&mut self, interrupt: &IdleInterrupt) -> bool {
        PolicyLayer::idle_slice(self, interrupt)
    }
    fn next_background(&mut self) -> Option<BackgroundJob> {
        PolicyLayer::next_background(self)
    }
    fn background_done(&mut self, done: BackgroundDone) {
        PolicyLayer::background_done(self, done)
    }
}
