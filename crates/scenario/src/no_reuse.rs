//! A context policy that never reuses KV: the default session store decides each prompt's
//! tokens (so they are exactly those a caching run would feed), then the cache it would
//! reuse is dropped and every token is computed. It is the "caching disabled" side of the
//! scenario tests and the re-prefilling baseline of `engram bench scenario`.
//!
//! Invariant: every checkout it returns reuses nothing (`reused == 0`, an empty cache).

use engram_context::{Checkout, MatchKind, PendingRestore};
use engram_engine::{ContextPolicy, PolicyStats, Retired};
use engram_tokenizer::Tokenizer;

/// Wraps a policy so that nothing it keeps is reused. See the module doc.
pub struct NoReuse(pub Box<dyn ContextPolicy>);

impl ContextPolicy for NoReuse {
    fn admit(
        &mut self,
        owner: &str,
        session: Option<&str>,
        text: Option<&str>,
        add_special: bool,
        prompt: &[u32],
        tok: &Tokenizer,
    ) -> Result<Checkout, String> {
        let mut c = self.0.admit(owner, session, text, add_special, prompt, tok)?;
        if let Some(r) = c.restore.take() {
            self.0.verify_restore(r);
        }
        c.kv.truncate(0);
        c.reused = 0;
        c.spans.clear();
        c.kind = MatchKind::Miss;
        Ok(c)
    }
    fn pin_owner(&mut self, owner: &str) {
        self.0.pin_owner(owner)
    }
    fn make_room(&mut self, bytes: usize) -> bool {
        self.0.make_room(bytes)
    }
    fn verify_restore(&mut self, r: PendingRestore) -> bool {
        self.0.verify_restore(r)
    }
    fn retire(&mut self, r: Retired) {
        self.0.retire(r)
    }
    fn forget_owner(&mut self, owner: &str) {
        self.0.forget_owner(owner)
    }
    fn stats(&self) -> PolicyStats {
        self.0.stats()
    }
}
