//! With `--context dual` and `--kv-remote`: a user's fact log and each thread's state entry
//! follow the user to any replica, through the remote tier's stamped records
//! (`engram_remote::StampedRecord`, per tenant, newest stamp wins).
//!
//! ```text
//!  a change here (a fact added, tombstoned, forgotten; a request's `state`)
//!      └─► the new version, stamped ──► the tier's writer thread (behind the request)
//!  before each dual-stream turn and each facts request
//!      └─► one pipelined read of the user's log (and the thread's state): a newer version
//!          than this replica's replaces it (the facts re-sent to the engine, the stream
//!          prefilled from them; the state entry set on the thread)
//! ```
//! Rings and persistent-stream KV stay local to a replica: a thread's earlier turns are not in
//! the tier, and the stream is prefilled again from the facts on a replica that had not seen
//! them.
//!
//! Invariant: nothing here writes to the store on a request's path (writes are queued); a read
//! is one round trip bounded by the tier's timeout, and a store that is down or a value that
//! fails its check is a miss (counted in `engram_remote_*`): the replica answers from what it
//! has.

use std::collections::HashMap;
use std::sync::Mutex;

use engram_dual::FactLog;
use engram_remote::{next_stamp, RemoteTier};

/// The record kind of a user's fact log.
const FACTS_KIND: &str = "dual-facts";
/// The record kind of a thread's state entry.
const STATE_KIND: &str = "dual-state";
/// Threads whose state stamp this replica remembers; past it the map starts again (a thread
/// then sets its state entry from the tier once more: a few tokens of prefill).
const MAX_THREADS: usize = 1 << 16;

/// A thread's state entry as the tier keeps it.
#[derive(serde::Serialize, serde::Deserialize)]
struct StateBody {
    /// The entry's text (empty: removed).
    text: String,
}

/// The user's log and the thread's state entry read from the tier for one turn.
pub(crate) struct Pulled {
    /// The tier's version of the user's log, if any.
    pub facts: Option<FactLog>,
    /// The thread's state entry text and its stamp, if the tier has one.
    pub state: Option<(String, u64)>,
}

/// The shared tier and the stamps of the state entries this replica has set.
pub(crate) struct DualSync {
    tier: RemoteTier,
    /// Per (owner, thread), the stamp of the state entry last set here.
    states: Mutex<HashMap<(String, String), u64>>,
}

/// A thread's record name: the owner and the thread, length-prefixed so no two pairs meet.
fn thread_name(owner: &str, thread: &str) -> String {
    format!("{}:{owner}{thread}", owner.len())
}

impl DualSync {
    /// Syncing through `tier`.
    pub fn new(tier: RemoteTier) -> DualSync {
        DualSync { tier, states: Mutex::new(HashMap::new()) }
    }

    /// The tier's versions of `tenant`'s `owner`'s log and (with `thread`) that thread's state
    /// entry: one round trip. Nothing on a miss, a failed read or a value that fails its check.
    pub fn pull(&self, tenant: &str, owner: &str, thread: Option<&str>) -> Pulled {
        let name = thread.map(|t| thread_name(owner, t));
        let mut wanted = vec![(FACTS_KIND, owner)];
        if let Some(n) = &name {
            wanted.push((STATE_KIND, n.as_str()));
        }
        let Some(mut got) = self.tier.get_stamped(tenant, &wanted) else { return Pulled { facts: None, state: None } };
        let state = got.get_mut(1).and_then(Option::take).and_then(|r| match serde_json::from_str::<StateBody>(&r.body) {
            Ok(b) => Some((b.text, r.stamp)),
            Err(e) => {
                tracing::warn!("remote state entry of a thread: {e}; ignored");
                None
            }
        });
        let facts = got.first_mut().and_then(Option::take).and_then(|r| match serde_json::from_str::<FactLog>(&r.body) {
            Ok(log) => Some(log),
            Err(e) => {
                tracing::warn!("remote fact log: {e}; ignored");
                None
            }
        });
        Pulled { facts, state }
    }

    /// Queues `log` as `tenant`'s `owner`'s newest log.
    pub fn push_facts(&self, tenant: &str, owner: &str, log: &FactLog) {
        let body = serde_json::to_string(log).expect("a fact log serializes");
        self.tier.put_stamped(tenant, FACTS_KIND, owner, log.stamp, body);
    }

    /// Queues `text` (empty: removed) as the state entry of `tenant`'s `owner`'s `thread`, set
    /// here now, stamped past `seen` (the tier's version read for this turn).
    pub fn push_state(&self, tenant: &str, owner: &str, thread: &str, text: &str, seen: Option<u64>) {
        let key = (owner.to_string(), thread.to_string());
        let stamp = {
            let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
            let stamp = next_stamp(seen.unwrap_or(0).max(states.get(&key).copied().unwrap_or(0)));
            remember(&mut states, key, stamp);
            stamp
        };
        let body = serde_json::to_string(&StateBody { text: text.to_string() }).expect("a state entry serializes");
        self.tier.put_stamped(tenant, STATE_KIND, &thread_name(owner, thread), stamp, body);
    }

    /// Whether the tier's state entry stamped `stamp` of `owner`'s `thread` is newer than the
    /// one this replica set last; if so it is remembered as set (the caller sets it).
    pub fn take_newer_state(&self, owner: &str, thread: &str, stamp: u64) -> bool {
        let key = (owner.to_string(), thread.to_string());
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        if states.get(&key).is_some_and(|&here| here >= stamp) {
            return false;
        }
        remember(&mut states, key, stamp);
        true
    }
}

fn remember(states: &mut HashMap<(String, String), u64>, key: (String, String), stamp: u64) {
    if states.len() >= MAX_THREADS && !states.contains_key(&key) {
        states.clear();
    }
    states.insert(key, stamp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_names_do_not_meet() {
        assert_ne!(thread_name("ab", "c"), thread_name("a", "bc"));
    }
}
