//! The dual-stream policy through the scheduler: a 40-turn conversation on one thread, each
//! request sending only its new turn, answers exactly what the model says on the ring's view
//! (a reference that keeps its own `TurnRing` and decodes on it directly) — with every turn
//! attended, and with relevance masks from an encoder — while the thread's KV stays within
//! the ring's bound however many turns pass.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use crate::common;
use common::{tiny, Collect};
use engram_dual::{DualStats, DualStream, Relevance};
use engram_dual::{TurnMask, TurnRing};
use engram_embed::TextEncoder;
use engram_engine::{
    argmax, run_engine, Command, ContextPolicy, Decoding, Metrics, PooledEncoder, Retired, SamplingParams, SchedulerConfig,
};
use engram_engine::{AdmitRequest, PolicyLayer};
use engram_kv::{KvFormat, KvLayout, KvPool, KvView, SeqKv};
use engram_model::{Logits, Model, SeqStep};
use engram_policy::Checkout;

const CAPACITY: usize = 96;
const ANSWER: usize = 6;

/// The policy, recording the pool's bytes in use after each turn joins its ring.
struct Recorder {
    inner: DualStream,
    pool: KvPool,
    used: Arc<Mutex<Vec<usize>>>,
    stats: Arc<Mutex<DualStats>>,
}

impl PolicyLayer for Recorder {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.inner.admit(req)
    }
    fn retire(&mut self, r: Retired) {
        self.inner.retire(r);
        self.used.lock().unwrap().push(self.pool.used());
        *self.stats.lock().unwrap() = self.inner.dual_stats();
    }
}

/// What the model answers to `prompt` on `ring`'s view under `mask`, greedy, `ANSWER`
/// tokens; the turn (`carry`, the previous answer's unfed last token, then the prompt and the
/// answer tokens that were fed) joins the ring. Returns the answer and its unfed last token.
fn reference_turn(
    m: &Model,
    pool: &KvPool,
    ring: &mut TurnRing,
    mask: &TurnMask,
    carry: Option<u32>,
    prompt: &[u32],
    embedding: Option<Vec<f32>>,
) -> (String, Option<u32>) {
    let prompt: Vec<u32> = carry.into_iter().chain(prompt.iter().copied()).collect();
    let prompt = &prompt[..];
    let view = ring.view(mask);
    let mut kv = KvView::new(view.spans, SeqKv::new(pool));
    let mut pos = view.next_position as u32;
    let mut tokens = prompt.to_vec();
    let params = SamplingParams { max_tokens: ANSWER, ignore_eos: true, ..Default::default() };
    let mut out = Decoding::new(&m.tokenizer, prompt, &params, 0);
    let (mut text, mut input) = (String::new(), prompt.to_vec());
    loop {
        kv.own_mut().reserve(input.len()).unwrap();
        let positions: Vec<u32> = (pos..pos + input.len() as u32).collect();
        let first = kv.own().len();
        let step =
            SeqStep { tokens: &input, first_pos: first, positions: Some(&positions), key_mask: None, kv: &mut kv, logits: Logits::Last };
        let logits = m.forward(&mut [step]).unwrap().remove(0);
        pos += input.len() as u32;
        let t = argmax(&logits);
        let a = out.accept(t, true).unwrap();
        text.push_str(&a.release);
        if a.done.is_some() {
            ring.push(tokens, kv.into_own(), embedding, false).unwrap();
            // Stopped at its length: the last token was sampled, not fed.
            return (text, Some(t));
        }
        tokens.push(t);
        input = vec![t];
    }
}

fn conversation(relevance: Option<(f32, usize)>) {
    let (_d, model) = tiny();
    let layout = KvLayout::of(&model.config);
    let pool = KvPool::new(layout, KvFormat::F32, 64 << 20);
    let ids = |t: &str, special: bool| model.tokenizer.encode(t, special).unwrap().ids;
    let anchors = ids("System: answer in one line. The user writes Rust.", true);
    let topics = ["the borrow checker", "a KV cache", "sourdough bread", "async runtimes", "the weather", "lifetimes"];
    let prompts: Vec<Vec<u32>> =
        (0..40).map(|i| ids(&format!(" User: tell me about {} ({i}). Assistant:", topics[i % topics.len()]), false)).collect();
    let encoder: Option<Arc<dyn TextEncoder>> =
        relevance.map(|_| Arc::new(PooledEncoder::new(model.clone(), "tiny")) as Arc<dyn TextEncoder>);

    // The reference: its own ring, decoded on directly.
    let mut anchor_kv = SeqKv::new(&pool);
    anchor_kv.reserve(anchors.len()).unwrap();
    model.forward(&mut [SeqStep::new(&anchors, 0, &mut anchor_kv, Logits::None)]).unwrap();
    let mut ring = TurnRing::new(anchor_kv, CAPACITY, model.config.rope.clone());
    let (mut want, mut carry) = (Vec::new(), None);
    for p in &prompts {
        let query = encoder.as_ref().map(|e| e.encode(&[model.tokenizer.decode(p, true).unwrap()]).unwrap().vectors.remove(0));
        let mask = match (relevance, &query) {
            (Some((threshold, keep_last)), Some(q)) => TurnMask::Relevant { query: q.clone(), threshold, keep_last },
            _ => TurnMask::All,
        };
        let (text, unfed) = reference_turn(&model, &pool, &mut ring, &mask, carry, p, query);
        want.push(text);
        carry = unfed;
    }
    drop(ring);

    // The scheduler with the policy: one thread of user "u", one request per turn.
    let mut policy = DualStream::new(model.clone(), pool.clone(), CAPACITY);
    if let (Some((threshold, keep_last)), Some(encoder)) = (relevance, &encoder) {
        policy = policy.with_relevance(Relevance { encoder: encoder.clone(), threshold, keep_last });
    }
    policy.set_anchors("u", anchors.clone());
    let (used, stats) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(DualStats::default())));
    let recorder = Recorder { inner: policy, pool: pool.clone(), used: used.clone(), stats: stats.clone() };
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending, pool) = (model.clone(), pending.clone(), pool.clone());
        std::thread::spawn(move || {
            run_engine(&model, pool, SchedulerConfig::default(), Box::new(recorder), Arc::new(Metrics::default()), pending, rx)
        })
    };
    let params = SamplingParams { max_tokens: ANSWER, ignore_eos: true, ..Default::default() };
    let sinks: Vec<Collect> = prompts.iter().map(|_| Collect::default()).collect();
    for (p, sink) in prompts.iter().zip(&sinks) {
        let job = engram_engine::Job { session: Some("t1".into()), ..common::job("u", p, &params) };
        pending.fetch_add(1, Relaxed);
        tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
    }
    drop(tx);
    engine.join().unwrap();

    for (i, (sink, want)) in sinks.iter().zip(&want).enumerate() {
        assert_eq!(&sink.outcome().0, want, "turn {i}: the scheduler's answer vs the ring view's");
    }
    let stats = *stats.lock().unwrap();
    assert!(stats.turns_evicted > 20, "{stats:?}: a 40-turn conversation passes a {CAPACITY}-token ring");
    assert_eq!(stats.anchors_prefilled, 1, "{stats:?}");
    if relevance.is_some() {
        // At 0.95 the tiny model's pooled vectors mask about two thirds of the maskable turns
        // (54 of 77 here), so both paths run.
        assert!(stats.turns_masked > 0 && stats.turns_masked < 77, "{stats:?}: some turns were irrelevant, not all");
    }
    // RAM: the anchors' blocks plus the ring's turns (each turn's own blocks), flat once full.
    let used = used.lock().unwrap();
    let block = pool.block_bytes();
    let shortest = prompts.iter().map(Vec::len).min().unwrap() + ANSWER - 1;
    let bound = (anchors.len().div_ceil(32) + CAPACITY / shortest + 1) * block;
    assert!(used.iter().all(|&u| u <= bound), "KV in use {used:?} past {bound}");
}

#[test]
fn a_long_thread_answers_on_the_ring_view_within_fixed_memory() {
    conversation(None);
}

#[test]
fn relevance_masks_answer_on_the_masked_view() {
    conversation(Some((0.95, 1)));
}
