//! A draft model for speculative decoding (the dual-stream design's speculative branches):
//! a second, smaller model that shares the target's vocabulary drafts `k` tokens greedily,
//! one chain per step, which the target verifies in one batched step through the same
//! [`DraftTree`] path as prompt lookup.
//!
//! ```text
//!  target sequence: … t₁ t₂ [next]                 draft KV (its own pool): … t₁ t₂ next d₁ … dₖ₋₁
//!  draft:  next → d₁ → d₂ → … → dₖ  (argmax, k forwards of the draft model)
//!  verify: the target's walk accepts d₁ … dₐ; the draft KV is cut back to the tokens the
//!          target kept (its common prefix with them) at the next draft — kept in step
//! ```
//! The draft model reads only the sequence's own tokens (a prompt, or a dual-stream turn),
//! at positions `0..`, not the spans a context policy attaches before them: drafts are
//! guesses, verification is exact, so a draft model with less context only drafts worse.
//!
//! Invariant: a draft never changes what is generated — the walk in `speculate.rs` draws every
//! token from the target's logits (a greedy draft is a point mass, so the walk is standard
//! speculative sampling: accepted with probability p(d), else drawn from p without d) — and a
//! draft model with another vocabulary (size, or any id's bytes) is refused at construction
//! (`tests/it/speculation.rs`).

use std::sync::Arc;

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

use crate::sampling::argmax;
use crate::speculate::DraftTree;

/// A draft model and the pool its sequences' KV comes from.
pub struct DraftModel {
    model: Arc<Model>,
    pool: KvPool,
    /// Most tokens drafted per step.
    pub max_drafts: usize,
    /// The draft model's weight bytes read per token over the target's.
    cost_ratio: f64,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DraftModel({} layers, vocab {}, k {})", self.model.config.num_layers, self.model.config.vocab, self.max_drafts)
    }
}

/// What a sequence's draft model has computed: its KV and the tokens it holds.
pub struct DraftState {
    kv: SeqKv,
    tokens: Vec<u32>,
    /// Mean seconds of the last draft's forward calls of at most two tokens (the chain's
    /// steps; a long catch-up, such as the prompt's, is not counted), if it made any.
    step_secs: Option<f64>,
}

impl DraftState {
    /// Mean seconds of one draft step in the last [`DraftModel::draft`] (its forward calls of
    /// one or two tokens), `None` if it made none: what a draft costs besides its row in the
    /// target's step.
    pub fn step_secs(&self) -> Option<f64> {
        self.step_secs
    }
}

impl DraftModel {
    /// `draft` as drafter for `target`, at most `max_drafts` tokens a step, its KV (f32) in a
    /// pool of `budget_bytes`. Errors: a draft model whose vocabulary differs from the
    /// target's — another size, or any id standing for other bytes — or `max_drafts` 0.
    pub fn new(target: &Model, draft: Arc<Model>, max_drafts: usize, budget_bytes: usize) -> Result<DraftModel, String> {
        if max_drafts == 0 {
            return Err("a draft model must draft at least one token a step".into());
        }
        let (tv, dv) = (target.config.vocab, draft.config.vocab);
        if tv != dv || target.tokenizer.vocab_size() != draft.tokenizer.vocab_size() {
            return Err(format!(
                "the draft model's vocabulary ({dv} logits, {} tokens) is not the target's ({tv} logits, {} tokens)",
                draft.tokenizer.vocab_size(),
                target.tokenizer.vocab_size()
            ));
        }
        let n = target.tokenizer.vocab_size() as u32;
        if let Some(id) = (0..n).find(|&id| target.tokenizer.token_bytes(id) != draft.tokenizer.token_bytes(id)) {
            return Err(format!(
                "the draft model's tokenizer differs from the target's: id {id} is {:?} for the target, {:?} for the draft",
                String::from_utf8_lossy(&target.tokenizer.token_bytes(id)),
                String::from_utf8_lossy(&draft.tokenizer.token_bytes(id))
            ));
        }
        let pool = KvPool::new(KvLayout::of(&draft.config), KvFormat::F32, budget_bytes);
        let bytes_per_token = |m: &Model| m.weights.bytes_read_per_token(m.config.moe.map_or(0, |e| e.top_k));
        let cost_ratio = bytes_per_token(&draft) as f64 / bytes_per_token(target).max(1) as f64;
        Ok(DraftModel { model: draft, pool, max_drafts, cost_ratio })
    }

    /// The draft model's weight bytes read per token over the target's: what a draft step is
    /// expected to cost, in target steps, before one is timed (the scheduler's draft budget).
    pub fn cost_ratio(&self) -> f64 {
        self.cost_ratio
    }

    /// The draft model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// A chain of at most `budget` (and `max_drafts`) greedy drafts after `next`, the token
    /// about to be fed after `context`. `state` (a sequence's, `None` at first) is brought in
    /// step: cut back to its common prefix with `context + [next]`, the rest fed. Past the
    /// draft model's context, or on an error (its pool full), no drafts: the root alone.
    pub fn draft(&self, state: &mut Option<DraftState>, context: &[u32], next: u32, budget: usize) -> DraftTree {
        let mut tree = DraftTree::root(next);
        let k = budget.min(self.max_drafts);
        if k == 0 || context.len() + 1 + k > self.model.config.max_positions {
            return tree;
        }
        let s = state.get_or_insert_with(|| DraftState { kv: SeqKv::new(&self.pool), tokens: Vec::new(), step_secs: None });
        let wanted_len = context.len() + 1;
        let at = |i: usize| if i < context.len() { context[i] } else { next };
        // Keep what agrees, but recompute at least the last token: its logits start the chain.
        let common = s.tokens.iter().enumerate().take_while(|&(i, &t)| i < wanted_len && at(i) == t).count().min(wanted_len - 1);
        s.kv.truncate(common);
        s.tokens.truncate(common);
        let feed: Vec<u32> = (common..wanted_len).map(at).collect();
        let mut chain = Vec::with_capacity(k);
        let mut input = feed;
        let (mut timed, mut secs) = (0, 0.0);
        for i in 0..k {
            let t0 = std::time::Instant::now();
            let step = self.step(s, &input);
            if input.len() <= 2 {
                (timed, secs) = (timed + 1, secs + t0.elapsed().as_secs_f64());
            }
            let logits = match step {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!("the draft model stops drafting: {e}");
                    break;
                }
            };
            let d = argmax(&logits);
            chain.push(d);
            if i + 1 < k {
                input = vec![d];
            }
        }
        s.step_secs = (timed > 0).then(|| secs / timed as f64);
        tree.insert(&chain, k);
        tree
    }

    /// Feeds `input` after `state`'s tokens; the last token's logits.
    fn step(&self, s: &mut DraftState, input: &[u32]) -> Result<Vec<f32>, String> {
        let have = s.kv.len();
        s.kv.reserve(input.len()).map_err(|e| e.to_string())?;
        let step = SeqStep::new(input, have, &mut s.kv, Logits::Last);
        match self.model.forward(&mut [step]) {
            Ok(mut out) => {
                s.tokens.extend_from_slice(input);
                Ok(out.remove(0))
            }
            Err(e) => {
                s.kv.truncate(have);
                Err(e.to_string())
            }
        }
    }
}
