//! The long-context layer (`engram_sparse::LongContext`) over the session store, driven
//! through the engine: below the threshold a conversation is served exactly as by the session
//! store alone (same answers, same cached tokens); past it the conversation switches to a
//! sparse cache offloaded to disk, keeps it between turns, and the next turn extends it
//! without a re-prefill (only the new tokens are computed); with a retrieval budget covering
//! the history the answers are the session store's.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Instant;

use engram_context::{SessionStore, SessionsConfig};
use engram_engine::{run_engine, Command, ContextPolicy, Event, EventSink, Job, Metrics, SamplingParams, SchedulerConfig};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_policy::OwnerKey;
use engram_sparse::{LongContext, LongContextConfig, Method, SparseConfig};

/// Sends a job's events to the test thread.
pub(crate) struct ToTest(Sender<Event>);

impl EventSink for ToTest {
    fn send(&self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// One turn's answer, and its `Started` counts.
#[derive(Debug, PartialEq)]
pub(crate) struct Turn {
    pub text: String,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Prompt tokens the engine computed for it.
    pub computed: u64,
    /// The generated token ids (with `logprobs` asked for).
    pub generated: Vec<u32>,
}

/// An engine on its own thread running `policy`, and a way to run one turn at a time.
pub(crate) struct Engine {
    tx: Option<Sender<Command>>,
    pending: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Engine {
    pub fn start(model: &Arc<Model>, pool: &KvPool, policy: Box<dyn ContextPolicy>) -> Engine {
        let (tx, rx) = mpsc::channel();
        let (pending, metrics) = (Arc::new(AtomicUsize::new(0)), Arc::new(Metrics::default()));
        let thread = {
            let (model, pool, pending, metrics) = (model.clone(), pool.clone(), pending.clone(), metrics.clone());
            let config = SchedulerConfig { prefill_chunk: 32, ..SchedulerConfig::default() };
            std::thread::spawn(move || run_engine(&model, pool, config, policy, metrics, pending, rx))
        };
        Engine { tx: Some(tx), pending, metrics, thread: Some(thread) }
    }

    /// Runs `job` to its end.
    pub fn turn(&self, job: Job) -> Turn {
        let (etx, erx) = mpsc::channel();
        let before = self.metrics.tokens_computed.load(Relaxed);
        self.pending.fetch_add(1, Relaxed);
        self.tx.as_ref().unwrap().send(Command::Submit(job, Box::new(ToTest(etx)), Instant::now())).unwrap();
        let mut turn = Turn { text: String::new(), prompt_tokens: 0, cached_tokens: 0, computed: 0, generated: Vec::new() };
        for e in erx {
            match e {
                Event::Started { prompt_tokens, cached_tokens, .. } => {
                    (turn.prompt_tokens, turn.cached_tokens) = (prompt_tokens, cached_tokens)
                }
                Event::Text(t) => turn.text.push_str(&t),
                Event::Finished { .. } => break,
                Event::Failed(e) => panic!("the turn failed: {e}"),
                Event::Logprob(l) => turn.generated.push(l.token),
            }
        }
        turn.computed = self.metrics.tokens_computed.load(Relaxed) - before;
        turn
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(crate) fn tiny() -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    (dir, Arc::new(Model::load(&files.hf_dir).unwrap()))
}

pub(crate) fn pool(model: &Model) -> KvPool {
    KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20)
}

pub(crate) fn sessions(model: &Model, pool: &KvPool) -> Box<dyn ContextPolicy> {
    Box::new(SessionStore::from_config(model, pool, &SessionsConfig::default()))
}

fn long(model: &Model, pool: &KvPool, after: usize, budget: usize, dir: &std::path::Path) -> Box<dyn ContextPolicy> {
    let cfg = LongContextConfig {
        sparse: SparseConfig { budget, sinks: 4, recent: 16, ..SparseConfig::new(Method::DYNAKV) },
        ram_budget: 8 << 10,
        cache_bytes: 4 << 10,
        ..LongContextConfig::new(after, dir.to_path_buf())
    };
    Box::new(LongContext::new(sessions(model, pool), cfg, model.config.clone(), model.fingerprint.0, pool.clone()))
}

/// Eight greedy tokens, whatever they are, reported by id.
pub(crate) fn params() -> SamplingParams {
    SamplingParams { max_tokens: 8, ignore_eos: true, logprobs: Some(0), ..SamplingParams::default() }
}

/// A conversation of three turns given as text: each prompt is the previous one, its answer
/// and a new line. Returns each turn with its prompt's cold tokenization.
fn text_conversation(model: &Model, engine: &Engine) -> Vec<(Vec<u32>, Turn)> {
    let mut text = "The KV cache keeps every turn's keys and values in blocks of 32 tokens. ".repeat(12);
    let mut turns = Vec::new();
    for line in ["\nUser: what is kept?\n", "\nUser: and for how long?\n", "\nUser: thanks.\n"] {
        text.push_str(line);
        let prompt = model.tokenizer.encode(&text, true).unwrap().ids;
        let job =
            Job { text: Some(text.clone()), add_special: true, ..Job::from_tokens(OwnerKey::tenant_own("t"), prompt.clone(), params()) };
        let t = engine.turn(job);
        text.push_str(&t.text);
        turns.push((prompt, t));
    }
    turns
}

/// How many turns from the first were fed the same tokens by the session store and by a
/// sparse session: while each prompt's cold tokenization starts with the previous prompt and
/// every token fed of its answer (all but the last sampled), both feed the cold tokens (the
/// session store's reuse and the sparse session's first rule agree); past a turn where it does
/// not, the sparse session keeps the generated tokens and the two differ by design.
fn turns_fed_alike(turns: &[(Vec<u32>, Turn)]) -> usize {
    let mut n = 1;
    while n < turns.len() {
        let (prev, t) = &turns[n - 1];
        let held: Vec<u32> = prev.iter().chain(&t.generated[..t.generated.len() - 1]).copied().collect();
        if !turns[n].0.starts_with(&held) {
            break;
        }
        n += 1;
    }
    n
}

#[test]
fn below_the_threshold_the_layer_serves_as_the_session_store_does() {
    let (_d, model) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let p = pool(&model);
    let want = text_conversation(&model, &Engine::start(&model, &p, sessions(&model, &p)));
    let p = pool(&model);
    let got = text_conversation(&model, &Engine::start(&model, &p, long(&model, &p, 1 << 20, 8, dir.path())));
    assert_eq!(got, want);
    assert!(want[1].1.cached_tokens > 0, "the session store reuses the first turn: {want:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing offloaded");
}

#[test]
fn past_the_threshold_a_conversation_goes_sparse_and_its_next_turns_extend_it() {
    let (_d, model) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let p = pool(&model);
    let want = text_conversation(&model, &Engine::start(&model, &p, sessions(&model, &p)));
    // A retrieval budget covering the history: sparse reads attend every key, so the answers
    // are the exact ones while the cache is offloaded and kept between turns.
    let p = pool(&model);
    let engine = Engine::start(&model, &p, long(&model, &p, 64, 4096, dir.path()));
    let got = text_conversation(&model, &engine);
    let alike = turns_fed_alike(&want);
    assert!(alike >= 2, "the fixture's second prompt extends the first turn's tokens (else this test shows less)");
    for i in 0..alike {
        assert_eq!(got[i].1.text, want[i].1.text, "turn {i}: the same tokens fed, a covering budget: the exact answer");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "one kept session, its KV in one offload file");
    let got: Vec<Turn> = got.into_iter().map(|(_, t)| t).collect();
    for (i, t) in got.iter().enumerate().skip(1) {
        let before = &got[i - 1];
        assert!(t.cached_tokens >= before.prompt_tokens, "turn {i} extends the sparse cache: {t:?} after {before:?}");
        assert_eq!(t.computed as usize, t.prompt_tokens - t.cached_tokens, "turn {i} computes only its new tokens");
    }
    drop(engine);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the file goes with the cache");
}

#[test]
fn a_token_conversation_past_the_threshold_reuses_its_sparse_cache() {
    let (_d, model) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let p = pool(&model);
    // Sparse for real: 8 keys retrieved of hundreds.
    let engine = Engine::start(&model, &p, long(&model, &p, 64, 8, dir.path()));
    let mut tokens: Vec<u32> = (0..300u32).map(|i| 5 + (i * 7919 + i * i * 31) % 200).collect();
    let owner = OwnerKey::tenant_own("t");
    let with_ids = SamplingParams { logprobs: Some(0), ..params() };
    let first = engine.turn(Job::from_tokens(owner.clone(), tokens.clone(), with_ids.clone()));
    assert_eq!((first.cached_tokens, first.computed as usize), (0, tokens.len()));
    // The answer's tokens, then a new message.
    assert_eq!(first.generated.len(), 8);
    tokens.extend(&first.generated);
    let held = tokens.len();
    tokens.extend((0..20u32).map(|i| 7 + i));
    let second = engine.turn(Job::from_tokens(owner, tokens.clone(), with_ids));
    assert_eq!(second.generated.len(), 8);
    assert_eq!(second.cached_tokens, held - 1, "the sparse cache (prompt + every fed token) was extended: {second:?}");
    assert_eq!(second.computed as usize, tokens.len() - second.cached_tokens, "{second:?} (held {held})");
    assert!(p.used() > 0, "the kept sparse session's RAM is charged to the pool");
}

#[test]
fn the_layer_forwards_every_seam_method() {
    let (_d, model) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let pool = engram_policy::testing::small_pool();
    engram_policy::testing::exercise_every_method(|inner| {
        let cfg = LongContextConfig::new(1 << 20, dir.path().to_path_buf());
        Box::new(LongContext::new(inner, cfg, model.config.clone(), model.fingerprint.0, pool))
    });
}
