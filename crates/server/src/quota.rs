//! Per-account request quota: one account (`engram_engine::scheduler::account`: an API
//! tenant with all its agents and users) has at most `limit` requests queued or running;
//! past it a 429 with `Retry-After`, so one account cannot fill the server-wide queue
//! (`SchedulerConfig::max_pending`) and lock every other account out.
//!
//! Invariant: an account's count is exactly its requests whose event sink the engine still
//! holds — a [`Slot`] travels inside the sink and gives its place back when the engine drops
//! it (job finished, failed, cancelled or expired), whatever the path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::ApiError;

/// Requests queued or running, per account.
pub(crate) struct Quota {
    limit: usize,
    counts: Mutex<HashMap<String, usize>>,
}

/// One request's place in its account's quota; released on drop.
pub(crate) struct Slot {
    quota: Arc<Quota>,
    account: String,
}

impl Quota {
    /// A quota of `limit` (at least 1) requests per account.
    pub(crate) fn new(limit: usize) -> Arc<Quota> {
        Arc::new(Quota { limit: limit.max(1), counts: Mutex::new(HashMap::new()) })
    }

    /// Takes a place for a request of `owner`'s account, or a 429 if the account is full.
    pub(crate) fn take(self: &Arc<Self>, owner: &str) -> Result<Slot, ApiError> {
        let account = engram_engine::scheduler::account(owner).to_string();
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(account.clone()).or_default();
        if *n >= self.limit {
            return Err(ApiError::overloaded(format!(
                "this account already has {} requests queued or running (the most one account may have); retry later",
                self.limit
            )));
        }
        *n += 1;
        Ok(Slot { quota: self.clone(), account })
    }

    /// Requests queued or running for `owner`'s account.
    #[cfg(test)]
    pub(crate) fn count(&self, owner: &str) -> usize {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(engram_engine::scheduler::account(owner)).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.quota.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.account) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.account);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_is_capped_across_its_owner_keys_and_places_come_back() {
        let q = Quota::new(2);
        let a = q.take("alice").unwrap();
        let b = q.take("alice\u{1f}agent:bot").unwrap();
        let e = q.take("alice\u{1f}user:x").err().expect("the third is refused");
        assert_eq!(e.status.as_u16(), 429);
        assert!(e.retry_after.is_some());
        assert!(q.take("bob").is_ok(), "another account is unaffected");
        drop(a);
        assert_eq!(q.count("alice"), 1);
        let _c = q.take("alice").unwrap();
        drop(b);
        assert_eq!(q.count("alice"), 1);
    }
}
