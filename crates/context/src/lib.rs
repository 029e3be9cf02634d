//! # engram-context — context policies
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
//! - [`TurnRing`] (the dual-stream design's ephemeral stream): a thread's turns over a
//!   persistent stream of anchors, within a capacity, forgetting whole turns
//!   (the rest moved down, not recomputed) and masking irrelevant ones.
//! - [`PersistentStream`] and [`FactStore`] (the dual-stream design's persistent stream): a user's
//!   system prompt and facts as segments of one shared KV, append-only (superseded facts
//!   masked, dropped at compaction); the facts' log, persisted per user.
//! - [`PersistedSessions`] (per-agent caches persisted to disk): sessions written
//!   after each turn in the background and restored by mapping the file
//!   when a later request — possibly in a restarted process — matches them.
//!
//! [`SessionStore`] is the engine's default `engram_policy::ContextPolicy` (`seam.rs`).
//!
//! Architecture invariant: policies decide *what* to reuse; they never touch
//! weights, and they only build caches out of blocks through `engram-kv`.

mod disk_id;
mod dual_disk;
mod facts;
mod pending;
mod persist;
mod persistent;
mod prefix;
mod ring;
mod ring_store;
mod seam;
mod session;
mod tenant;

pub use disk_id::{prefix_disk_id, session_disk_id};
pub use dual_disk::DualDiskLedger;
/// The seam's types, where the session store's callers have always found them.
pub use engram_policy::{Checkout, MatchKind, PendingRestore};
pub use facts::{Fact, FactError, FactLimits, FactStore};
pub use persist::{CatalogEntry, PersistedSessions, PrefixCatalogEntry};
pub use persistent::{
    stream_file_name, PersistentStream, Segment, SegmentId, StreamFileError, StreamSnapshot, StreamWrite, StreamWriter, StreamWritten,
    Update,
};
pub use prefix::{chain_hashes, chain_root, PrefixIndex};
pub use ring::{RingView, Turn, TurnMask, TurnRing};
pub use ring_store::{RestoredRing, RestoredTurn, RingStore};
pub use session::{Session, SessionStore};
pub use tenant::{account, entry_account};
