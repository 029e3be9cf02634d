//! [`Rag`]: the pipeline over a model — QA bank, retrieval, chunk KV tree, generation — and
//! the bookkeeping that keeps the caches right when documents change.
//!
//! ```text
//!  query(q):  t0 ─ embed ─ QA lookup ─┬─ hit ─► answer (cache_level qa)
//!                                    └─ miss ─ retrieve top-k ─ segments ─ tree lookup ─ prefill rest ─ decode
//!                                        answer (cache_level kv if a tree prefix was used, else none)
//!  ingest:    bank ingest ─ QA refresh (removed sources, added chunks entering a top-k) ─ tree forgets removed chunks
//! ```
//! Invariant: with the KV tree on, an answer's tokens equal those of a cold prefill of the
//! same prompt tokens (`tests/it/pipeline.rs`); a QA answer is never served from an entry whose
//! retrieval a later ingest changed (refresh runs inside every ingest and remove).

use std::sync::Arc;
use std::time::Instant;

use engram_engine::SamplingParams;
use engram_kv::KvPool;
use engram_model::Model;

use crate::bank::{ChunkId, IngestReport, KnowledgeBank};
use crate::chunk_store::ChunkStore;
use crate::error::{RagError, Result};
use crate::front::{front_half, Front, QaLookup};
use crate::kv_tree::{KvTree, SegKey};
use crate::parse::DocKind;
use crate::qa::{QaBank, DEFAULT_THRESHOLD};
use crate::run::{self, Ran, Request};

/// The default system prompt (the first segment of every prompt).
pub const DEFAULT_SYSTEM_PROMPT: &str =
    "You are a personal assistant. Answer the question from the user's e-mails, notes and calendar below.\n";

/// How the pipeline answers.
#[derive(Clone, Debug)]
pub struct RagConfig {
    /// Chunks retrieved per query.
    pub top_k: usize,
    pub system_prompt: String,
    pub params: SamplingParams,
    /// How chunk KV is reused when the KV cache is on (default: exact prefix reuse).
    pub chunk_reuse: ChunkReuse,
}

/// How a prompt reuses chunk KV.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "lowercase", tag = "mode")]
pub enum ChunkReuse {
    /// The chunk KV tree: the longest stored prefix of (system, chunks…), exact (lossless).
    #[default]
    Prefix,
    /// Position-independent: every chunk's KV from the [`ChunkStore`], moved into place,
    /// then the `ratio` most-deviating moved tokens recomputed (CacheBlend; approximate unless
    /// `ratio` is 1).
    Blend { ratio: f32 },
}

impl ChunkReuse {
    /// `prefix`, or `blend` with `ratio` (in `[0, 1]`).
    pub fn parse(mode: &str, ratio: f32) -> Result<ChunkReuse> {
        match mode {
            "prefix" => Ok(ChunkReuse::Prefix),
            "blend" if (0.0..=1.0).contains(&ratio) => Ok(ChunkReuse::Blend { ratio }),
            "blend" => Err(RagError::bad_input("blend ratio", format!("{ratio} is not in [0, 1]"))),
            other => Err(RagError::bad_input("chunk reuse", format!("{other:?}: expected prefix or blend"))),
        }
    }
}

/// What a blended prompt reused and recomputed.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct BlendStats {
    pub ratio: f32,
    pub chunks_reused: usize,
    pub chunks_computed: usize,
    /// Tokens of moved chunks, of them recomputed, and run through the probe layers.
    pub moved_tokens: usize,
    pub recomputed_tokens: usize,
    pub probed_tokens: usize,
    /// Assembly (store lookups, chunk prefills where this call ran them, moves), in
    /// milliseconds. The recomputation runs in the engine's step as the sequence's first work,
    /// so its time is part of the time to first token.
    pub assemble_ms: f64,
}

impl Default for RagConfig {
    fn default() -> Self {
        RagConfig {
            top_k: 3,
            system_prompt: DEFAULT_SYSTEM_PROMPT.into(),
            params: SamplingParams { max_tokens: 32, ..SamplingParams::default() },
            chunk_reuse: ChunkReuse::Prefix,
        }
    }
}

/// Per-request choices.
#[derive(Clone, Copy, Debug)]
pub struct QueryOptions {
    /// Consult (and fill) the QA bank.
    pub use_qa: bool,
    /// Start from (and fill) the chunk KV tree.
    pub use_kv: bool,
    /// QA similarity threshold (default [`DEFAULT_THRESHOLD`]).
    pub threshold: f32,
}

impl Default for QueryOptions {
    fn default() -> Self {
        QueryOptions { use_qa: true, use_kv: true, threshold: DEFAULT_THRESHOLD }
    }
}

/// Which cache answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheLevel {
    /// A stored answer (no generation).
    Qa,
    /// Generated, starting from a chunk KV tree prefix holding at least one chunk.
    Kv,
    /// Generated from a cold prefill.
    None,
}

/// Milliseconds and token counts of one query.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct AnswerTimings {
    pub embed_ms: f64,
    pub retrieve_ms: f64,
    /// From the call to the answer's first token (the whole answer for a QA hit).
    pub ttft_ms: f64,
    pub total_ms: f64,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub decode_tokens: usize,
}

/// An answer.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Answer {
    pub text: String,
    pub tokens: Vec<u32>,
    /// Source documents, in prompt order, without repeats.
    pub sources: Vec<String>,
    pub chunks: Vec<ChunkId>,
    pub cache_level: CacheLevel,
    /// For a QA hit: the similarity and the stored query.
    pub similarity: Option<f32>,
    pub matched_query: Option<String>,
    /// Segments of the prompt served from the KV tree (system prompt included).
    pub kv_segments: usize,
    pub timings: AnswerTimings,
    /// For a blended prompt ([`ChunkReuse::Blend`]): what was reused and recomputed.
    pub blend: Option<BlendStats>,
}

impl Answer {
    /// The stored answer of a QA-bank hit, served at once (`timings` filled up to the lookup).
    pub fn from_qa_hit(hit: crate::qa::QaHit, timings: AnswerTimings) -> Answer {
        let e = hit.entry;
        Answer {
            text: e.answer,
            tokens: e.answer_tokens,
            sources: e.docs,
            chunks: e.sources,
            cache_level: CacheLevel::Qa,
            similarity: Some(hit.similarity),
            matched_query: Some(e.query),
            kv_segments: 0,
            timings,
            blend: None,
        }
    }
}

/// A prompt cut into segments: keys, token lists and where each ends.
pub struct Prompt {
    pub path: Vec<SegKey>,
    pub tokens: Vec<u32>,
    /// `ends[d]`: where segment `d` (system, then chunks) ends; the question follows.
    pub ends: Vec<usize>,
    pub chunks: Vec<ChunkId>,
}

/// The pipeline. See the module doc.
pub struct Rag {
    model: Arc<Model>,
    pool: KvPool,
    pub bank: KnowledgeBank,
    pub qa: QaBank,
    pub tree: KvTree,
    /// Chunks' KV for position-independent reuse (same cap as the tree's; RAM only).
    pub chunks: ChunkStore,
    pub config: RagConfig,
}

impl Rag {
    /// A pipeline over `model`, its KV in `pool`.
    pub fn new(model: Arc<Model>, pool: KvPool, bank: KnowledgeBank, qa: QaBank, tree: KvTree, config: RagConfig) -> Rag {
        let chunks = ChunkStore::new(model.fingerprint, pool.format(), pool.bytes_per_token(), tree.stats().cap_bytes);
        Rag { model, pool, bank, qa, tree, chunks, config }
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The KV pool.
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// The stores borrowed together (what [`crate::PerCache`]'s units run over).
    pub fn stores(&mut self) -> crate::stores::Stores<'_> {
        crate::stores::Stores {
            model: &self.model,
            pool: &self.pool,
            bank: &self.bank,
            qa: &mut self.qa,
            tree: &mut self.tree,
            config: &self.config,
        }
    }

    /// Ingests a file, then refreshes the caches.
    pub fn ingest_file(&mut self, path: &std::path::Path) -> Result<IngestReport> {
        let r = self.bank.ingest_file(path)?;
        self.after_change(&r.chunks_added, &r.chunks_removed)?;
        Ok(r)
    }

    /// Ingests `text` under `id`, then refreshes the caches.
    pub fn ingest_text(&mut self, id: &str, kind: DocKind, text: &str) -> Result<IngestReport> {
        let r = self.bank.ingest_text(id, kind, text)?;
        self.after_change(&r.chunks_added, &r.chunks_removed)?;
        Ok(r)
    }

    /// Removes document `id`, then refreshes the caches.
    pub fn remove(&mut self, id: &str) -> Result<Vec<ChunkId>> {
        let removed = self.bank.remove(id)?;
        self.after_change(&[], &removed)?;
        Ok(removed)
    }

    /// The idle-time half of refresh: answers up to `max` invalidated queries again (retrieval
    /// and generation over the bank as it is now, through the KV tree) and stores the answers.
    /// Returns the queries answered. A caller runs it while no user request waits.
    pub fn regenerate_stale(&mut self, max: usize) -> Result<Vec<String>> {
        let mut done = Vec::new();
        while done.len() < max {
            let Some(q) = self.qa.pop_stale() else { break };
            // NOTE: QA lookup off (the stale answer is gone, and a paraphrase's answer must
            // not stand in for it), QA insert on.
            self.generate_and_store(&q)?;
            done.push(q);
        }
        self.qa.save()?;
        Ok(done)
    }

    fn generate_and_store(&mut self, q: &str) -> Result<()> {
        let lookup = QaLookup { use_qa: false, threshold: DEFAULT_THRESHOLD, field: "threshold" };
        let (Front::Miss { prompt, qv, .. }, _) = front_half(&self.model, &self.config, &self.bank, &mut self.qa, q, &lookup)? else {
            unreachable!("the front half hits only when it looks up the QA bank");
        };
        let (start, reused) = self.tree_start(&prompt);
        let g =
            self.generate(Request { prompt: prompt.tokens.clone(), start, reused, params: self.config.params.clone(), repair: None })?;
        self.tree.insert(&prompt.path, &prompt.ends, &g.tokens, &g.kv);
        let docs = self.documents_of(&prompt.chunks);
        self.qa.insert(q, qv, &g.text, g.generated, prompt.chunks, docs, self.bank.generation());
        Ok(())
    }

    /// Runs `req` through the engine's step on this thread (the pipeline's one way to run the
    /// model: see `run.rs`).
    fn generate(&self, req: Request) -> Result<Ran> {
        Ok(run::alone(&self.model, &self.pool, req, engram_engine::DEFAULT_PREFILL_CHUNK, &mut || false)?.expect("never stopped"))
    }

    /// The tree's longest stored prefix of `prompt`: its KV and length (checked, not assumed:
    /// its tokens are the prompt's first tokens), and the segments it holds.
    fn tree_start(&mut self, prompt: &Prompt) -> (Option<engram_kv::SeqKv>, usize) {
        let (fp, fmt) = (self.model.fingerprint, self.pool.format());
        let m = self.tree.lookup(fp, fmt, &prompt.path);
        match m.kv {
            Some(kv) if prompt.tokens.starts_with(&m.tokens) => (Some(kv), m.tokens.len()),
            _ => (None, 0),
        }
    }

    fn documents_of(&self, chunks: &[ChunkId]) -> Vec<String> {
        documents_of(&self.bank, chunks)
    }

    fn after_change(&mut self, added: &[ChunkId], removed: &[ChunkId]) -> Result<()> {
        refresh_qa(&self.bank, &mut self.qa, added, self.config.top_k)?;
        let gone: Vec<SegKey> = removed.iter().map(|c| c.0.clone()).collect();
        self.tree.forget_chunks(&gone);
        self.chunks.forget_chunks(&gone);
        Ok(())
    }

    /// The prompt for `question` over `chunks` (in order): see [`build_prompt`].
    pub fn build_prompt(&self, question: &str, chunks: &[ChunkId]) -> Result<Prompt> {
        build_prompt(&self.model, &self.config, &self.bank, question, chunks)
    }
    /// Answers `question`. See the module doc.
    pub fn query(&mut self, question: &str, opts: &QueryOptions) -> Result<Answer> {
        let lookup = QaLookup { use_qa: opts.use_qa, threshold: opts.threshold, field: "threshold" };
        let (front, t0) = front_half(&self.model, &self.config, &self.bank, &mut self.qa, question, &lookup)?;
        let (prompt, qv, mut timings) = match front {
            Front::Hit { answer, .. } => return Ok(answer),
            Front::Miss { prompt, qv, timings } => (prompt, qv, timings),
        };
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        if let (true, ChunkReuse::Blend { ratio }) = (opts.use_kv, self.config.chunk_reuse) {
            return self.answer_blended(question, qv, prompt, ratio, opts, t0, timings);
        }
        let (fp, fmt) = (self.model.fingerprint, self.pool.format());
        let m = if opts.use_kv { Some(self.tree.lookup(fp, fmt, &prompt.path)) } else { None };
        let kv_segments = m.as_ref().map_or(0, |m| m.segments);
        let (start, reused) = match m {
            // Checked, not assumed: the entry's tokens are this prompt's first tokens.
            Some(m) if prompt.tokens.starts_with(&m.tokens) => (m.kv, m.tokens.len()),
            _ => (None, 0),
        };
        let before_gen = ms(t0);
        let g =
            self.generate(Request { prompt: prompt.tokens.clone(), start, reused, params: self.config.params.clone(), repair: None })?;
        timings.ttft_ms = before_gen + g.timings.ttft_ms;
        timings.prompt_tokens = g.timings.prompt_tokens;
        timings.cached_tokens = g.timings.cached_tokens;
        timings.decode_tokens = g.generated.len();
        if opts.use_kv {
            self.tree.insert(&prompt.path, &prompt.ends, &g.tokens, &g.kv);
        }
        let g = Generated { text: g.text, tokens: g.generated };
        let sources = self.documents_of(&prompt.chunks);
        if opts.use_qa {
            self.qa.insert(question, qv, &g.text, g.tokens.clone(), prompt.chunks.clone(), sources.clone(), self.bank.generation());
            self.qa.save()?;
        }
        timings.total_ms = ms(t0);
        Ok(Answer {
            text: g.text,
            tokens: g.tokens,
            sources,
            chunks: prompt.chunks,
            cache_level: if kv_segments > 1 { CacheLevel::Kv } else { CacheLevel::None },
            similarity: None,
            matched_query: None,
            kv_segments,
            timings,
            blend: None,
        })
    }

    /// The rest of [`Rag::query`] in blend mode: the prompt's chunk KV from the chunk store
    /// (missing pieces prefilled first), moved into place, then run through the engine's step
    /// on this thread (`run::alone`): the moved chunks partly recomputed (the checkout's
    /// repair), the question prefilled and the answer decoded. The exact KV tree is neither read nor filled (its entries must stay exact).
    #[allow(clippy::too_many_arguments)]
    fn answer_blended(
        &mut self,
        question: &str,
        qv: Vec<f32>,
        prompt: Prompt,
        ratio: f32,
        opts: &QueryOptions,
        t0: Instant,
        mut timings: AnswerTimings,
    ) -> Result<Answer> {
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let a = self.chunks.assemble(&self.model, &self.pool, &prompt)?;
        let plan = engram_engine::BlendReport::planned(&a.moved, ratio, self.model.config.num_layers);
        let stats = BlendStats {
            ratio,
            chunks_reused: a.chunks_reused,
            chunks_computed: a.chunks_computed,
            moved_tokens: plan.moved_tokens,
            recomputed_tokens: plan.recomputed_tokens,
            probed_tokens: plan.probed_tokens,
            assemble_ms: ms(t1),
        };
        let tokens_computed = a.tokens_computed.min(a.tokens.len());
        let before_gen = ms(t0);
        // The assembled KV holds `a.tokens`, the prompt's first tokens (the chunks, moved); the
        // engine's step recomputes the moved ones first (the question's prefill follows).
        let reused = if prompt.tokens.starts_with(&a.tokens) { a.tokens.len() } else { 0 };
        let repair = Some(engram_policy::Repair { moved: a.moved, ratio });
        let req = Request { prompt: prompt.tokens.clone(), start: Some(a.kv), reused, params: self.config.params.clone(), repair };
        let g = self.generate(req)?;
        timings.ttft_ms = before_gen + g.timings.ttft_ms;
        timings.prompt_tokens = g.timings.prompt_tokens;
        // Tokens whose KV came from the store (those this call prefilled into it are not).
        timings.cached_tokens = g.timings.cached_tokens.saturating_sub(tokens_computed);
        timings.decode_tokens = g.generated.len();
        let g = Generated { text: g.text, tokens: g.generated };
        let sources = self.documents_of(&prompt.chunks);
        if opts.use_qa {
            self.qa.insert(question, qv, &g.text, g.tokens.clone(), prompt.chunks.clone(), sources.clone(), self.bank.generation());
            self.qa.save()?;
        }
        timings.total_ms = ms(t0);
        let kv_segments = if a.chunks_reused > 0 { 1 + a.chunks_reused } else { 0 };
        Ok(Answer {
            text: g.text,
            tokens: g.tokens,
            sources,
            chunks: prompt.chunks,
            cache_level: if a.chunks_reused > 0 { CacheLevel::Kv } else { CacheLevel::None },
            similarity: None,
            matched_query: None,
            kv_segments,
            timings,
            blend: Some(stats),
        })
    }
}

/// A generated answer: its text and tokens.
struct Generated {
    text: String,
    tokens: Vec<u32>,
}

/// The documents `chunks` come from, each once, in the chunks' order (chunks no longer in
/// the bank are skipped).
pub(crate) fn documents_of(bank: &KnowledgeBank, chunks: &[ChunkId]) -> Vec<String> {
    let mut docs: Vec<String> = Vec::new();
    for c in chunks {
        if let Some(e) = bank.chunk(c) {
            if !docs.contains(&e.doc) {
                docs.push(e.doc.clone());
            }
        }
    }
    docs
}

/// Refresh after a bank change: answers whose query's top-`k` gains an added chunk or loses a
/// source are invalidated; the QA bank is saved.
pub(crate) fn refresh_qa(bank: &KnowledgeBank, qa: &mut QaBank, added: &[ChunkId], k: usize) -> Result<()> {
    qa.refresh(bank, added, k)?;
    qa.save()
}

/// Tokens of `text` (with the model's special tokens if `special`).
fn tokens(model: &Model, text: &str, special: bool) -> Result<Vec<u32>> {
    Ok(model.tokenizer.encode(text, special).map_err(|e| RagError::bad_input("text", e.to_string()))?.ids)
}

/// The prompt for `question` over `chunks` (in order): system + chunks + question, each
/// segment tokenized alone; trailing chunks are dropped until it fits the context with room
/// for `config.params.max_tokens`. Invariant: `ends[d]` is a token boundary of `tokens`, and
/// `tokens[..ends[d]]` depends only on the segments `..=d`.
pub fn build_prompt(model: &Model, config: &RagConfig, bank: &KnowledgeBank, question: &str, chunks: &[ChunkId]) -> Result<Prompt> {
    let sys = tokens(model, &config.system_prompt, true)?;
    let q = tokens(model, &format!("\nQuestion: {question}\nAnswer:"), false)?;
    let ctx = model.config.max_positions;
    let room = config.params.max_tokens;
    if sys.len() + q.len() + room > ctx {
        return Err(RagError::QueryTooLong { needed: sys.len() + q.len() + room, context: ctx });
    }
    let mut h = blake3::Hasher::new();
    for t in &sys {
        h.update(&t.to_le_bytes());
    }
    let mut p = Prompt { path: vec![format!("sys:{}", &h.finalize().to_hex()[..16])], tokens: sys, ends: Vec::new(), chunks: Vec::new() };
    p.ends.push(p.tokens.len());
    for c in chunks {
        let Some(entry) = bank.chunk(c) else { continue };
        let t = tokens(model, &format!("\n{}", entry.text), false)?;
        if p.tokens.len() + t.len() + q.len() + room > ctx {
            break;
        }
        p.tokens.extend(t);
        p.ends.push(p.tokens.len());
        p.path.push(c.0.clone());
        p.chunks.push(c.clone());
    }
    p.tokens.extend(q);
    Ok(p)
}
