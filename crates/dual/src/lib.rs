//! # engram-dual — the dual-stream context policy
//!
//! Everything of the dual-stream design in one crate:
//!
//! - [`DualStream`] (`policy.rs`): the `engram_policy::ContextPolicy` that keeps, per user, a
//!   persistent stream of anchors prefilled once and shared read-only by every thread of that
//!   user, and per thread a ring of whole turns within a capacity; its messages
//!   ([`DualControl`]) travel through the engine's one control path.
//! - [`TurnRing`] (`ring.rs`): a thread's turns over the anchors, forgetting whole turns (the
//!   rest moved down, not recomputed) and masking irrelevant ones.
//! - [`PersistentStream`] (`persistent.rs`): a user's system prompt and facts as segments of one
//!   shared KV, append-only (superseded facts masked, dropped at compaction), written by a
//!   background [`StreamWriter`] and mapped back.
//! - [`FactStore`] (`facts.rs`): the facts' log, persisted per user, stamped per change so
//!   replicas can exchange versions ([`FactLog`]).
//! - [`RingStore`] (`ring_store.rs`) and [`DualDiskLedger`] (`dual_disk.rs`): rings saved as
//!   turns retire, restored with their checksums settled; the files under the disk budget.
//! - [`Summarizer`] (`summarize.rs`): condenses facts that pass the stream's cap.
//! - [`turn_tokens`] and [`segment_tokens`] (`render.rs`): a conversation as the policy's
//!   pieces (anchors, a turn rendered alone, a fact's segment), for every front end.
//! - Masked turns on disk (`turn_kv.rs`, `masked_store.rs`, `policy/masked.rs`,
//!   `policy/pressure.rs`): a turn masked out of attention leaves RAM for a file (at once, or when
//!   the engine asks for room) and is read back, exactly, when a message wants it; its file counts
//!   against the disk budget.
//!
//! Architecture invariant: the crate depends on the seam (`engram-policy`), the KV store, the
//! model and the engine (`SteppedJob`, which runs a summarizer model of its own through an
//! engine's step); no other policy depends on it and it depends on no other policy.

mod dual_disk;
mod facts;
mod masked_store;
mod persistent_stream;
mod policy;
mod render;
mod ring;
mod ring_store;
pub mod summarize;
mod turn_kv;

pub use dual_disk::DualDiskLedger;
pub use facts::{Fact, FactError, FactLimits, FactLog, FactStore};
pub use persistent_stream::{
    stream_file_name, PersistentStream, Segment, SegmentId, StreamFileError, StreamSnapshot, StreamWrite, StreamWriter, StreamWritten,
    Update,
};
pub use policy::{DualControl, DualStats, DualStream, FactSegment, Relevance};
pub use render::{segment_tokens, turn_tokens, TurnTokens, FACT_PREFIX, SUMMARY_PREFIX};
pub use ring::{RingView, Turn, TurnMask, TurnRing};
pub use ring_store::{RestoredRing, RestoredTurn, RingStore};
pub use summarize::{RenderSegment, Summarizer, SUMMARY_PROMPT};
