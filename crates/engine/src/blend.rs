//! CacheBlend-style selective recomputation: a sequence whose cache holds some tokens' KV
//! computed in another context (a document chunk prefilled on its own and moved to a new
//! position, `SeqKv::extend_shifted`) gets the KV of the fraction `ratio` of those tokens
//! that deviate most from a full prefill computed again, attending to the whole sequence.
//!
//! ```text
//!  moved tokens ─ probe: layers 0..=P whole for all of them (Model::write_kv_through)
//!                 deviation d(t) = |K_new − K_old|² + |V_new − V_old|² at layer P (P = 1)
//!               ─ select: the ⌈ratio·n⌉ tokens with the largest d(t)
//!               ─ recompute: a forward of the selected tokens at their positions; each layer
//!                 writes their fresh K/V over the reused rows, then they attend to the whole
//!                 sequence (reused rows of the others, fresh rows of the selected)
//! ```
//! Layer 0's K/V depend only on the token and its position, so a moved token's layer-0 K/V
//! are already right (up to rounding) and the first layer whose K/V carry the chunk's old
//! context is layer 1: that is where the deviation is measured (CacheBlend measures it on
//! the first layers too). The probe's fresh rows of layers `0..=P` are kept for every moved
//! token (they are what a full prefill writes).
//!
//! Who runs it: the engine's step, for a checkout that carries an [`engram_policy::Repair`]
//! (`scheduler/repair.rs`: the server's blended RAG requests), and a caller that owns its caches
//! and has no engine thread (`engram_rag::Rag::query` in blend mode).
//!
//! Invariants (`tests/it/blend.rs`): `ratio = 0` changes nothing (plain moved reuse: no probe,
//! no recompute); `ratio = 1` recomputes every moved token in every layer, which is the full
//! prefill's computation, so the next token's logits equal a cold prefill's; tokens not
//! named as moved (a chunk at the position it was computed at) are never recomputed.

use std::ops::Range;

use engram_kv::SeqKv;
use engram_model::{KvCache, KvChunk, KvRead, Logits, Model, SeqStep};

use crate::error::EngineError;
use crate::scheduler::DEFAULT_PREFILL_CHUNK;

/// The default fraction of reused tokens recomputed (CacheBlend's 15%).
pub const DEFAULT_BLEND_RATIO: f32 = 0.15;

/// The layer whose K/V deviation picks the tokens to recompute (the first whose K/V depend on
/// other tokens).
pub const PROBE_LAYER: usize = 1;

/// What [`blend`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlendReport {
    /// Tokens whose KV was reused from another context.
    pub moved_tokens: usize,
    /// Of those, tokens recomputed in every layer.
    pub recomputed_tokens: usize,
    /// Tokens run through the probe layers (0 where no probe was needed).
    pub probed_tokens: usize,
}

impl BlendReport {
    /// What [`blend`] of `moved` with `ratio` on a model of `num_layers` layers does, known
    /// before it runs (the counts depend only on these): the moved tokens (each slot once),
    /// the `⌈ratio·n⌉` recomputed, and all of them probed unless every one is recomputed (or
    /// the model has no layer past the probe's) or none is. `ratio` outside `[0, 1]` plans
    /// nothing ([`blend`] refuses it).
    pub fn planned(moved: &[Range<usize>], ratio: f32, num_layers: usize) -> BlendReport {
        let n = moved_slots(moved).len();
        if !(0.0..=1.0).contains(&ratio) {
            return BlendReport { moved_tokens: n, ..Default::default() };
        }
        let take = ((ratio as f64 * n as f64).ceil() as usize).min(n);
        let probed = if take == 0 || take == n || num_layers <= PROBE_LAYER { 0 } else { n };
        BlendReport { moved_tokens: n, recomputed_tokens: take, probed_tokens: probed }
    }
}

/// The slots of `moved`, sorted, each once.
fn moved_slots(moved: &[Range<usize>]) -> Vec<usize> {
    let mut slots: Vec<usize> = moved.iter().flat_map(|r| r.clone()).collect();
    slots.sort_unstable();
    slots.dedup();
    slots
}

/// Recomputes the `ratio` share of the tokens in `moved` (slot ranges of `kv`, which holds
/// `tokens` at slots equal to positions) whose reused KV deviates most, in place. See the
/// module doc for the method and its invariants. `ratio` must lie in `[0, 1]`.
pub fn blend(model: &Model, kv: &mut SeqKv, tokens: &[u32], moved: &[Range<usize>], ratio: f32) -> Result<BlendReport, EngineError> {
    if !(0.0..=1.0).contains(&ratio) {
        return Err(EngineError::BadRequest(format!("blend ratio {ratio} is not in [0, 1]")));
    }
    if kv.len() != tokens.len() || kv.has_moved_positions() {
        return Err(EngineError::BadRequest("blend needs a cache holding exactly its tokens at slots equal to positions".into()));
    }
    let slots = moved_slots(moved);
    if slots.last().is_some_and(|&s| s >= tokens.len()) {
        return Err(EngineError::BadRequest("a moved slot lies past the cache's end".into()));
    }
    let report = BlendReport::planned(moved, ratio, model.config.num_layers);
    let (n, take) = (report.moved_tokens, report.recomputed_tokens);
    if take == 0 {
        return Ok(report);
    }
    for r in moved {
        kv.unshare(r.clone()).map_err(EngineError::Kv)?;
    }
    let selected = if report.probed_tokens == 0 {
        slots
    } else {
        let deviation = probe(model, kv, tokens, &slots)?;
        let mut order: Vec<usize> = (0..n).collect();
        // Largest deviation first; ties by slot so the choice is deterministic.
        order.sort_by(|&a, &b| deviation[b].total_cmp(&deviation[a]).then(a.cmp(&b)));
        let mut chosen: Vec<usize> = order[..take].iter().map(|&i| slots[i]).collect();
        chosen.sort_unstable();
        chosen
    };
    debug_assert_eq!(selected.len(), report.recomputed_tokens);
    for part in selected.chunks(DEFAULT_PREFILL_CHUNK) {
        let toks: Vec<u32> = part.iter().map(|&s| tokens[s]).collect();
        let positions: Vec<u32> = part.iter().map(|&s| s as u32).collect();
        let mut cache = Scatter { inner: kv, slots: part, probe: None };
        let step =
            SeqStep { tokens: &toks, first_pos: 0, positions: Some(&positions), key_mask: None, kv: &mut cache, logits: Logits::None };
        model.forward(&mut [step])?;
    }
    Ok(report)
}

/// Runs layers `0..=PROBE_LAYER` for `slots` (writing their fresh rows) and returns each
/// slot's squared K/V change at [`PROBE_LAYER`].
fn probe(model: &Model, kv: &mut SeqKv, tokens: &[u32], slots: &[usize]) -> Result<Vec<f32>, EngineError> {
    let mut deviation = Vec::with_capacity(slots.len());
    for part in slots.chunks(DEFAULT_PREFILL_CHUNK) {
        let toks: Vec<u32> = part.iter().map(|&s| tokens[s]).collect();
        let positions: Vec<u32> = part.iter().map(|&s| s as u32).collect();
        let mut d = vec![0f32; part.len()];
        let mut cache = Scatter { inner: kv, slots: part, probe: Some((PROBE_LAYER, &mut d)) };
        let step =
            SeqStep { tokens: &toks, first_pos: 0, positions: Some(&positions), key_mask: None, kv: &mut cache, logits: Logits::None };
        model.write_kv_through(&mut [step], PROBE_LAYER)?;
        deviation.extend(d);
    }
    Ok(deviation)
}

/// A step's view of a sequence whose step tokens sit at scattered stored slots: row `i` of a
/// write goes over slot `slots[i]` (with `probe`, its change at that layer is recorded
/// first); reads are the sequence's, so the step attends to everything stored.
struct Scatter<'a, 'd> {
    inner: &'a mut SeqKv,
    slots: &'a [usize],
    probe: Option<(usize, &'d mut [f32])>,
}

impl KvCache for Scatter<'_, '_> {
    fn write(&mut self, layer: usize, _first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        debug_assert_eq!(num_tokens, self.slots.len());
        let w = keys.len() / num_tokens.max(1);
        // Runs of consecutive slots, written (and read back for the probe) together.
        let mut i = 0;
        while i < num_tokens {
            let mut j = i + 1;
            while j < num_tokens && self.slots[j] == self.slots[j - 1] + 1 {
                j += 1;
            }
            let first = self.slots[i];
            if let Some((_, d)) = self.probe.as_mut().filter(|(pl, _)| *pl == layer) {
                let (k_old, v_old) = self.inner.read_rows(layer, first..first + (j - i));
                for t in 0..j - i {
                    let row = (i + t) * w..(i + t + 1) * w;
                    let sq = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>();
                    d[i + t] = sq(&keys[row.clone()], &k_old[t * w..(t + 1) * w]) + sq(&values[row], &v_old[t * w..(t + 1) * w]);
                }
            }
            self.inner.overwrite(layer, first, &keys[i * w..j * w], &values[i * w..j * w], j - i);
            i = j;
        }
    }

    fn place(&mut self, _first_slot: usize, positions: &[u32]) -> Result<(), String> {
        // The slots already sit at these positions (the cache is linear): nothing moves.
        match positions.iter().zip(self.slots).find(|(&p, &s)| p as usize != self.inner.position(s)) {
            Some((p, s)) => Err(format!("blend: slot {s} is not at position {p}")),
            None => Ok(()),
        }
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.inner.for_each_chunk(layer, f)
    }

    fn for_each_chunk_of(&self, read: &KvRead<'_>, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.inner.for_each_chunk_of(read, f)
    }

    fn read_failure(&self) -> Option<String> {
        self.inner.read_failure()
    }
}
