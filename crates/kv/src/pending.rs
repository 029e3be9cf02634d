//! `PendingRows`: one block's rows that are not in RAM yet — on disk, say (a sparse cache's
//! offloaded clusters) — which a view's reader asks for layer by layer and is handed when they arrive.
//!
//! The first reader of a layer *asks* (the `request` callback, once per layer: start reading
//! it, or queue it behind the layers already in flight), then waits until a fetcher
//! [`PendingRows::fill`]s it. A fetcher may also fill layers before anyone asks (layer-ahead
//! prefetch). Invariant: a layer's rows, once filled, never change, and a reader sees either
//! nothing (it waits) or all of a layer's keys and values; the block's bytes are charged to the
//! pool from creation to drop, so fetching can never push the pool past its budget.

use std::sync::{Arc, Condvar, Mutex};

use crate::error::KvError;
use crate::pool::KvPool;

/// One layer's slot: its key section then its value section, once filled.
type Layer = (Mutex<Option<Arc<[u8]>>>, Condvar);

/// A block's rows arriving layer by layer. Shared (`Arc`) by the views that read it and the
/// fetcher that fills it.
pub struct PendingRows {
    pool: KvPool,
    layers: Vec<Layer>,
    asked: Mutex<Vec<bool>>,
    request: Box<dyn Fn(usize) + Send + Sync>,
}

impl PendingRows {
    /// Rows of one block of `pool`'s format, none in RAM yet; `request(layer)` is called the
    /// first time a reader needs `layer`. Charges a block's bytes (or fails, changing nothing).
    pub fn new(pool: &KvPool, request: impl Fn(usize) + Send + Sync + 'static) -> Result<Arc<PendingRows>, KvError> {
        pool.try_charge(pool.block_bytes())?;
        let n = pool.layout().num_layers;
        Ok(Arc::new(PendingRows {
            pool: pool.clone(),
            layers: (0..n).map(|_| (Mutex::new(None), Condvar::new())).collect(),
            asked: Mutex::new(vec![false; n]),
            request: Box::new(request),
        }))
    }

    /// Delivers `layer`'s rows: its key section then its value section, each
    /// [`KvPool::section_bytes`] long, laid out as in a block. Panics on another length or a
    /// second fill of the same layer.
    pub fn fill(&self, layer: usize, sections: &[u8]) {
        assert_eq!(sections.len(), 2 * self.pool.section_bytes(), "PendingRows::fill: one layer's key and value sections");
        let (slot, arrived) = &self.layers[layer];
        let mut s = slot.lock().expect("a fetcher panicked");
        assert!(s.is_none(), "PendingRows::fill: layer {layer} filled twice");
        *s = Some(sections.into());
        arrived.notify_all();
    }

    /// Whether `layer` is in RAM.
    pub fn is_filled(&self, layer: usize) -> bool {
        self.layers[layer].0.lock().expect("a fetcher panicked").is_some()
    }

    /// `layer`'s key and value sections, asking for them first if nobody has, and waiting
    /// until they arrive.
    pub(crate) fn wait(&self, layer: usize) -> Arc<[u8]> {
        let ask = {
            let mut asked = self.asked.lock().expect("a reader panicked");
            !std::mem::replace(&mut asked[layer], true)
        };
        if ask && !self.is_filled(layer) {
            (self.request)(layer);
        }
        let (slot, arrived) = &self.layers[layer];
        let mut s = slot.lock().expect("a fetcher panicked");
        while s.is_none() {
            s = arrived.wait(s).expect("a fetcher panicked");
        }
        s.as_ref().expect("filled").clone()
    }
}

impl Drop for PendingRows {
    fn drop(&mut self) {
        self.pool.release(self.pool.block_bytes());
    }
}
