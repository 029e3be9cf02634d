//! A session restored from disk whose checksum is still running: what the session store puts
//! in the [`PendingRestore`] it hands the scheduler, and takes back in
//! [`crate::SessionStore::verify_restore`] once the engine has started computing on the
//! restored KV.
//!
//! Invariant: nothing computed from a pending restore's KV is shown, kept or shared before
//! its check returns `Ok` (the scheduler settles it before the first token and at every exit).

use engram_kv::ChecksumCheck;
use engram_policy::PendingRestore;

use crate::session::Session;

/// A session restored from disk whose checksum is being computed on another thread (so reading
/// the file and prefilling the new turn overlap). Until the store verifies it, the session is in
/// neither the store's RAM sessions nor its disk catalog.
pub(crate) struct SessionRestore {
    pub(crate) session: Box<Session>,
    pub(crate) check: ChecksumCheck,
}

impl SessionRestore {
    /// The restore as the scheduler carries it.
    pub(crate) fn pending(session: Session, check: ChecksumCheck) -> PendingRestore {
        PendingRestore::new(SessionRestore { session: Box::new(session), check })
    }

    /// The restored session, if `p` is the store's.
    pub(crate) fn session_of(p: &PendingRestore) -> Option<&Session> {
        p.get::<SessionRestore>().map(|r| &*r.session)
    }
}
