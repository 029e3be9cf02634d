//! A restore whose checksum is still running (`Checkout::restore`): a session of the store, or
//! files another policy keeps (a dual-stream thread's ring), settled by the policy that made
//! it once the engine has started computing on the restored KV.
//!
//! Invariant: nothing computed from a pending restore's KV is shown, kept or shared before
//! its check returns `Ok` (the scheduler settles it before the first token and at every exit).

use engram_kv::ChecksumCheck;

use crate::session::Session;

/// A session (or another policy's files) restored from disk whose checksum is being computed
/// on another thread (so reading the file and prefilling the new turn overlap). Until
/// [`crate::SessionStore::verify_restore`] accepts it, the session is in neither the store's
/// RAM sessions nor its disk catalog.
#[must_use = "a restored session is unverified until its policy's verify_restore"]
pub struct PendingRestore {
    pub(crate) what: Restored,
    pub(crate) check: ChecksumCheck,
}

/// What a [`PendingRestore`] restored: a session of the store, or files another policy keeps.
pub(crate) enum Restored {
    Session(Box<Session>),
    Files { owner: String, session: String, id: u64 },
}

/// A [`PendingRestore::files`] restore settled: whose, which restore, and the checksum's verdict.
pub struct SettledFiles {
    pub owner: String,
    pub session: String,
    pub id: u64,
    pub verdict: Result<(), engram_kv::PersistError>,
}

impl PendingRestore {
    /// Files a policy other than the session store restored for `owner`'s `session` (a
    /// dual-stream thread's ring), its restore `id`, sound once `check` passes.
    pub fn files(owner: &str, session: &str, id: u64, check: ChecksumCheck) -> PendingRestore {
        PendingRestore { what: Restored::Files { owner: owner.into(), session: session.into(), id }, check }
    }

    /// The restored session (`None` for another policy's files).
    pub(crate) fn session(&self) -> Option<&Session> {
        match &self.what {
            Restored::Session(s) => Some(s),
            Restored::Files { .. } => None,
        }
    }

    /// Waits for a [`PendingRestore::files`] restore's check; a session's is handed back as it is.
    pub fn settle_files(self) -> Result<SettledFiles, PendingRestore> {
        match self.what {
            Restored::Files { owner, session, id } => Ok(SettledFiles { owner, session, id, verdict: self.check.wait() }),
            what => Err(PendingRestore { what, check: self.check }),
        }
    }
}
