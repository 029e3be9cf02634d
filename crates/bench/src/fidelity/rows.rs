//! The approximations `engram bench fidelity` measures, and how each one runs a window.
//!
//! A window is `context` (prefilled) then `scored` (decoded one token at a time, as
//! generation reads the cache, so a recent window or a budget that slides with the query
//! matters as it would). Every row returns the logits of the scored tokens; the exact path
//! (f32 KV, exact attention, every key) gives the reference.
//!
//! Adding a row (the seed issues' hooks: turn masks, DynaKV at a token budget, document
//! chunks from a cache): a [`Row`] variant, its name in [`Row::parse`] / [`Row::name`], its
//! run in [`Row::run`], and, if it drops keys, a [`Row::keep_rule`] so the table reports the
//! exact attention mass it keeps.

use anyhow::{bail, Context, Result};
use engram_dual::{TurnMask, TurnRing};
use engram_kv::{KvFormat, KvLayout, KvPool, KvView, SeqKv};
use engram_model::{AttentionPrecision, KeyMask, KvCache, Logits, Model, SeqStep};

use super::attention_mass::{KeepRule, MassRecorder};
use super::sim_quant::{Scheme, SimQuantKv};
use crate::common::forward_at;

/// Tokens always kept at the start by [`Row::SinkWindow`] (StreamingLLM's attention sinks).
pub const SINK: usize = 4;

/// Tokens per prefill step (the engine's default chunk).
const PREFILL_CHUNK: usize = engram_engine::DEFAULT_PREFILL_CHUNK;

/// One approximation of the exact path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Row {
    /// KV stored in `format`, attention computed at `precision` (q8/q4 KV, bf16 attention).
    Format { format: KvFormat, precision: AttentionPrecision },
    /// A 4-bit scheme simulated in f32 (the alternatives weighed against `q4`).
    Sim(Scheme),
    /// Eviction to a token budget: the first [`SINK`] tokens and the most recent ones, the
    /// budget sliding with each decoded token (StreamingLLM; the baseline any smarter
    /// eviction — whole turns, as the dual-stream ring does — has to beat). Evicted keys are hidden by a key mask,
    /// which `kv/tests/views_model.rs` shows equals leaving them out.
    SinkWindow { budget: usize },
    /// The context prefilled as independent chunks of `chunk` tokens, each computed alone at
    /// positions `0 ..` and moved into place ([`SeqKv::move_slots`]): document chunks' KV reused
    /// at new positions without recomputation (PerCache's chunk KV tree). Every key is attended.
    ChunkReuse { chunk: usize },
    /// The dual-stream ephemeral ring: the context split into turns of whole lines (at least
    /// [`TURN_TOKENS`] each), each turn computed on the ring's view as it stood (the
    /// first [`SINK`] tokens as anchors when `sinks`), the oldest whole turns evicted past
    /// `capacity` tokens and the rest moved down (not recomputed); the scored tokens decoded on
    /// the final view, at packed positions. The cost of forgetting whole turns.
    TurnRing { capacity: usize, sinks: bool },
}

impl Row {
    /// The default rows.
    pub const DEFAULT: &'static str = "f16,q8,q4,f16+bf16,q4+bf16,window:1024,window:2048,chunks:512,chunks:2048";

    /// Parses a row name: `f32 | f16 | q8 | q4` (KV format), with `+bf16` for bf16 attention;
    /// `window:N`; `chunks:N`; a simulated scheme (`q4-no-window`, `q4-sim`, `q4_1+window`,
    /// `kivi4`, `kivi4-sym`); or `sim` for all of those.
    pub fn parse(s: &str) -> Result<Vec<Row>> {
        let num = |v: &str, what: &str| -> Result<usize> {
            let n: usize = v.parse().with_context(|| format!("row {s:?}: {what} must be a number of tokens"))?;
            anyhow::ensure!(n > 0, "row {s:?}: {what} must be at least 1");
            Ok(n)
        };
        if s == "sim" {
            return Ok(Scheme::ALL.into_iter().map(Row::Sim).collect());
        }
        if let Some(scheme) = Scheme::ALL.into_iter().find(|x| x.name() == s) {
            return Ok(vec![Row::Sim(scheme)]);
        }
        if let Some(v) = s.strip_prefix("window:") {
            let budget = num(v, "the budget")?;
            anyhow::ensure!(budget > SINK, "row {s:?}: the budget must exceed the {SINK} sink tokens");
            return Ok(vec![Row::SinkWindow { budget }]);
        }
        if let Some(v) = s.strip_prefix("chunks:") {
            return Ok(vec![Row::ChunkReuse { chunk: num(v, "the chunk")? }]);
        }
        if let Some(v) = s.strip_prefix("turns:") {
            return Ok(vec![Row::TurnRing { capacity: num(v, "the capacity")?, sinks: true }]);
        }
        if let Some(v) = s.strip_prefix("turns-nosink:") {
            return Ok(vec![Row::TurnRing { capacity: num(v, "the capacity")?, sinks: false }]);
        }
        let (fmt, precision) = match s.strip_suffix("+bf16") {
            Some(f) => (f, AttentionPrecision::Bf16),
            None => (s, AttentionPrecision::Exact),
        };
        match fmt.parse::<KvFormat>() {
            Ok(format) => Ok(vec![Row::Format { format, precision }]),
            Err(_) => bail!(
                "unknown row {s:?}: expected f32|f16|q8|q4 (optionally +bf16), window:N, chunks:N, turns:N, turns-nosink:N, sim, or one of {}",
                Scheme::ALL.map(|x| x.name()).join(", ")
            ),
        }
    }

    pub fn name(&self) -> String {
        match *self {
            Row::Format { format, precision: AttentionPrecision::Exact } => format.name().to_string(),
            Row::Format { format, .. } => format!("{}+bf16", format.name()),
            Row::Sim(s) => s.name().to_string(),
            Row::SinkWindow { budget } => format!("window:{budget}"),
            Row::ChunkReuse { chunk } => format!("chunks:{chunk}"),
            Row::TurnRing { capacity, sinks: true } => format!("turns:{capacity}"),
            Row::TurnRing { capacity, sinks: false } => format!("turns-nosink:{capacity}"),
        }
    }

    /// What the row approximates, in words (the table's legend).
    pub fn describe(&self) -> String {
        match *self {
            Row::Format { format, precision: AttentionPrecision::Exact } => format!("KV stored as {format}"),
            Row::Format { format, .. } => format!("KV stored as {format}, bf16 attention"),
            Row::Sim(s) => format!("{} simulated in f32", s.name()),
            Row::SinkWindow { budget } => format!("KV budget of {budget} tokens: first {SINK} + most recent"),
            Row::ChunkReuse { chunk } => format!("context KV computed in independent {chunk}-token chunks, moved into place"),
            Row::TurnRing { capacity, sinks } => format!(
                "ring of whole turns (lines, {TURN_TOKENS}+ tokens each) within {capacity} tokens, oldest evicted and the rest moved{}",
                if sinks { format!(", first {SINK} tokens kept as anchors") } else { ", no anchors".into() }
            ),
        }
    }

    pub fn precision(&self) -> AttentionPrecision {
        match *self {
            Row::Format { precision, .. } => precision,
            _ => AttentionPrecision::Exact,
        }
    }

    /// Which keys the row keeps for a query, where it drops some.
    pub fn keep_rule(&self) -> Option<KeepRule> {
        match *self {
            Row::SinkWindow { budget } => {
                let recent = budget - SINK;
                Some(Box::new(move |q: usize, k: usize| k < SINK || k + recent > q))
            }
            _ => None,
        }
    }

    /// KV bytes the row holds at the last scored token, relative to f16 KV of every token,
    /// where that is the row's point.
    pub fn kv_vs_f16(&self, layout: KvLayout, tokens: usize) -> Option<f64> {
        let f16 = KvPool::new(layout, KvFormat::F16, 1).bytes_per_token() as f64;
        match *self {
            Row::Format { format, .. } => Some(KvPool::new(layout, format, 1).bytes_per_token() as f64 / f16),
            Row::Sim(s) => Some(s.bytes_per_head_token(layout.head_dim) / (4.0 * layout.head_dim as f64)),
            Row::SinkWindow { budget } => Some((budget.min(tokens)) as f64 / tokens as f64),
            Row::ChunkReuse { .. } => None,
            Row::TurnRing { capacity, sinks } => Some(((capacity + if sinks { SINK } else { 0 }).min(tokens)) as f64 / tokens as f64),
        }
    }

    /// Runs the window: `model` computes attention at [`Row::precision`]; `exact` is the
    /// context prefilled on the exact path (rows that evict after an exact prefill fork it).
    pub fn run(&self, model: &Model, exact: &SeqKv, context: &[u32], scored: &[u32]) -> Result<Vec<f32>> {
        let layout = KvLayout::of(&model.config);
        match *self {
            Row::Format { format, .. } => {
                let pool = KvPool::new(layout, format, 1 << 40);
                let mut kv = SeqKv::new(&pool);
                prefill(model, &mut kv, context)?;
                Ok(score(model, &mut kv, scored, &|_| None, &[])?.0)
            }
            Row::Sim(scheme) => {
                let c = &model.config;
                let mut kv = SimQuantKv::new(scheme, c.num_layers, c.num_kv_heads, c.head_dim);
                prefill(model, &mut kv, context)?;
                Ok(score(model, &mut kv, scored, &|_| None, &[])?.0)
            }
            Row::SinkWindow { budget } => {
                let mut kv = exact.fork(exact.len());
                let mask = |q: usize| {
                    // Keys before the query's own (which stays visible: past the mask's keys).
                    let mut m = KeyMask::none(1, q);
                    m.set_range(0, 0..SINK.min(q), true);
                    m.set_range(0, (q + 1).saturating_sub(budget - SINK).clamp(SINK.min(q), q)..q, true);
                    Some(m)
                };
                Ok(score(model, &mut kv, scored, &mask, &[])?.0)
            }
            Row::ChunkReuse { chunk } => {
                let pool = KvPool::new(layout, KvFormat::F32, 1 << 40);
                let mut kv = SeqKv::new(&pool);
                for (i, part) in context.chunks(chunk).enumerate() {
                    let first = i * chunk;
                    let positions: Vec<u32> = (0..part.len() as u32).collect();
                    // The chunk sees only itself: every earlier key hidden.
                    let mask = (first > 0).then(|| KeyMask::none(part.len(), first));
                    kv.reserve(part.len())?;
                    let step = SeqStep {
                        tokens: part,
                        first_pos: first,
                        positions: Some(&positions),
                        key_mask: mask.as_ref(),
                        kv: &mut kv,
                        logits: Logits::None,
                    };
                    model.forward(&mut [step])?;
                    if first > 0 {
                        kv.move_slots(first..first + part.len(), first, &model.config)?;
                    }
                }
                Ok(score(model, &mut kv, scored, &|_| None, &[])?.0)
            }
            Row::TurnRing { capacity, sinks } => {
                let pool = KvPool::new(layout, KvFormat::F32, 1 << 40);
                let anchors = if sinks { &context[..SINK.min(context.len())] } else { &[][..] };
                let mut persistent = SeqKv::new(&pool);
                prefill(model, &mut persistent, anchors)?;
                let mut ring = TurnRing::new(persistent, capacity, model.config.rope.clone());
                for turn in split_turns(model, &context[anchors.len()..]) {
                    let mut view = view_of(&ring, &pool);
                    let first = ring.next_position();
                    for part in turn.chunks(PREFILL_CHUNK) {
                        forward_at(model, &mut view, part, first, Logits::None)?;
                    }
                    ring.push(turn.to_vec(), view.into_own(), None, false)?;
                }
                let (mut view, first) = (view_of(&ring, &pool), ring.next_position());
                let mut logits = Vec::with_capacity(scored.len() * model.config.vocab);
                for t in scored.chunks(1) {
                    logits.extend(forward_at(model, &mut view, t, first, Logits::Last)?);
                }
                Ok(logits)
            }
        }
    }
}

/// Tokens a turn holds at least: turns are whole lines, cut at the first line end after this
/// many tokens (a stand-in for dialogue turns, 50–300 tokens in the dual-stream design, on running text).
pub const TURN_TOKENS: usize = 64;

/// The context cut into turns of whole lines (see [`TURN_TOKENS`]).
fn split_turns<'a>(model: &Model, tokens: &'a [u32]) -> Vec<&'a [u32]> {
    let mut turns = Vec::new();
    let mut start = 0;
    for (i, &t) in tokens.iter().enumerate() {
        if i + 1 - start >= TURN_TOKENS && model.tokenizer.decode(&[t], false).is_ok_and(|s| s.contains('\n')) {
            turns.push(&tokens[start..=i]);
            start = i + 1;
        }
    }
    if start < tokens.len() {
        turns.push(&tokens[start..]);
    }
    turns
}

/// A fresh own sequence after the ring's view (every turn attended).
fn view_of(ring: &TurnRing, pool: &KvPool) -> KvView {
    KvView::new(ring.view(&TurnMask::All).spans, SeqKv::new(pool))
}

/// A cache the harness can grow token by token: the KV store's sequences and the simulations.
pub trait Scorable: KvCache {
    /// Makes room for `n` more tokens.
    fn reserve_tokens(&mut self, n: usize) -> Result<()>;
    /// Tokens stored.
    fn stored(&self) -> usize;
    fn as_cache(&mut self) -> &mut dyn KvCache;
}

impl Scorable for SeqKv {
    fn reserve_tokens(&mut self, n: usize) -> Result<()> {
        Ok(self.reserve(n)?)
    }
    fn stored(&self) -> usize {
        self.len()
    }
    fn as_cache(&mut self) -> &mut dyn KvCache {
        self
    }
}

impl Scorable for SimQuantKv {
    fn reserve_tokens(&mut self, _n: usize) -> Result<()> {
        Ok(())
    }
    fn stored(&self) -> usize {
        self.len()
    }
    fn as_cache(&mut self) -> &mut dyn KvCache {
        self
    }
}

/// Prefills `tokens` after what `kv` holds, in the engine's chunks, at their slots' positions.
pub fn prefill(model: &Model, kv: &mut dyn Scorable, tokens: &[u32]) -> Result<()> {
    for part in tokens.chunks(PREFILL_CHUNK) {
        kv.reserve_tokens(part.len())?;
        let slot = kv.stored();
        model.forward(&mut [SeqStep::new(part, slot, kv.as_cache(), Logits::None)])?;
    }
    Ok(())
}

/// Decodes `scored` one token at a time after what `kv` holds (token at slot `s` sits at
/// position `s`), with `mask(s)` as its key mask; returns the logits of every token and, per
/// `rules`, the exact attention mass recalled (sum, count).
pub fn score(
    model: &Model,
    kv: &mut dyn Scorable,
    scored: &[u32],
    mask: &dyn Fn(usize) -> Option<KeyMask>,
    rules: &[KeepRule],
) -> Result<(Vec<f32>, Vec<(f64, usize)>)> {
    let mut logits = Vec::with_capacity(scored.len() * model.config.vocab);
    let mut mass = vec![(0.0, 0); rules.len()];
    for t in scored.chunks(1) {
        kv.reserve_tokens(1)?;
        let slot = kv.stored();
        let m = mask(slot);
        let out = if rules.is_empty() {
            let step =
                SeqStep { tokens: t, first_pos: slot, positions: None, key_mask: m.as_ref(), kv: kv.as_cache(), logits: Logits::Last };
            model.forward(&mut [step])?
        } else {
            let mut rec = MassRecorder::new(kv.as_cache(), rules, model.config.head_dim);
            let step = SeqStep { tokens: t, first_pos: slot, positions: None, key_mask: m.as_ref(), kv: &mut rec, logits: Logits::Last };
            let out = model.forward(&mut [step])?;
            for (acc, (s, n)) in mass.iter_mut().zip(rec.means()) {
                acc.0 += s;
                acc.1 += n;
            }
            out
        };
        logits.extend(out.into_iter().next().context("the forward pass returned no logits")?);
    }
    Ok((logits, mass))
}
