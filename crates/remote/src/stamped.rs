//! Stamped records: small values that any replica may overwrite (a user's fact log, a thread's
//! state entry), where the newest stamp wins on every replica whatever order the writes reach
//! the store.
//!
//! ```text
//!  engram:v1:t:<tenant tag>:doc:<kind>:<name hash>    a sorted set: one member, the sealed value
//!  write (writer thread):  ZADD key <stamp> <value>; ZREMRANGEBYRANK key 0 -2
//!  read:                   ZRANGE key -1 -1          (one pipelined trip for several keys)
//! ```
//! The score is the writer's stamp (microseconds since the epoch, or one past the stamp it
//! replaced; exact in a double up to 2^53). Each write adds its member and then keeps only the
//! highest-scored one, so two replicas writing at once leave the higher stamp in the store in
//! any interleaving of their commands (ties go to the greater value bytes, the same everywhere).
//!
//! Invariant: [`StampedRecord::open`] returns a record only if its envelope is sound and it is
//! exactly the tenant's record of that kind and name; anything else is a miss, counted.

use engram_kv::envelope;
use serde::{Deserialize, Serialize};

const MAGIC: &str = "engram-remote-stamped";
const VERSION: u32 = 1;

/// One version of a stamped record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StampedRecord {
    pub tenant: String,
    pub kind: String,
    pub name: String,
    /// Which version: a higher stamp replaces a lower one.
    pub stamp: u64,
    /// The caller's JSON.
    pub body: String,
}

impl StampedRecord {
    /// The sealed bytes.
    pub fn seal(&self) -> Vec<u8> {
        envelope::seal(MAGIC, VERSION, &serde_json::to_vec(self).expect("a record serializes"))
    }

    /// The record in `bytes` if it is sound and is `tenant`'s record `name` of kind `kind`.
    pub fn open(bytes: &[u8], tenant: &str, kind: &str, name: &str) -> Result<StampedRecord, String> {
        let body = envelope::open(bytes, MAGIC, VERSION).map_err(|e| e.to_string())?;
        let r: StampedRecord = serde_json::from_slice(body).map_err(|e| format!("stamped record: {e}"))?;
        if r.tenant != tenant || r.kind != kind || r.name != name {
            return Err("stamped record of another tenant, kind or name".into());
        }
        Ok(r)
    }
}

/// The stamp of a new version now: microseconds since the epoch, or one past `after` (the
/// version it replaces) when the clock is not past it.
pub fn next_stamp(after: u64) -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    now.max(after.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamped_records_open_only_for_what_was_asked() {
        let r = StampedRecord { tenant: "t".into(), kind: "facts".into(), name: "u".into(), stamp: 7, body: "{}".into() };
        let bytes = r.seal();
        assert_eq!(StampedRecord::open(&bytes, "t", "facts", "u").unwrap(), r);
        assert!(StampedRecord::open(&bytes, "t2", "facts", "u").is_err());
        assert!(StampedRecord::open(&bytes, "t", "state", "u").is_err());
        assert!(StampedRecord::open(&bytes, "t", "facts", "v").is_err());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x04;
            assert!(StampedRecord::open(&bad, "t", "facts", "u").is_err(), "flip at {i} accepted");
        }
    }

    #[test]
    fn stamps_grow() {
        let a = next_stamp(0);
        assert!(a > 1_600_000_000_000_000);
        assert_eq!(next_stamp(u64::MAX - 1), u64::MAX);
        assert!(next_stamp(a + 1_000_000) == a + 1_000_001);
    }
}
