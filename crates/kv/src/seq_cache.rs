//! [`SeqCache`]: a sequence's KV that is not a paged [`crate::KvView`] — a cache a context
//! policy builds (a sparse cache over KV offloaded to disk, say) and hands the scheduler in a
//! checkout. The scheduler drives it only through this trait: it runs the model on it (it is
//! a [`KvCache`]), reserves room before each step, asks its length and RAM, truncates it,
//! tells it when its prompt is in, and hands it back to the policy at retirement, which
//! takes it back by type ([`SeqCache::into_any`]).
//!
//! Invariant: slots are positions (a linear sequence from position 0): a step on it writes its
//! tokens at `len()..`; after a successful `reserve(n)` the next step of at most `n` tokens
//! does not fail for lack of room; the RAM it holds is charged to the KV pool's budget by the
//! cache itself (a [`crate::PoolCharge`]), so the pool's `used` counts it.

use std::any::Any;

use engram_model::KvCache;

use crate::KvError;

/// A sequence cache a policy builds and the scheduler drives (module doc).
pub trait SeqCache: KvCache + Any {
    /// Tokens stored (every layer holds them).
    fn len(&self) -> usize;

    /// True when no token is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for `n` more tokens, charged to the pool: on [`KvError::OutOfMemory`] nothing
    /// changed, and `needed` is what the pool is short (the scheduler frees that much through
    /// the policy and asks again).
    fn reserve(&mut self, n: usize) -> Result<(), KvError>;

    /// Keeps the first `n` tokens; false when the cache cannot drop tokens it holds (then it
    /// must not be used further: the scheduler drops it).
    fn truncate(&mut self, n: usize) -> bool;

    /// Whether steps may carry trees of drafts (several tokens with a key mask) once the
    /// prompt is in; false: the scheduler decodes this sequence one token per step.
    fn allows_drafts(&self) -> bool;

    /// RAM bytes it holds now (what its pool charge covers).
    fn ram_bytes(&self) -> usize;

    /// The prompt is in: from the next step on the sequence decodes (a sparse cache builds its
    /// index here). Called once per request, after the step that stored the last prompt token.
    fn prefilled(&mut self);

    /// Why it cannot go on (a failed read of its disk tier), once that happened.
    fn failure(&self) -> Option<String> {
        self.read_failure()
    }

    /// The cache as `Any`, for the policy that made it to take it back by type.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;

    /// The cache as the model's [`KvCache`] (what a step's forward pass writes and reads).
    fn as_kv_cache(&mut self) -> &mut dyn KvCache;
}
