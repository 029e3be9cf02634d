//! Repairs of reused KV ([`engram_policy::Repair`]): a checkout whose KV holds tokens computed
//! in another context (document chunks prefilled on their own, moved into place) names the
//! moved slots and a ratio; the engine recomputes them with [`crate::blend()`] as the
//! sequence's first work, inside a step, before the rest of its prompt is prefilled.
//!
//! ```text
//!  admit:  Checkout { kv, reused, repair: Some(moved, ratio) } ─► checked (paged, linear, no
//!          restore), the moved slots clipped to the reused tokens ─► Seq { repair }
//!  step:   the first sequence with a repair ─► blend(kv, tokens, moved, ratio) (probe + recompute)
//!          ok ─► it prefills from the next step's chunk on, like any sequence
//!          error / panic ─► that sequence fails with its error (its KV is never kept);
//!                           the rest of the batch goes on in this very step
//! ```
//! One repair a step: decoders wait for at most one sequence's recomputation per step, as
//! they wait for at most one prefill chunk.
//!
//! Invariant: a sequence with a pending repair is never prefilled, decoded or checked in
//! before its repair ends, so its answer is computed over the repaired KV (with ratio 1 the
//! cold prefill's: `crates/server/tests/it/rag_blend.rs`).

use std::panic::{catch_unwind, AssertUnwindSafe};

use engram_policy::Repair;

use super::{Engine, JobError, JobErrorKind, SeqCacheSlot};
use crate::error::EngineError;

/// A checkout's repair as the engine keeps it: refused when its KV is not paged, linear and
/// verified (spans before it, a start past its spans, a restore still being checked, a cache
/// of the policy's own), its moved slots clipped to the `cached` tokens the sequence keeps
/// (slots past them are prefilled anyway, exactly). `None`: nothing to repair.
pub(super) fn checked(repair: Option<Repair>, kv: &SeqCacheSlot, restoring: bool, cached: usize) -> Result<Option<Repair>, &'static str> {
    let Some(mut r) = repair else { return Ok(None) };
    let linear = kv.view().is_some_and(|v| v.spans().is_empty() && v.own_first_position() == 0);
    if !linear || restoring {
        return Err(
            "the context policy asked to repair KV that is not its own linear paged cache (spans, a restore or a cache of its own)",
        );
    }
    r.moved = r.moved.into_iter().map(|m| m.start.min(cached)..m.end.min(cached)).filter(|m| !m.is_empty()).collect();
    Ok((!r.moved.is_empty()).then_some(r))
}

impl Engine<'_> {
    /// Runs the pending repair of the first sequence that has one (this step's repair; see the
    /// module doc). A repair that fails retires its sequence with the error; one that panics
    /// is an engine fault of that sequence alone.
    pub(super) fn repair_next(&mut self) {
        let Some(at) = self.active.iter().position(|s| s.repair.is_some()) else { return };
        let r = self.active[at].repair.take().expect("found above");
        let model = self.model;
        let s = &mut self.active[at];
        let span = tracing::debug_span!("blend", seq = s.id, ratio = r.ratio, ranges = r.moved.len()).entered();
        let result = catch_unwind(AssertUnwindSafe(|| {
            let Some(kv) = s.kv.paged_mut() else {
                return Err(EngineError::Failed("a repair needs paged KV".into()));
            };
            crate::blend(model, kv, &s.tokens, &r.moved, r.ratio)
        }));
        drop(span);
        match result {
            Ok(Ok(report)) => {
                tracing::debug!(moved = report.moved_tokens, recomputed = report.recomputed_tokens, "reused KV repaired");
            }
            Ok(Err(e)) => {
                let kind = if matches!(e, EngineError::BadRequest(_)) { JobErrorKind::BadRequest } else { JobErrorKind::Internal };
                // Half-rewritten KV is never kept: the sequence retires holding nothing.
                let s = &mut self.active[at];
                s.tokens.clear();
                s.kv.truncate(0);
                self.retire(at, Err(JobError::new(kind, format!("repairing the reused KV: {e}"))));
            }
            Err(panic) => {
                let message = self.fault(&*panic, "a KV repair");
                self.retire_faulted(at, &message);
            }
        }
    }
}
