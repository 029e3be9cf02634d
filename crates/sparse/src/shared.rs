//! [`SharedIndex`]: one (layer, KV head)'s index as the live cache holds it, shared copy on
//! write with the snapshots of pending saves (`crate::persist`), so that a save takes a
//! reference to the index instead of a copy of it (the index grows with the history: about
//! 9 bytes a token per head).
//!
//! Invariant: a snapshot's reference sees the index exactly as it was when the snapshot was
//! taken; [`SharedIndex::make_mut`] copies the index first whenever a snapshot still holds it,
//! so the live cache's later changes never reach the snapshot, and it copies nothing when no
//! snapshot holds it (the common case: a save is written before the conversation's next turn).

use std::ops::Deref;
use std::sync::Arc;

use crate::method::HeadIndex;

/// One head's index, shared copy on write (module doc).
#[derive(Clone)]
pub(crate) struct SharedIndex(Arc<dyn HeadIndex>);

impl SharedIndex {
    /// Holds `index`, shared by nobody yet.
    pub fn new(index: Box<dyn HeadIndex>) -> SharedIndex {
        SharedIndex(Arc::from(index))
    }

    /// The index to change: this handle's own, copied first if a snapshot shares it.
    pub fn make_mut(&mut self) -> &mut dyn HeadIndex {
        if Arc::get_mut(&mut self.0).is_none() {
            self.0 = Arc::from(self.0.clone_box());
        }
        Arc::get_mut(&mut self.0).expect("an index just copied has one holder")
    }
}

impl Deref for SharedIndex {
    type Target = dyn HeadIndex;

    fn deref(&self) -> &(dyn HeadIndex + 'static) {
        &*self.0
    }
}
