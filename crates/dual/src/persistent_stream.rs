//! `PersistentStream` (the dual-stream design's persistent stream): one user's anchors as segments — the
//! base (the rendered system prompt), then facts (or a summary of them) — with one KV that
//! every thread of the user forks read-only.
//!
//! ```text
//!  slots:  | base | fact 3 | fact 5 (tombstoned) | fact 7 | fact 8 |
//!           live    live     masked: kept in the KV, left out of every view
//!  append:  facts whose ids are new go after the last slot (only they are prefilled);
//!           facts no longer wanted are masked at once (tombstones)
//!  rebuild: anything else (the base changed, a fact changed, compaction): the segments are
//!           laid out again, the KV kept up to the first token that differs, the rest prefilled
//! ```
//! Append-only within a session: an update that only adds facts at the end and drops others
//! prefills just the new tokens and masks the dropped ones, so threads' turns keep their
//! positions relative to what stays. [`PersistentStream::compact`] drops the masked segments
//! (a rebuild); the policy calls it when the stream passes its cap.
//!
//! The stream never computes KV itself: the engine prefills the tokens past its KV (the
//! dual-stream policy's `BlockingOwner` job, with the masked slots hidden from the new tokens)
//! and hands the result to [`PersistentStream::set_prefilled`].
//!
//! Invariant: the KV, once prefilled, holds exactly
//! [`PersistentStream::tokens`] at positions `0..len` (masked segments included), each token
//! computed attending only the live tokens before it (an appended fact never sees a
//! tombstoned one, so the live view equals a cold prefill of the live segments at their
//! positions), and
//! [`PersistentStream::masked_ranges`] are exactly the masked segments' slots; every change
//! bumps [`PersistentStream::generation`] (driven through the dual-stream policy in
//! `crates/dual/tests/it/facts.rs` and `crates/dual/tests/it/dual_persist.rs`).

use std::ops::Range;

mod file;
mod writer;
pub use file::{stream_file_name, StreamFileError, StreamSnapshot};
pub use writer::{StreamWrite, StreamWriter, StreamWritten};

use engram_kv::SeqKv;

/// What a segment of the persistent stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SegmentId {
    /// The system prompt, rendered.
    Base,
    /// A fact, by its id in the user's fact log.
    Fact(u64),
    /// A summary of the facts (the summarizer's output), by the generation it summarized.
    Summary(u64),
}

/// A run of the stream's tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub id: SegmentId,
    pub tokens: Vec<u32>,
    /// Tombstoned: kept in the KV (positions unchanged) but left out of every view.
    pub masked: bool,
}

/// How an update changed the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update {
    /// Same segments as before.
    Unchanged,
    /// Segments only masked and/or appended: the KV before them is kept as it is.
    Appended,
    /// Laid out again: the KV is kept only up to the first differing token.
    Rebuilt,
}

/// One user's persistent stream. See the module doc.
pub struct PersistentStream {
    segments: Vec<Segment>,
    kv: Option<SeqKv>,
    generation: u64,
}

impl Default for PersistentStream {
    fn default() -> Self {
        PersistentStream::new()
    }
}

impl PersistentStream {
    /// An empty stream (no base, no facts).
    pub fn new() -> PersistentStream {
        PersistentStream { segments: Vec::new(), kv: None, generation: 0 }
    }

    /// Bumped by every change of the segments or their masks.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Every segment in slot order, masked ones included.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The tokens of every segment in slot order (what the KV holds once prefilled).
    pub fn tokens(&self) -> Vec<u32> {
        self.segments.iter().flat_map(|s| s.tokens.iter().copied()).collect()
    }

    /// Tokens of the segments a view attends.
    pub fn live_len(&self) -> usize {
        self.segments.iter().filter(|s| !s.masked).map(|s| s.tokens.len()).sum()
    }

    /// Tokens of every segment, masked ones included: the positions the stream takes.
    pub fn len(&self) -> usize {
        self.segments.iter().map(|s| s.tokens.len()).sum()
    }

    /// Whether the stream has no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slots of the masked segments, ascending.
    pub fn masked_ranges(&self) -> Vec<Range<usize>> {
        let (mut at, mut out) = (0, Vec::new());
        for s in &self.segments {
            if s.masked && !s.tokens.is_empty() {
                out.push(at..at + s.tokens.len());
            }
            at += s.tokens.len();
        }
        out
    }

    /// The live (unmasked) segments, as an update would want them.
    pub fn live(&self) -> Vec<(SegmentId, Vec<u32>)> {
        self.segments.iter().filter(|s| !s.masked).map(|s| (s.id, s.tokens.clone())).collect()
    }

    /// The live facts' ids, in order.
    pub fn live_facts(&self) -> Vec<u64> {
        self.segments
            .iter()
            .filter_map(|s| match s.id {
                SegmentId::Fact(id) if !s.masked => Some(id),
                _ => None,
            })
            .collect()
    }

    /// Makes `wanted` (in order) the live segments. When the segments already present are
    /// wanted with the same tokens in the same order and every new one comes after them, the
    /// others are masked and the new ones appended; otherwise the stream is rebuilt (masked
    /// segments dropped). The KV is brought up to date by the next prefill (the engine's).
    pub fn update(&mut self, wanted: Vec<(SegmentId, Vec<u32>)>) -> Update {
        if self.live() == wanted {
            return Update::Unchanged;
        }
        let old_tokens = self.tokens();
        let index_of = |id: SegmentId| self.segments.iter().position(|s| s.id == id);
        // Appendable: the wanted segments already here come first, live, with their tokens,
        // in slot order; the new ones after them.
        let (mut kept, mut last, mut appendable) = (0, None, true);
        for (n, (id, tokens)) in wanted.iter().enumerate() {
            let Some(i) = index_of(*id) else { continue };
            let s = &self.segments[i];
            if kept != n || s.masked || s.tokens != *tokens || last.is_some_and(|l| i <= l) {
                appendable = false;
            }
            last = Some(i);
            kept += 1;
        }
        self.generation += 1;
        if appendable {
            let wanted_ids: Vec<SegmentId> = wanted.iter().map(|(id, _)| *id).collect();
            for s in self.segments.iter_mut() {
                if !wanted_ids.contains(&s.id) {
                    s.masked = true;
                }
            }
            for (id, tokens) in wanted.into_iter().skip(kept) {
                self.segments.push(Segment { id, tokens, masked: false });
            }
            return Update::Appended;
        }
        self.segments = wanted.into_iter().map(|(id, tokens)| Segment { id, tokens, masked: false }).collect();
        self.keep_common_prefix(&old_tokens);
        Update::Rebuilt
    }

    /// Drops the masked segments (laying the live ones out again); whether any were.
    pub fn compact(&mut self) -> bool {
        if self.segments.iter().all(|s| !s.masked) {
            return false;
        }
        let old_tokens = self.tokens();
        self.segments.retain(|s| !s.masked);
        self.generation += 1;
        self.keep_common_prefix(&old_tokens);
        true
    }

    /// Keeps the KV only as far as its tokens (`old`) agree with the new layout.
    fn keep_common_prefix(&mut self, old: &[u32]) {
        let new = self.tokens();
        let common = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
        if let Some(kv) = self.kv.as_mut() {
            kv.truncate(common.min(kv.len()));
        }
    }

    /// A new generation of this stream laid out as `wanted` (every segment live, nothing
    /// masked), to be prefilled on the side (by the engine) while this one
    /// is still attended, then swapped in whole: its KV starts as a fork of this one's as far
    /// as their tokens agree and no slot of this one is masked (a masked slot changed what the
    /// tokens after it attended); its generation is this one's plus one.
    pub fn staged(&self, wanted: Vec<(SegmentId, Vec<u32>)>) -> PersistentStream {
        let segments: Vec<Segment> = wanted.into_iter().map(|(id, tokens)| Segment { id, tokens, masked: false }).collect();
        let new: Vec<u32> = segments.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let old = self.tokens();
        let first_masked = self.masked_ranges().first().map_or(old.len(), |r| r.start);
        let common = old.iter().zip(&new).take_while(|(a, b)| a == b).count().min(first_masked);
        let kv = self.kv.as_ref().map(|kv| kv.fork(common.min(kv.len())));
        PersistentStream { segments, kv, generation: self.generation + 1 }
    }

    /// The KV as far as it is computed (`None` before the first prefill or restore): the start
    /// of a prefill that goes on elsewhere.
    pub fn partial_kv(&self) -> Option<&SeqKv> {
        self.kv.as_ref()
    }

    /// Takes the KV out (the stream then holds none, as before its first prefill): a staged
    /// stream's start, handed to the engine to prefill the rest.
    pub fn take_kv(&mut self) -> Option<SeqKv> {
        self.kv.take()
    }

    /// Puts in a KV the engine prefilled for this stream: it must hold exactly
    /// [`PersistentStream::tokens`] (the caller's job started from this stream's layout, so the
    /// tokens agree); only its length can be checked here. Errors leave the stream as it was.
    pub fn set_prefilled(&mut self, kv: SeqKv) -> Result<(), String> {
        if kv.len() != self.len() {
            return Err(format!("the prefilled stream holds {} tokens, not the stream's {}", kv.len(), self.len()));
        }
        self.kv = Some(kv);
        Ok(())
    }

    /// Tokens whose KV the stream holds (0: never prefilled nor restored, or rebuilt from its
    /// first token; below [`PersistentStream::len`]: appended segments not prefilled yet).
    pub fn prefilled_len(&self) -> usize {
        self.kv.as_ref().map_or(0, |kv| kv.len())
    }

    /// The KV, once wholly prefilled (`None` before that, or with tokens not prefilled yet); a
    /// thread forks it.
    pub fn kv(&self) -> Option<&SeqKv> {
        self.kv.as_ref().filter(|kv| kv.len() == self.len())
    }
}
