//! [`PendingRestore`]: a restore whose checksum is still running, opaque to the scheduler.
//! The policy that made it puts in whatever it needs to settle it (a session and its file's
//! check, a thread's ring files) and gets it back, by type, in
//! [`crate::ContextPolicy::verify_restore`].
//!
//! Invariant: nothing computed from a pending restore's KV is shown, kept or shared before
//! the policy that made it accepts it (the scheduler settles it before the first token and at
//! every exit).

use std::any::Any;

/// A restore made by some policy, handed to the scheduler with a [`crate::Checkout`] and back
/// to the policy to settle. See the module doc.
#[must_use = "a restored cache is unverified until its policy's verify_restore"]
pub struct PendingRestore {
    what: Box<dyn Any + Send>,
}

impl PendingRestore {
    /// A restore described by `what`, the making policy's own type.
    pub fn new<T: Any + Send>(what: T) -> PendingRestore {
        PendingRestore { what: Box::new(what) }
    }

    /// What the restore holds, if it is a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.what.downcast_ref()
    }

    /// The restore taken apart as a `T`, or handed back whole when it is another policy's.
    pub fn into_inner<T: Any>(self) -> Result<T, PendingRestore> {
        match self.what.downcast::<T>() {
            Ok(t) => Ok(*t),
            Err(what) => Err(PendingRestore { what }),
        }
    }
}

impl std::fmt::Debug for PendingRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingRestore")
    }
}
