//! What a running sequence's attention reads and its tokens are written to: a paged
//! [`KvView`] (the policy's spans, then the sequence's own blocks) or a cache the policy built
//! that is not paged ([`SeqCache`], a sparse cache over KV offloaded to disk). The scheduler
//! batches both kinds in one `Model::forward` call; this is the one place it tells them apart.
//!
//! Invariant: an own cache is linear (slots are positions, no spans), decodes one token per
//! step unless it allows drafts, and charges its RAM to the pool itself; a paged view behaves
//! exactly as before this type existed.

use engram_kv::{KvError, KvPool, KvView, SeqCache, SeqKv};
use engram_model::KvCache;

/// A sequence's cache (module doc).
pub(super) enum SeqCacheSlot {
    /// Paged KV: spans, then the own sequence.
    Paged(KvView),
    /// A policy's own cache.
    Own(Box<dyn SeqCache>),
}

impl SeqCacheSlot {
    /// The cache a step's forward pass writes and reads.
    pub fn as_kv_cache(&mut self) -> &mut dyn KvCache {
        match self {
            SeqCacheSlot::Paged(v) => v,
            SeqCacheSlot::Own(c) => c.as_kv_cache(),
        }
    }

    /// The paged own sequence (`None` for an own cache).
    pub fn paged_mut(&mut self) -> Option<&mut SeqKv> {
        match self {
            SeqCacheSlot::Paged(v) => Some(v.own_mut()),
            SeqCacheSlot::Own(_) => None,
        }
    }

    /// The paged view (`None` for an own cache).
    pub fn view(&self) -> Option<&KvView> {
        match self {
            SeqCacheSlot::Paged(v) => Some(v),
            SeqCacheSlot::Own(_) => None,
        }
    }

    /// Where the sequence's own tokens start (0 for an own cache: it is linear).
    pub fn own_first_position(&self) -> usize {
        self.view().map_or(0, KvView::own_first_position)
    }

    /// Explicit positions of `n` tokens from own slot `first_slot` (`None`: slots are positions).
    pub fn step_positions(&self, first_slot: usize, n: usize) -> Option<Vec<u32>> {
        self.view().and_then(|v| v.step_positions(first_slot, n))
    }

    /// Keys in the whole view (what a key mask numbers).
    pub fn num_keys(&self) -> usize {
        match self {
            SeqCacheSlot::Paged(v) => v.num_keys(),
            SeqCacheSlot::Own(c) => c.len(),
        }
    }

    /// Keeps the first `n` own tokens; false when an own cache cannot (it must not be used on).
    pub fn truncate(&mut self, n: usize) -> bool {
        match self {
            SeqCacheSlot::Paged(v) => {
                v.own_mut().truncate(n);
                true
            }
            SeqCacheSlot::Own(c) => c.truncate(n),
        }
    }

    /// Whether this step may carry a tree of drafts.
    pub fn allows_drafts(&self) -> bool {
        match self {
            SeqCacheSlot::Paged(_) => true,
            SeqCacheSlot::Own(c) => c.allows_drafts(),
        }
    }

    /// Reserves room for `n` tokens; on a short pool, `Err(Some(bytes to free))` (what the
    /// policy's `make_room` is asked for before trying again), or `Err(None)` when freeing
    /// cannot help.
    pub fn try_reserve(&mut self, n: usize) -> Result<(), Option<usize>> {
        match self {
            SeqCacheSlot::Paged(v) => {
                let kv = v.own_mut();
                if kv.reserve(n).is_ok() {
                    return Ok(());
                }
                // Exactly what the reservation charges now (evicting can only lower it): a
                // bound above it could refuse a reservation that fits once idle caches are gone.
                Err(Some(kv.reserve_charge(n)))
            }
            SeqCacheSlot::Own(c) => match c.reserve(n) {
                Ok(()) => Ok(()),
                Err(KvError::OutOfMemory { needed, .. }) => Err(Some(needed)),
                Err(_) => Err(None),
            },
        }
    }

    /// What the sequence hands back at retirement: its own paged sequence (empty for an own
    /// cache) and its own cache, each holding exactly `n` tokens (an own cache that cannot be
    /// brought back to `n` is dropped).
    pub fn into_retired(self, pool: &KvPool, n: usize) -> (SeqKv, Option<Box<dyn SeqCache>>) {
        match self {
            SeqCacheSlot::Paged(v) => {
                let mut kv = v.into_own();
                // Drop blocks reserved past the end (a failed or unused reservation).
                kv.truncate(n);
                (kv, None)
            }
            SeqCacheSlot::Own(mut c) => {
                let keep = c.truncate(n);
                (SeqKv::new(pool), keep.then_some(c))
            }
        }
    }

    /// The prompt is in (an own cache prepares for decoding).
    pub fn prefilled(&mut self) {
        if let SeqCacheSlot::Own(c) = self {
            c.prefilled();
        }
    }

    /// Whether this is an own cache.
    pub fn is_own(&self) -> bool {
        matches!(self, SeqCacheSlot::Own(_))
    }
}
