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

use std::collections::VecDeque;
use std::sync::Arc;

use engram_embed::cosine;
use engram_kv::{KvError, SeqKv, Span};
use engram_model::rope::LayerRopes;

/// A dialogue turn in the ring.
pub struct Turn {
    /// Stable while the turn is in the ring.
    pub id: u64,
    pub tokens: Vec<u32>,
    /// Its embedding (the sentence encoder's, of its text) for relevance masks.
    pub embedding: Option<Vec<f32>>,
    /// Never evicted (the hybrid mode's state entry); still counted in the capacity.
    pub pinned: bool,
    kv: SeqKv,
}

impl Turn {
    /// Position of the turn's first token.
    pub fn first_position(&self) -> usize {
        self.kv.position(0)
    }

    /// The turn's KV (its tokens at positions [`Turn::first_position`] on), read-only.
    pub fn kv(&self) -> &SeqKv {
        &self.kv
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
        self.turns.push_back(Turn { id: self.next_id, tokens, embedding, pinned, kv });
        let evicted = self.evict_over_capacity();
        self.pack()?;
        Ok(evicted)
    }

    /// Moves every turn down to close gaps, so positions are packed from the anchors' end.
    fn pack(&mut self) -> Result<(), KvError> {
        let mut at = self.persistent.len();
        for t in self.turns.iter_mut() {
            if t.first_position() != at {
                t.kv.move_slots(0..t.kv.len(), at, &*self.rope)?;
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
        self.turns.push_front(Turn { id, tokens, embedding: None, pinned: true, kv });
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
        t.kv = kv;
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

    /// What a request attends under `mask`: the anchors (always: they are the attention
    /// sinks), then the turns the mask keeps. Building it copies no KV.
    pub fn view(&self, mask: &TurnMask) -> RingView {
        let mut spans = self.anchor_spans();
        let (mut attended, mut masked) = (Vec::new(), Vec::new());
        let n = self.turns.len();
        for (i, t) in self.turns.iter().enumerate() {
            let keep = match mask {
                TurnMask::All => true,
                TurnMask::Relevant { query, threshold, keep_last } => {
                    i + keep_last >= n || t.embedding.as_ref().map_or(true, |e| cosine(e, query) >= *threshold)
                }
            };
            if keep {
                spans.extend(t.kv.spans(0..t.kv.len()));
                attended.push(t.id);
            } else {
                masked.push(t.id);
            }
        }
        RingView { spans, attended, masked, next_position: self.next_position() }
    }
}
