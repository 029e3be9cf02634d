//! `TurnRing` (the dual-stream design's ephemeral stream): a thread's dialogue turns in order over a
//! persistent stream of anchors, within a capacity in tokens, forgetting whole turns.
//!
//! ```text
//!  positions: 0 ........ P | turn a | turn b | turn c |  next turn here
//!             persistent     ephemeral ring (capacity tokens; oldest whole turn evicted,
//!             (anchors,      later turns moved down so positions stay packed from P)
//!              always attended: the attention sinks)
//! ```
//! A turn is a user message with the assistant's answer, as one sequence of KV. When the
//! ring passes its capacity, the oldest turns that are not pinned go — whole, never part of
//! one — and the turns after them are moved to close the gap (`SeqKv::move_slots`: keys
//! re-rotated, not recomputed), so positions never grow past anchors + capacity + the
//! newest turn. [`TurnRing::view`] is what the next request attends: the anchors, then the
//! turns a [`TurnMask`] keeps, as read-only spans; a masked turn stays in the ring (a later
//! message can bring it back) and keeps its positions.
//!
//! Invariant: the view's tokens are the anchors then the kept turns in order, at positions
//! `0..P` then packed from `P` in ring order (a masked turn, or a masked slot of the
//! persistent stream — a tombstoned fact —, leaves a gap, nothing else moves); each token's key equals its key computed at that position, to float rounding.
//! `crates/dual/tests/it/ring_fuzz.rs` checks it against a plain model of the policy.
//!
//! A masked turn's KV may leave RAM for a file (`turn_kv.rs`; the policy decides when, with
//! `DualStream::with_masked_turns`): it keeps its place, tokens and positions, moves are
//! recorded for it and replayed when it is read back, and a view never attends a turn on disk
//! (the policy restores the turns a mask keeps, [`TurnRing::wanted_on_disk`], before it asks
//! for the view).

use std::collections::VecDeque;
use std::sync::Arc;

use engram_embed::cosine;
use engram_kv::{KvError, SeqKv, Span};
use engram_model::rope::LayerRopes;

use crate::turn_kv::{MaskedFile, OnDisk, TurnKv, Writing};

/// Reads a turn's file back: its KV at slot positions, every entry check passed (checksum,
/// model and format, owner, the turn's tokens), or why not.
pub(crate) type TurnReader = Arc<dyn Fn(&MaskedFile, &[u32]) -> Result<SeqKv, String> + Send + Sync>;

/// A dialogue turn in the ring.
pub struct Turn {
    /// Stable while the turn is in the ring.
    pub id: u64,
    pub tokens: Vec<u32>,
    /// Its embedding (the sentence encoder's, of its text) for relevance masks.
    pub embedding: Option<Vec<f32>>,
    /// Never evicted (the hybrid mode's state entry); still counted in the capacity.
    pub pinned: bool,
    kv: TurnKv,
}

impl Turn {
    /// Position of the turn's first token.
    pub fn first_position(&self) -> usize {
        self.kv.first_position()
    }

    /// The turn's KV (its tokens at positions [`Turn::first_position`] on), read-only, while it
    /// is in RAM (`None`: a masked turn written to disk).
    pub fn kv(&self) -> Option<&SeqKv> {
        self.kv.resident()
    }

    /// Whether the turn's KV is in a file, not in RAM.
    pub fn on_disk(&self) -> bool {
        self.kv.resident().is_none()
    }

    /// The size of the turn's file while its KV is on disk.
    pub fn kv_file_bytes(&self) -> Option<u64> {
        self.kv.file().map(|f| f.bytes)
    }
}

/// Which turns a request attends.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnMask {
    /// Every turn.
    All,
    /// Turns whose cosine similarity to `query` is at least `threshold`, and always the last
    /// `keep_last` turns (and turns without an embedding).
    Relevant { query: Vec<f32>, threshold: f32, keep_last: usize },
}

/// What a request attends: spans to put before its own tokens, and where they start.
pub struct RingView {
    /// The anchors' spans, then each kept turn's, in order.
    pub spans: Vec<Span>,
    /// Ids of the turns attended and of those masked, in ring order.
    pub attended: Vec<u64>,
    pub masked: Vec<u64>,
    /// Where the next turn's tokens go: one past the ring's last position.
    pub next_position: usize,
}

/// A persistent stream and the ring of turns over it. See the module doc.
pub struct TurnRing {
    persistent: SeqKv,
    /// Slots of the persistent stream left out of every view (tombstoned facts).
    persistent_masked: Vec<std::ops::Range<usize>>,
    turns: VecDeque<Turn>,
    capacity: usize,
    /// Each layer's RoPE (one for every layer, or a model's per-layer ones: sliding layers
    /// may rotate with another base), which moving a turn re-rotates its keys by.
    rope: Arc<dyn LayerRopes + Send + Sync>,
    next_id: u64,
}

impl TurnRing {
    /// A ring of `capacity` tokens over `persistent`, whose tokens sit at positions `0..len`;
    /// `rope` gives each layer's rotation (a `RopeConfig` for all, or the `ModelConfig`).
    pub fn new(persistent: SeqKv, capacity: usize, rope: impl LayerRopes + Send + Sync + 'static) -> TurnRing {
        assert!(!persistent.has_moved_positions(), "TurnRing: the persistent stream sits at positions 0..len");
        TurnRing { persistent, persistent_masked: Vec::new(), turns: VecDeque::new(), capacity, rope: Arc::new(rope), next_id: 0 }
    }

    /// Puts the turns over another persistent stream (a new generation of the user's
    /// anchors, at positions `0..len`), whose `masked` slots (ascending, disjoint) no view
    /// attends, and moves the turns to follow it (re-rotated, not recomputed). Errors: the RAM
    /// budget refusing a move's copies (the turns not yet moved keep their positions and the
    /// ring is unusable until a later rebase succeeds).
    pub fn rebase(&mut self, persistent: SeqKv, masked: Vec<std::ops::Range<usize>>) -> Result<(), KvError> {
        assert!(!persistent.has_moved_positions(), "TurnRing: the persistent stream sits at positions 0..len");
        assert!(masked.iter().all(|r| r.end <= persistent.len()), "TurnRing::rebase: masked slots past the stream");
        self.persistent = persistent;
        self.persistent_masked = masked;
        self.pack()
    }

    /// Tokens of the persistent stream a view attends (its length less the masked slots).
    pub fn persistent_attended(&self) -> usize {
        self.persistent.len() - self.persistent_masked.iter().map(|r| r.len()).sum::<usize>()
    }

    /// Tokens of the persistent stream.
    pub fn persistent_len(&self) -> usize {
        self.persistent.len()
    }

    /// Tokens of the turns in the ring.
    pub fn ephemeral_len(&self) -> usize {
        self.turns.iter().map(|t| t.tokens.len()).sum()
    }

    /// The turns, oldest first.
    pub fn turns(&self) -> impl Iterator<Item = &Turn> {
        self.turns.iter()
    }

    /// Where the next turn's tokens go.
    pub fn next_position(&self) -> usize {
        self.persistent.len() + self.ephemeral_len()
    }

    /// Appends a turn whose KV `kv` holds `tokens` at positions [`TurnRing::next_position`]
    /// on, then evicts the oldest unpinned turns, whole, until the ring fits its capacity or
    /// only the new turn and pinned ones remain, and moves the turns after each gap down.
    /// Returns the evicted turns' ids. Errors: a KV that does not hold `tokens` there, or
    /// the RAM budget refusing the copies a move needs (the ring is then unchanged but for
    /// the turns already evicted).
    pub fn push(&mut self, tokens: Vec<u32>, kv: SeqKv, embedding: Option<Vec<f32>>, pinned: bool) -> Result<Vec<u64>, KvError> {
        Self::check_at(&tokens, &kv, self.next_position())?;
        self.next_id += 1;
        self.turns.push_back(Turn { id: self.next_id, tokens, embedding, pinned, kv: TurnKv::ram(kv) });
        let evicted = self.evict_over_capacity();
        self.pack()?;
        Ok(evicted)
    }

    /// Moves every turn down to close gaps, so positions are packed from the anchors' end.
    fn pack(&mut self) -> Result<(), KvError> {
        let mut at = self.persistent.len();
        for t in self.turns.iter_mut() {
            if t.first_position() != at {
                t.kv.move_to(at, &*self.rope)?;
            }
            at += t.tokens.len();
        }
        Ok(())
    }

    /// Puts a pinned turn (the hybrid mode's state entry) first in the ring, right after the
    /// anchors: `kv` holds `tokens` at positions `persistent_len()..`; every other turn moves
    /// down behind it (re-rotated, not recomputed), then the oldest unpinned turns are evicted
    /// while the ring is over its capacity. Returns its id and the evicted turns' ids. Errors
    /// as [`TurnRing::push`].
    pub fn push_front_pinned(&mut self, tokens: Vec<u32>, kv: SeqKv) -> Result<(u64, Vec<u64>), KvError> {
        Self::check_at(&tokens, &kv, self.persistent.len())?;
        self.next_id += 1;
        let id = self.next_id;
        self.turns.push_front(Turn { id, tokens, embedding: None, pinned: true, kv: TurnKv::ram(kv) });
        let evicted = self.evict_over_capacity();
        self.pack()?;
        Ok((id, evicted))
    }

    /// Replaces turn `id`'s tokens and KV in place (`kv` holds `tokens` at the turn's first
    /// position); the turns after it move to follow its new length, not recomputed; the oldest
    /// unpinned turns are evicted while the ring is over its capacity. Returns the evicted ids,
    /// `None` if `id` is not in the ring. Errors as [`TurnRing::push`].
    pub fn replace(&mut self, id: u64, tokens: Vec<u32>, kv: SeqKv) -> Result<Option<Vec<u64>>, KvError> {
        let Some(i) = self.turns.iter().position(|t| t.id == id) else { return Ok(None) };
        Self::check_at(&tokens, &kv, self.turns[i].first_position())?;
        let t = &mut self.turns[i];
        t.tokens = tokens;
        t.kv = TurnKv::ram(kv);
        let evicted = self.evict_over_capacity();
        self.pack()?;
        Ok(Some(evicted))
    }

    /// A KV that holds `tokens` (at least one) at positions `at..`, or the error saying not.
    fn check_at(tokens: &[u32], kv: &SeqKv, at: usize) -> Result<(), KvError> {
        if kv.len() != tokens.len() || tokens.is_empty() || (0..kv.len()).any(|s| kv.position(s) != at + s) {
            return Err(KvError::BadMapping(format!(
                "a turn of {} tokens whose KV holds {} tokens from position {}; it belongs at {at}",
                tokens.len(),
                kv.len(),
                if kv.is_empty() { 0 } else { kv.position(0) }
            )));
        }
        Ok(())
    }

    /// Evicts the oldest unpinned turns, never the newest, while the ring is over its
    /// capacity; their ids.
    fn evict_over_capacity(&mut self) -> Vec<u64> {
        let mut evicted = Vec::new();
        while self.ephemeral_len() > self.capacity {
            let newest = self.turns.len().saturating_sub(1);
            let Some(oldest) = (0..newest).find(|&i| !self.turns[i].pinned) else { break };
            evicted.push(self.turns.remove(oldest).expect("in range").id);
        }
        evicted
    }

    /// The anchors' spans a view attends (the persistent stream less its masked slots): what
    /// a state entry right after them is computed on.
    pub fn anchor_spans(&self) -> Vec<Span> {
        let mut spans = Vec::new();
        let mut at = 0;
        for r in self.persistent_masked.iter().chain(std::iter::once(&(self.persistent.len()..self.persistent.len()))) {
            spans.extend(self.persistent.spans(at..r.start));
            at = r.end;
        }
        spans
    }

    /// Removes turn `id`, closing its gap; whether it was there.
    pub fn remove(&mut self, id: u64) -> Result<bool, KvError> {
        let Some(i) = self.turns.iter().position(|t| t.id == id) else { return Ok(false) };
        self.turns.remove(i);
        self.pack()?;
        Ok(true)
    }

    /// Whether `mask` keeps the `i`th of the ring's turns.
    fn keeps(&self, mask: &TurnMask, i: usize) -> bool {
        let t = &self.turns[i];
        match mask {
            TurnMask::All => true,
            TurnMask::Relevant { query, threshold, keep_last } => {
                i + keep_last >= self.turns.len() || t.embedding.as_ref().map_or(true, |e| cosine(e, query) >= *threshold)
            }
        }
    }

    /// What a request attends under `mask`: the anchors (always: they are the attention
    /// sinks), then the turns the mask keeps. Building it copies no KV. Panics if the mask keeps
    /// a turn on disk ([`TurnRing::wanted_on_disk`] names those to restore first).
    pub fn view(&self, mask: &TurnMask) -> RingView {
        let mut spans = self.anchor_spans();
        let (mut attended, mut masked) = (Vec::new(), Vec::new());
        for (i, t) in self.turns.iter().enumerate() {
            if self.keeps(mask, i) {
                let kv = t.kv.resident().expect("TurnRing::view: a kept turn is on disk (restore it first)");
                spans.extend(kv.spans(0..kv.len()));
                attended.push(t.id);
            } else {
                masked.push(t.id);
            }
        }
        RingView { spans, attended, masked, next_position: self.next_position() }
    }
}

/// Turns whose KV leaves RAM (masked turns written to disk) and comes back. See the module doc
/// and `turn_kv.rs`.
impl TurnRing {
    /// The turns `mask` keeps whose KV is on disk (to restore before [`TurnRing::view`]);
    /// writes in flight of kept turns are dropped, so they stay in RAM.
    pub fn wanted_on_disk(&mut self, mask: &TurnMask) -> Vec<u64> {
        let keep: Vec<bool> = (0..self.turns.len()).map(|i| self.keeps(mask, i)).collect();
        let mut out = Vec::new();
        for (t, keep) in self.turns.iter_mut().zip(keep) {
            match &mut t.kv {
                TurnKv::Disk(_) if keep => out.push(t.id),
                TurnKv::Ram { writing, .. } if keep => *writing = None,
                _ => {}
            }
        }
        out
    }

    /// Marks turn `id` (in RAM, unpinned, no write in flight) as being written under `ticket`;
    /// returns its tokens and its KV at slot positions to write, `None` if it is not such a turn.
    pub(crate) fn begin_offload(&mut self, id: u64, ticket: u64) -> Option<(Vec<u32>, SeqKv)> {
        let t = self.turns.iter_mut().find(|t| t.id == id && !t.pinned)?;
        let TurnKv::Ram { kv, writing: writing @ None } = &mut t.kv else { return None };
        *writing = Some(Writing { ticket, written_first: kv.position(0), moves: Vec::new() });
        Some((t.tokens.clone(), kv.fork_at_slot_positions()))
    }

    /// Turn `id`'s write `ticket` landed in `file`: its RAM KV is dropped (the blocks go back to
    /// the pool) and the turn is on disk. False (the file is deleted) when the turn is gone or
    /// was wanted again meanwhile.
    pub(crate) fn finish_offload(&mut self, id: u64, ticket: u64, file: MaskedFile, reader: TurnReader) -> bool {
        let Some(t) = self.turns.iter_mut().find(|t| t.id == id) else { return false };
        let TurnKv::Ram { kv, writing: Some(w) } = &mut t.kv else { return false };
        if w.ticket != ticket {
            return false;
        }
        let (written_first, moves, len) = (w.written_first, std::mem::take(&mut w.moves), kv.len());
        t.kv = TurnKv::Disk(OnDisk { file: Arc::new(file), written_first, moves, len, reader });
        true
    }

    /// Reads turn `id`'s KV back from its file (exactly what its RAM copy would hold, moves
    /// replayed) and keeps it in RAM; a turn already in RAM is left as it is. Errors (a missing
    /// or damaged file, the RAM budget): the turn is unchanged, still on disk.
    pub fn restore(&mut self, id: u64) -> Result<(), String> {
        let Some(t) = self.turns.iter_mut().find(|t| t.id == id) else { return Err(format!("no turn {id} in the ring")) };
        let TurnKv::Disk(d) = &t.kv else { return Ok(()) };
        let kv = TurnKv::restore(d, (d.reader)(&d.file, &t.tokens)?, &*self.rope)?;
        t.kv = TurnKv::ram(kv);
        Ok(())
    }

    /// Turn `t`'s KV as it would be in RAM: a fork of it, or for a turn on disk a copy read
    /// back (the turn stays on disk). For writing the ring (`RingStore::save`).
    pub fn kv_copy(&self, t: &Turn) -> Result<SeqKv, String> {
        match &t.kv {
            TurnKv::Ram { kv, .. } => Ok(kv.fork(kv.len())),
            TurnKv::Disk(d) => TurnKv::restore(d, (d.reader)(&d.file, &t.tokens)?, &*self.rope),
        }
    }

    /// Turns on disk and their files' bytes.
    pub fn on_disk(&self) -> (usize, u64) {
        self.turns.iter().filter_map(|t| t.kv.file()).fold((0, 0), |(n, b), f| (n + 1, b + f.bytes))
    }

    /// Bytes of the turns' KV in RAM (blocks of each turn in RAM; blocks shared with other
    /// sequences counted once per turn).
    pub fn resident_bytes(&self) -> usize {
        self.turns.iter().filter_map(|t| t.kv.resident()).map(|kv| kv.num_bytes()).sum()
    }
}
