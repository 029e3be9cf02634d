//! `DualStream` (seed 000): a [`ContextPolicy`] that keeps, per user, a persistent stream of
//! anchors (system prompt, profile facts) prefilled once and shared read-only by every thread
//! of that user, and per thread a [`TurnRing`] of whole turns within a capacity in tokens.
//!
//! ```text
//!  job (owner = user, session = thread, prompt = the new turn's tokens)
//!    admit:  view = anchors + the ring's kept turns (spans) → the new turn prefills after them
//!    retire: the turn's tokens (prompt + answer) and KV join the ring → oldest whole turns
//!            evicted past the capacity, later ones moved down (no recomputation)
//! ```
//! A request sends only its new turn; the thread's earlier turns are the policy's, not the
//! client's. An answer cut at its length leaves its last token unfed; the thread's next turn
//! starts with it, so the ring holds the answer whole. With a sentence encoder, each turn keeps the embedding of its prompt text, and a
//! new prompt attends only the turns at least `threshold` similar to it plus the last
//! `keep_last` (at least 1, so the new turn always starts right after the ring's last token).
//!
//! Invariant: a thread's RAM is its ring (at most `capacity` tokens plus the newest turn and
//! pinned ones) plus a share of its user's anchors, however long the conversation; a request
//! attends exactly `TurnRing::view` (`crates/context/tests/ring_fuzz.rs`), and with nothing
//! forgotten its answer equals a cold run over anchors + every turn
//! (`crates/engine/tests/dual.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use engram_context::{Checkout, MatchKind, PendingRestore, TurnMask, TurnRing};
use engram_embed::TextEncoder;
use engram_kv::{KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};
use engram_tokenizer::Tokenizer;

use crate::policy::{ContextPolicy, PolicyStats, Retired};

/// Relevance masks: an encoder, the similarity a turn needs, and how many last turns are
/// always attended.
pub struct Relevance {
    pub encoder: Arc<dyn TextEncoder>,
    pub threshold: f32,
    pub keep_last: usize,
}

/// Counts of what the policy did (for `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DualStats {
    pub turns_evicted: u64,
    pub turns_masked: u64,
    pub anchors_prefilled: u64,
}

/// The dual-stream policy. See the module doc.
pub struct DualStream {
    model: Arc<Model>,
    pool: KvPool,
    capacity: usize,
    relevance: Option<Relevance>,
    /// Per user: the anchors' tokens and, once prefilled, their KV.
    anchors: HashMap<String, (Vec<u32>, Option<SeqKv>)>,
    threads: HashMap<(String, String), TurnRing>,
    /// The embedding of each running turn's prompt, attached when it joins its ring.
    running: HashMap<(String, String), Option<Vec<f32>>>,
    /// Per thread, the last answer's token that was sampled but never fed (it stopped at its
    /// length): the next turn starts with it.
    carry: HashMap<(String, String), u32>,
    stats: DualStats,
}

impl DualStream {
    /// A policy whose threads keep `capacity` tokens of turns (seed 000: 1,536).
    pub fn new(model: Arc<Model>, pool: KvPool, capacity: usize) -> DualStream {
        DualStream {
            model,
            pool,
            capacity,
            relevance: None,
            anchors: HashMap::new(),
            threads: HashMap::new(),
            running: HashMap::new(),
            carry: HashMap::new(),
            stats: DualStats::default(),
        }
    }

    /// Masks turns by relevance to each new prompt (`keep_last` is raised to 1).
    pub fn with_relevance(mut self, mut relevance: Relevance) -> DualStream {
        relevance.keep_last = relevance.keep_last.max(1);
        self.relevance = Some(relevance);
        self
    }

    /// Sets `user`'s anchors (system prompt and facts, as tokens), prefilled at the user's
    /// next request (kept as they are when unchanged). Threads already open keep the anchors
    /// they started with.
    pub fn set_anchors(&mut self, user: &str, tokens: Vec<u32>) {
        if self.anchors.get(user).map_or(true, |(t, _)| *t != tokens) {
            self.anchors.insert(user.to_string(), (tokens, None));
        }
    }

    /// What the policy did so far.
    pub fn dual_stats(&self) -> DualStats {
        self.stats
    }

    /// `owner`'s thread, opened over the user's anchors (prefilled now if they are not yet).
    fn thread(&mut self, owner: &str, thread: &str) -> Result<&mut TurnRing, String> {
        let key = (owner.to_string(), thread.to_string());
        if !self.threads.contains_key(&key) {
            let (tokens, kv) = self.anchors.entry(owner.to_string()).or_insert_with(|| (Vec::new(), None));
            if kv.is_none() {
                let mut fresh = SeqKv::new(&self.pool);
                if !tokens.is_empty() {
                    fresh.reserve(tokens.len()).map_err(|e| format!("prefilling the anchors: {e}"))?;
                    self.model
                        .forward(&mut [SeqStep::new(tokens, 0, &mut fresh, Logits::None)])
                        .map_err(|e| format!("prefilling the anchors: {e}"))?;
                    self.stats.anchors_prefilled += 1;
                }
                *kv = Some(fresh);
            }
            let shared = kv.as_ref().expect("set above");
            let ring = TurnRing::new(shared.fork(shared.len()), self.capacity, self.model.config.rope.clone());
            self.threads.insert(key.clone(), ring);
        }
        Ok(self.threads.get_mut(&key).expect("inserted above"))
    }
}

impl ContextPolicy for DualStream {
    fn admit(
        &mut self,
        owner: &str,
        session: Option<&str>,
        _text: Option<&str>,
        _add_special: bool,
        prompt: &[u32],
        tok: &Tokenizer,
    ) -> Result<Checkout, String> {
        let thread = session.unwrap_or("default").to_string();
        let query = match &self.relevance {
            Some(r) => {
                let text = tok.decode(prompt, true).map_err(|e| e.to_string())?;
                let v = r.encoder.encode(&[text]).map_err(|e| format!("embedding the prompt: {e}"))?;
                v.vectors.into_iter().next()
            }
            None => None,
        };
        let mask = match (&self.relevance, &query) {
            (Some(r), Some(q)) => TurnMask::Relevant { query: q.clone(), threshold: r.threshold, keep_last: r.keep_last },
            _ => TurnMask::All,
        };
        let view = self.thread(owner, &thread)?.view(&mask);
        self.stats.turns_masked += view.masked.len() as u64;
        let key = (owner.to_string(), thread.clone());
        let tokens: Vec<u32> = self.carry.remove(&key).into_iter().chain(prompt.iter().copied()).collect();
        self.running.insert(key, query);
        Ok(Checkout {
            session_id: thread,
            kind: if view.spans.is_empty() { MatchKind::Miss } else { MatchKind::Prefix },
            token_ends: vec![0; tokens.len()],
            tokens,
            reused: 0,
            kv: SeqKv::new(&self.pool),
            restore: None,
            spans: view.spans,
        })
    }

    fn pin_owner(&mut self, _owner: &str) {}

    /// Rings are bounded by their capacity; nothing idle to offload yet.
    fn make_room(&mut self, bytes: usize) -> bool {
        self.pool.budget().saturating_sub(self.pool.used()) >= bytes
    }

    /// No restores: nothing is persisted yet.
    fn verify_restore(&mut self, _restore: PendingRestore) -> bool {
        true
    }

    fn retire(&mut self, r: Retired) {
        let key = (r.owner.clone(), r.session_id.clone());
        let embedding = self.running.remove(&key).flatten();
        if r.tokens.is_empty() {
            return;
        }
        let Some(ring) = self.threads.get_mut(&key) else { return };
        if let Some(t) = r.unfed {
            self.carry.insert(key.clone(), t);
        }
        match ring.push(r.tokens, r.kv, embedding, false) {
            Ok(evicted) => self.stats.turns_evicted += evicted.len() as u64,
            Err(e) => tracing::warn!("thread {:?} of {:?}: the turn is not kept: {e}", r.session_id, r.owner),
        }
    }

    fn forget_owner(&mut self, owner: &str) {
        self.anchors.remove(owner);
        self.threads.retain(|(o, _), _| o != owner);
        self.running.retain(|(o, _), _| o != owner);
        self.carry.retain(|(o, _), _| o != owner);
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            sessions_idle: self.threads.len() as u64,
            turns_evicted: self.stats.turns_evicted,
            turns_masked: self.stats.turns_masked,
            ..PolicyStats::default()
        }
    }

    fn set_anchors(&mut self, owner: &str, tokens: Vec<u32>) {
        DualStream::set_anchors(self, owner, tokens)
    }
}
