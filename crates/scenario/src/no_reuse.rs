//! A context policy that never reuses KV: the default session store decides each prompt's
//! tokens (so they are exactly those a caching run would feed), then the cache it would
//! reuse is dropped and every token is computed. It is the "caching disabled" side of the
//! scenario tests and the re-prefilling baseline of `engram bench scenario`.
//!
//! Invariant: every checkout it returns reuses nothing (`reused == 0`, an empty cache); every
//! other seam method reaches the wrapped policy unchanged (a [`PolicyLayer`]).

use engram_policy::{AdmitRequest, Checkout, ContextPolicy, MatchKind, PolicyLayer};

/// Wraps a policy so that nothing it keeps is reused. See the module doc.
pub struct NoReuse(pub Box<dyn ContextPolicy>);

impl PolicyLayer for NoReuse {
    fn inner(&self) -> &dyn ContextPolicy {
        &*self.0
    }

    fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
        &mut *self.0
    }

    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        let mut c = self.0.admit(req)?;
        if let Some(r) = c.restore.take() {
            self.0.verify_restore(r);
        }
        c.kv.truncate(0);
        c.reused = 0;
        c.spans.clear();
        c.kind = MatchKind::Miss;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seam_method_reaches_the_wrapped_policy() {
        engram_policy::testing::exercise_every_method(|inner| Box::new(NoReuse(inner)));
    }
}
