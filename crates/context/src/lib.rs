//! # engram-context — the session policy: sessions and shared prefixes
//!
//! Decides which cached tokens a new request can reuse, so that no context
//! is prefilled twice:
//!
//! - [`PrefixIndex`] (prefix caching across sessions): every full block of every finished
//!   sequence is indexed by a chained hash of (parent hash, block tokens,
//!   model fingerprint), its root salted per tenant unless sharing across
//!   tenants is opted into. A new sequence reuses the longest indexed chain at
//!   any block boundary — the multi-granularity matching for free.
//!   A hash hit is confirmed against the stored tokens, so a collision is a
//!   miss, never a wrong answer.
//! - [`SessionStore`] (per-agent caches): per-owner sessions holding their rendered
//!   text, token ids, per-token character offsets and cache. A request's
//!   text is matched by characters: EXACT, EXTEND (only new text is
//!   tokenized and prefilled) or DIVERGE (reuse up to the last token
//!   boundary inside the common text).
//! - [`PersistedSessions`] (per-agent caches persisted to disk): sessions written
//!   after each turn in the background and restored by mapping the file
//!   when a later request — possibly in a restarted process — matches them.
//!
//! [`SessionStore`] is the default `engram_policy::ContextPolicy` (`seam.rs`); the dual-stream
//! policy lives in `engram-dual`.
//!
//! Architecture invariant: policies decide *what* to reuse; they never touch
//! weights, and they only build caches out of blocks through `engram-kv`.

mod config;
mod disk_id;
mod pending;
mod prefix;
mod seam;
mod session;
mod session_files;
mod tenant;

pub use config::{DiskConfig, SessionsConfig, DEFAULT_PREFILL_STEP};
pub use disk_id::{prefix_disk_id, session_disk_id};
/// The seam's types, where the session store's callers have always found them.
pub use engram_policy::{Checkout, MatchKind, PendingRestore};
pub use prefix::{chain_hashes, chain_root, PrefixIndex};
pub use session::{Session, SessionStore};
pub use session_files::{CatalogEntry, PersistedSessions, PrefixCatalogEntry};
pub use tenant::{account, entry_account};
