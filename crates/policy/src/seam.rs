//! The [`ContextPolicy`] trait: what a job reuses, what is kept, evicted and persisted, decided
//! outside the scheduler. The scheduler calls a policy at admission ([`ContextPolicy::prepare`],
//! then [`ContextPolicy::admit`]),
//! before growing a sequence ([`ContextPolicy::make_room`]), at retirement
//! ([`ContextPolicy::retire`]) and, when no job is waiting or running, for background work in
//! slices ([`ContextPolicy::idle_slice`]); forward work a policy needs (a state entry, a
//! summary) it asks the engine for ([`ContextPolicy::next_background`]) and gets back
//! ([`ContextPolicy::background_done`]), so only the engine runs the model. Anything only one policy understands travels as a
//! typed message through [`ContextPolicy::control`].
//!
//! Invariant: a checkout's cache holds exactly `tokens[..reused]` (what the policy promises
//! the scheduler); a policy builds caches only through `engram-kv`.
//!
//! NOTE: the trait has no default methods on purpose. A method added here fails to compile in
//! [`crate::PolicyLayer`]'s blanket implementation until it forwards, so a wrapper can never
//! drop it silently; each leaf policy says what it does with it.

use crate::{
    AdmitRequest, BackgroundDone, BackgroundJob, Checkout, ControlError, ControlReply, IdleInterrupt, OwnerKey, PendingRestore,
    PolicyControl, PolicyStats, Readiness, Retired,
};

/// Decides what each sequence reuses and what is kept. See the module doc.
pub trait ContextPolicy: Send {
    /// Whether the request can be admitted now, asked just before [`ContextPolicy::admit`]:
    /// a policy whose checkout needs KV it has not computed yet (a user's persistent stream,
    /// a document chunk) queues that as background jobs the request waits on and answers
    /// [`Readiness::AfterBackground`], so the engine computes it in its step instead of the
    /// policy at admission. Asked again once those jobs end; a policy answers `Now` when the
    /// work it waited on failed (its `admit` then says why).
    fn prepare(&mut self, req: &AdmitRequest<'_>) -> Readiness;

    /// What the request's owner reuses for its prompt: a prompt given as text is matched by
    /// characters (`add_special` is how it tokenizes cold), one given as token ids by tokens.
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String>;

    /// The most KV pool bytes admitting a prompt of `prompt_tokens` tokens for `owner` will
    /// take when this policy holds such a sequence otherwise than in whole pool blocks (a sparse
    /// cache charged by its RAM, blocks whose sliding layers are released outside their
    /// window); `None`: the pool's `bytes_for(prompt_tokens)`. `long_context_after`
    /// is the request's own threshold for going sparse ([`AdmitRequest::long_context_after`]). The scheduler
    /// checks this against the budget before [`ContextPolicy::admit`].
    fn admission_bytes(&self, owner: &OwnerKey, prompt_tokens: usize, long_context_after: Option<usize>) -> Option<usize>;

    /// `owner`'s saved state is pinned on disk (a named agent's).
    fn pin_owner(&mut self, owner: &OwnerKey);

    /// Frees RAM until `bytes` more fit the KV budget; whether they do.
    fn make_room(&mut self, bytes: usize) -> bool;

    /// Waits for a restored file's checksum; true if it is sound (see [`Checkout::restore`]).
    /// A restore this policy did not make is not sound to it (false).
    fn verify_restore(&mut self, restore: PendingRestore) -> bool;

    /// Keeps (or drops) a finished sequence.
    fn retire(&mut self, retired: Retired);

    /// Drops everything kept for `owner`, in RAM and on disk.
    fn forget_owner(&mut self, owner: &OwnerKey);

    /// Gauges for metrics.
    fn stats(&self) -> PolicyStats;

    /// Applies a message only some policy understands (its own type inside the
    /// [`PolicyControl`]): a policy that does not know the message hands it on (a wrapper, to
    /// its inner policy) or refuses it with [`PolicyControl::refuse`].
    fn control(&mut self, msg: PolicyControl) -> Result<ControlReply, ControlError>;

    /// Runs one slice of background work (precomputing a likely next prompt, compacting,
    /// prefetching) while nothing waits: short enough that a job arriving meanwhile waits at
    /// most this one slice, and a long slice checks `interrupt` between its own steps and
    /// returns early when it is requested. Returns whether more work remains.
    fn idle_slice(&mut self, interrupt: &IdleInterrupt) -> bool;

    /// The next forward work this policy wants the engine to run (asked before every
    /// admission; `None`: nothing now). See [`BackgroundJob`].
    fn next_background(&mut self) -> Option<BackgroundJob>;

    /// A job from [`ContextPolicy::next_background`] ended (every job ends exactly once).
    fn background_done(&mut self, done: BackgroundDone);
}
