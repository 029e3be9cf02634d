//! What the dual-stream crate's integration tests share: the tiny fixture model, token ids and
//! fact segments from text, an `EventSink` that keeps a job's events, a job from token ids, the
//! `ContextPolicy` methods a test policy takes unchanged from the wrapped policy, one turn run
//! the way the scheduler runs it, and a cold run to compare against.

#![allow(dead_code, unused_macros, unused_imports)]

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use engram_dual::FactSegment;
use engram_engine::{Event, EventSink, FinishReason, Job, SamplingParams};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

/// The `tiny` fixture (default seed), loaded from its HF folder once per test binary.
pub fn model() -> &'static Model {
    static M: std::sync::OnceLock<(tempfile::TempDir, Model)> = std::sync::OnceLock::new();
    &M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let f = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
        let m = Model::load(&f.hf_dir).unwrap();
        (dir, m)
    })
    .1
}

/// The tiny random-weight fixture (Q8_0 GGUF written, loaded from its HF folder), with the
/// directory that must outlive it.
pub fn tiny() -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    (dir, model)
}

/// [`tiny`] loaded twice: the second copy is a summarizer model of its own (an equal model the
/// engine does not run, so its summaries run in their own loop on the idle hook).
pub fn tiny_with_own_summarizer() -> (tempfile::TempDir, Arc<Model>, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    let summarizer = Arc::new(Model::load(&files.hf_dir).unwrap());
    (dir, model, summarizer)
}

/// `text`'s token ids, no special tokens.
pub fn ids(m: &Model, text: &str) -> Vec<u32> {
    m.tokenizer.encode(text, false).unwrap().ids
}

/// Fact `id` as the persistent stream's segment: ` Fact: {text}.` tokenized.
pub fn fact(m: &Model, id: u64, text: &str) -> FactSegment {
    FactSegment { id, text: text.into(), tokens: ids(m, &format!(" Fact: {text}.")) }
}

/// Collects a job's events.
#[derive(Clone, Default)]
pub struct Collect(pub Arc<Mutex<Vec<Event>>>);

impl EventSink for Collect {
    fn send(&self, event: Event) -> bool {
        self.0.lock().unwrap().push(event);
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

impl Collect {
    /// The streamed text and how the job finished.
    pub fn outcome(&self) -> (String, Option<FinishReason>) {
        let events = self.0.lock().unwrap();
        let text = events.iter().filter_map(|e| if let Event::Text(t) = e { Some(t.as_str()) } else { None }).collect();
        let finish = events.iter().find_map(|e| if let Event::Finished { finish, .. } = e { Some(*finish) } else { None });
        (text, finish)
    }
}

/// A job for `owner` given as token ids (no text, no special tokens added, no session).
pub fn job(owner: &str, prompt: &[u32], params: &SamplingParams) -> Job {
    Job {
        owner: owner.into(),
        session: None,
        text: None,
        add_special: false,
        prompt: prompt.to_vec(),
        params: params.clone(),
        pinned: false,
        long_context_after: None,
    }
}

/// A test policy's `PolicyLayer` inner policy: its `inner` field (a `SessionStore` or a
/// `DualStream`). The tests override only the methods they vary; the rest forward.
macro_rules! inner_layer {
    () => {
        fn inner(&self) -> &dyn engram_engine::ContextPolicy {
            &self.inner
        }
        fn inner_mut(&mut self) -> &mut dyn engram_engine::ContextPolicy {
            &mut self.inner
        }
    };
}
pub(crate) use inner_layer;

/// One turn of `owner`'s `thread` as the scheduler runs it on a `DualStream`: admitted, its
/// tokens prefilled on the view (a ring restored from disk verified then, the turn admitted
/// again if it proves damaged), `answer` tokens decoded greedily (the last sampled, not fed),
/// retired. Returns the answer's tokens and the logits after the prompt.
pub fn dual_turn(
    m: &Model,
    pool: &KvPool,
    p: &mut engram_dual::DualStream,
    owner: &str,
    thread: &str,
    prompt: &[u32],
    answer: usize,
) -> (Vec<u32>, Vec<f32>) {
    use engram_engine::{argmax, ContextPolicy, Retired};
    use engram_kv::{KvView, SeqKv};
    use engram_model::{Logits, SeqStep};
    let mut c = p.admit_tokens(owner, Some(thread), prompt, &m.tokenizer).unwrap();
    let mut restore = c.restore.take();
    let mut kv = KvView::new(c.spans.clone(), SeqKv::new(pool)).starting_at(c.own_first);
    let mut pos = kv.own_first_position() as u32;
    let (mut tokens, mut input, mut out, mut first_logits) = (c.tokens.clone(), c.tokens.clone(), Vec::new(), None);
    loop {
        let first = kv.own().len();
        kv.own_mut().reserve(input.len()).unwrap();
        let positions: Vec<u32> = (pos..pos + input.len() as u32).collect();
        let step = SeqStep { positions: Some(&positions), ..SeqStep::new(&input, first, &mut kv, Logits::Last) };
        let logits = m.forward(&mut [step]).unwrap().remove(0);
        pos += input.len() as u32;
        if let Some(r) = restore.take() {
            if !p.verify_restore(r) {
                return dual_turn(m, pool, p, owner, thread, prompt, answer);
            }
        }
        let t = argmax(&logits);
        first_logits.get_or_insert(logits);
        out.push(t);
        if out.len() == answer {
            let n = tokens.len();
            p.retire(Retired {
                owner: owner.into(),
                session_id: thread.into(),
                text: String::new(),
                tokens,
                token_ends: vec![0; n],
                kv: kv.into_own(),
                cache: None,
                unfed: Some(t),
            });
            return (out, first_logits.unwrap());
        }
        tokens.push(t);
        input = vec![t];
    }
}

/// The last logits of a checkout's tokens on its view, and the view's own KV (the turn).
pub fn on_view(m: &Model, pool: &KvPool, c: &engram_policy::Checkout) -> (Vec<f32>, engram_kv::SeqKv, usize) {
    let mut kv = engram_kv::KvView::new(c.spans.clone(), engram_kv::SeqKv::new(pool)).starting_at(c.own_first);
    let first = kv.own_first_position();
    kv.own_mut().reserve(c.tokens.len()).unwrap();
    let positions: Vec<u32> = (first..first + c.tokens.len()).map(|p| p as u32).collect();
    let step = engram_model::SeqStep {
        positions: Some(&positions),
        ..engram_model::SeqStep::new(&c.tokens, 0, &mut kv, engram_model::Logits::Last)
    };
    let logits = m.forward(&mut [step]).unwrap().remove(0);
    (logits, kv.into_own(), first)
}

/// A cold run: the stream's live tokens at their slots' positions (masked ones left out),
/// then `prompt` at `first` on — one sequence prefilled from nothing.
pub fn cold(m: &Model, pool: &KvPool, stream: &engram_dual::PersistentStream, prompt: &[u32], first: usize) -> Vec<f32> {
    let (mut tokens, mut positions, mut at) = (Vec::new(), Vec::new(), 0u32);
    for s in stream.segments() {
        for &t in &s.tokens {
            if !s.masked {
                tokens.push(t);
                positions.push(at);
            }
            at += 1;
        }
    }
    tokens.extend_from_slice(prompt);
    positions.extend((first..first + prompt.len()).map(|p| p as u32));
    let mut kv = engram_kv::SeqKv::new(pool);
    kv.reserve(tokens.len()).unwrap();
    let step = engram_model::SeqStep {
        positions: Some(&positions),
        ..engram_model::SeqStep::new(&tokens, 0, &mut kv, engram_model::Logits::Last)
    };
    m.forward(&mut [step]).unwrap().remove(0)
}

/// Two logit vectors equal to 1e-4 (float rounding of the same computation split differently).
pub fn assert_close(a: &[f32], b: &[f32], what: &str) {
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-4, "{what}: logits differ by {worst}");
}

/// A `DualStream` that hands the engine a job taken from it earlier (to look at) before its own.
pub struct Requeue {
    pub inner: engram_dual::DualStream,
    pub first: Option<engram_policy::BackgroundJob>,
}

impl engram_engine::PolicyLayer for Requeue {
    inner_layer!();
    fn next_background(&mut self) -> Option<engram_policy::BackgroundJob> {
        use engram_engine::ContextPolicy;
        self.first.take().or_else(|| self.inner.next_background())
    }
}
