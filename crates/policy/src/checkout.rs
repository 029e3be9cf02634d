//! What crosses the seam at admission and retirement: the request ([`AdmitRequest`]), what
//! the policy hands the scheduler ([`Checkout`], matched as a [`MatchKind`]) and what the
//! scheduler hands back when the sequence ends ([`Retired`]).
//!
//! Invariant: a checkout's cache (`kv`, or `cache` when it carries one) holds exactly
//! `tokens[..reused]`, and a retired sequence's exactly its `tokens`. A sequence runs on
//! `cache` when it is set (then `kv` is empty and there are no spans) and on `kv` otherwise.

use std::ops::Range;

use engram_kv::{SeqCache, SeqKv, Span};
use engram_tokenizer::Tokenizer;

use crate::{OwnerKey, PendingRestore};

/// One job's admission as a policy sees it.
pub struct AdmitRequest<'a> {
    /// Whose state the job may reuse: sessions never cross owners.
    pub owner: &'a OwnerKey,
    /// A named session (a thread, an agent's session), or `None` to match by the prompt.
    pub session: Option<&'a str>,
    /// The prompt text (a rendered chat or a raw completion), matched by characters; `None`
    /// for prompts sent as token ids.
    pub text: Option<&'a str>,
    /// How `text` is tokenized cold (true: the model's BOS rule for raw prompts).
    pub add_special: bool,
    /// The prompt tokenized whole (with `text`, a policy may reuse a cached tokenization of
    /// the common part instead).
    pub tokens: &'a [u32],
    /// The model's tokenizer.
    pub tok: &'a Tokenizer,
    /// This request's own threshold for serving its conversation sparse (a long-context
    /// layer's `--long-context-after`); `None`: the policy's default.
    pub long_context_after: Option<usize>,
}

/// Whether a request can be admitted now ([`crate::ContextPolicy::prepare`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Admit it now ([`crate::ContextPolicy::admit`] follows at once).
    Now,
    /// It needs forward work first, which the policy has queued as background jobs that the
    /// request waits on (a [`crate::BackgroundPriority::BlockingOwner`] job of its owner, or a
    /// `Blocking` one on its session), handed out by the next
    /// [`crate::ContextPolicy::next_background`] calls: the request stays waiting behind them
    /// and is prepared again once they end.
    AfterBackground,
}

/// How a request matched the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchKind {
    /// The text equals a session's text.
    Exact,
    /// A session's text is a prefix of the new text.
    Extend,
    /// The texts share a prefix, then differ.
    Diverge,
    /// Only a shared prefix (or attached spans) was reused.
    Prefix,
    /// Nothing reused.
    Miss,
}

impl MatchKind {
    /// Lower-case name for metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            MatchKind::Exact => "exact",
            MatchKind::Extend => "extend",
            MatchKind::Diverge => "diverge",
            MatchKind::Prefix => "prefix",
            MatchKind::Miss => "miss",
        }
    }
}

/// What a request gets back: a cache holding `tokens[..reused]`, and the full token sequence to run.
/// The sequence's view of the KV is `spans` (attended first, never written) then `kv`.
pub struct Checkout {
    pub session_id: String,
    pub kind: MatchKind,
    pub tokens: Vec<u32>,
    pub token_ends: Vec<usize>,
    pub reused: usize,
    pub kv: SeqKv,
    /// `Some` when `kv` was just restored from a file whose checksum is still
    /// being computed: the caller may run the model on `kv` meanwhile, but
    /// must pass this to [`crate::ContextPolicy::verify_restore`] before it shows,
    /// keeps or checks in anything computed from it, and start over without
    /// the cache when that returns false.
    pub restore: Option<PendingRestore>,
    /// Read-only spans of KV held elsewhere (a document chunk, a persistent stream) that the
    /// sequence attends before its own tokens; with any, `kv`'s tokens sit at positions from
    /// [`engram_kv::KvView::own_first_position`] on (so `kv` must start empty or be placed
    /// there). Empty from policies that reuse prefixes linearly.
    pub spans: Vec<Span>,
    /// Where `kv`'s tokens start when not right after the spans (`KvView::starting_at`): a
    /// view whose last slots are masked. `None` from policies whose views end at their last
    /// span.
    pub own_first: Option<usize>,
    /// Tokens a prompt-lookup drafter may search besides the sequence's own (the text the
    /// spans hold, oldest first), opaque to the scheduler; drafts only propose, so any tokens
    /// here never change an answer. Empty from policies whose sequences hold their whole
    /// context.
    pub lookup: Vec<u32>,
    /// A cache that is not paged KV (a sparse cache over KV offloaded to disk, built by the
    /// policy): when set, the sequence runs on it instead of `kv` (which is then empty), with
    /// no spans, `own_first` or restore. `None` from policies whose sequences hold paged KV.
    pub cache: Option<Box<dyn SeqCache>>,
    /// KV in `kv` that was computed in another context and moved into place (a document chunk
    /// prefilled on its own), which the engine repairs as the sequence's first work in a step,
    /// before it prefills the rest of `tokens`; see [`Repair`]. Only with paged `kv` holding
    /// its tokens at slots equal to positions (no spans, `own_first`, restore or `cache`).
    /// `None` from policies whose reused KV is exact.
    pub repair: Option<Repair>,
}

/// What the engine recomputes in a checkout's reused KV before the rest of its prompt
/// ([`Checkout::repair`]): selective recomputation of moved KV (CacheBlend). The engine runs
/// a probe of the first layers over the `moved` slots and recomputes, in every layer, the
/// `ratio` share of them whose KV deviates most, attending to the whole sequence.
///
/// Invariant: `ratio` 1 recomputes every moved token (the cold prefill's computation, so the
/// answer is the cold one); `ratio` 0 changes nothing; slots outside `moved` are never
/// rewritten. A repair that fails fails its sequence only, with its error. The sequence retires
/// holding the repaired KV (approximate unless `ratio` is 1: a policy that asks for a repair
/// keeps nothing of it as exact), or nothing when it ended before its repair ran.
#[derive(Clone, Debug, PartialEq)]
pub struct Repair {
    /// Slot ranges of the checkout's `kv` whose KV was computed elsewhere and moved there.
    pub moved: Vec<Range<usize>>,
    /// The share of the moved tokens recomputed, in `[0, 1]`.
    pub ratio: f32,
}

impl Checkout {
    /// A checkout whose view is `kv` alone, freshly checked (no restore pending, no spans,
    /// nothing to look up besides its tokens).
    pub fn own(session_id: String, kind: MatchKind, tokens: Vec<u32>, token_ends: Vec<usize>, reused: usize, kv: SeqKv) -> Checkout {
        Checkout {
            session_id,
            kind,
            tokens,
            token_ends,
            reused,
            kv,
            restore: None,
            spans: Vec::new(),
            own_first: None,
            lookup: Vec::new(),
            cache: None,
            repair: None,
        }
    }
}

/// A sequence handed back at retirement.
pub struct Retired {
    pub owner: OwnerKey,
    pub session_id: String,
    /// The prompt text plus the decoded text (empty for prompts sent as token ids).
    pub text: String,
    /// Exactly what `kv` holds.
    pub tokens: Vec<u32>,
    /// Per token, where its text ends in `text` (zeros for id prompts).
    pub token_ends: Vec<usize>,
    pub kv: SeqKv,
    /// The sequence's cache when its checkout carried one ([`Checkout::cache`]; then `kv` is
    /// empty); it holds exactly `tokens`. `None` for paged sequences, and when the cache could
    /// not be brought back to `tokens` (the policy then keeps nothing of the sequence's KV).
    pub cache: Option<Box<dyn SeqCache>>,
    /// The last token sampled but never fed, when generation stopped at its length or was
    /// cancelled (not after a stop token or string): a policy that keeps the turn for a later
    /// request must put it first in that request's context (`text` already holds its text).
    pub unfed: Option<u32>,
}
