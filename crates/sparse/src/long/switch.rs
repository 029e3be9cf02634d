//! The switch from exact paged KV to a sparse cache: a checkout whose history passed the
//! threshold gets a [`LongKv`] holding the same tokens. The rows the exact cache already
//! computed are copied (keys are stored rotated at their positions, so a copy is what a
//! prefill would have written, rounded to f16), chunk by chunk through the bounded prefill,
//! so the file takes what passes the RAM budget as it goes; nothing is recomputed.
//!
//! Invariant: the cache returned holds exactly the first `copied` tokens of the checkout,
//! `copied < tokens.len()` (the last prompt token is always computed, its logits start the
//! answer); on any error no file is left and the caller keeps the exact checkout.

use engram_kv::{KvPool, SeqCache, SeqKv};
use engram_model::{KvCache, ModelConfig};

use super::LongKv;
use crate::offload::OffloadConfig;
use crate::{SparseConfig, SparseKv};

/// Tokens copied per reservation (as a prefill chunk would write them).
const COPY_CHUNK: usize = 256;

/// A sparse cache for a sequence of `total` tokens whose first `reused` are in `exact`: the
/// cache and how many tokens it holds.
pub(super) fn switch(
    model: &ModelConfig,
    sparse: SparseConfig,
    off: OffloadConfig,
    pool: &KvPool,
    exact: &SeqKv,
    reused: usize,
    total: usize,
) -> Result<(LongKv, usize), String> {
    let mut long = LongKv::new(SparseKv::new(model, Some(sparse)), off, pool).map_err(|e| e.to_string())?;
    // Moved positions (spans placed elsewhere) are not a linear sequence: prefill instead.
    let copy = if exact.has_moved_positions() { 0 } else { reused.min(total.saturating_sub(1)).min(exact.len()) };
    let mut at = 0;
    while at < copy {
        let end = (at + COPY_CHUNK).min(copy);
        long.reserve(end - at).map_err(|e| format!("the sparse cache's RAM does not fit the KV budget: {e}"))?;
        for layer in 0..model.num_layers {
            let (k, v) = exact.read_rows(layer, at..end);
            long.write(layer, at, &k, &v, end - at);
        }
        at = end;
    }
    if let Some(e) = long.read_failure() {
        return Err(e);
    }
    Ok((long, copy))
}
