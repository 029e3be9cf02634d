//! [`Library`]: one user's knowledge bank and QA bank with the pipeline's front half, for a
//! caller that generates elsewhere (the server submits the prompt to the engine's scheduler,
//! whose [`crate::TreePolicy`] holds the chunk KV tree).
//!
//! ```text
//!  plan(q) ─ embed ─ QA hit? ─yes─► Plan::Hit(answer)                         cache_level qa
//!                       └ no ─ retrieve ─ build_prompt ─► Plan::Generate(pending)
//!  (caller generates pending.prompt.tokens, learns cached tokens and text)
//!  record(pending, text, …) ─► Answer (cache_level kv if a chunk's KV was reused, else none);
//!                               QA insert unless the bank changed meanwhile
//! ```
//! Invariant: the same prompt tokens as [`crate::Rag`] builds (one [`build_prompt`]); an answer
//! generated over a bank that changed before it was recorded is returned but not stored, so no
//! QA entry ever predates the refresh that would have dropped it.

use std::sync::Arc;
use std::time::Instant;

use engram_kv::KvPool;
use engram_model::Model;

use crate::bank::{ChunkId, IngestReport, KnowledgeBank};
use crate::error::Result;
use crate::front::{front_half, Front, QaLookup};
use crate::idle::preempt::EngineWork;
use crate::idle::{PerCache, UnitReport};
use crate::kv_tree::KvTree;
use crate::parse::DocKind;
use crate::pipeline::{documents_of, refresh_qa, Answer, AnswerTimings, CacheLevel, Prompt, RagConfig};
use crate::qa::QaBank;
use crate::stores::Stores;

/// What [`Library::plan`] decided.
pub enum Plan {
    /// A stored answer.
    Hit(Answer),
    /// A prompt to generate, then [`Library::record`].
    Generate(Pending),
}

/// A query waiting for its generation.
pub struct Pending {
    pub question: String,
    pub prompt: Prompt,
    pub timings: AnswerTimings,
    qv: Vec<f32>,
    generation: u64,
    use_qa: bool,
    t0: Instant,
}

impl Pending {
    /// Milliseconds since the query arrived.
    pub fn elapsed_ms(&self) -> f64 {
        self.t0.elapsed().as_secs_f64() * 1e3
    }
}

/// The banks of one user. See the module doc.
pub struct Library {
    model: Arc<Model>,
    pub bank: KnowledgeBank,
    pub qa: QaBank,
    pub config: RagConfig,
    /// Idle-time population ([`Library::enable_idle`]); `None`: off.
    pub idle: Option<PerCache>,
}

impl Library {
    /// Banks over `model`'s tokenizer and context.
    pub fn new(model: Arc<Model>, bank: KnowledgeBank, qa: QaBank, config: RagConfig) -> Library {
        Library { model, bank, qa, config, idle: None }
    }

    /// Turns idle-time population on: `idle` learns from every ingest, removal and query from
    /// now on, and [`Library::idle_unit`] runs its units. Its abstracts are synced to the bank
    /// at once (the documents already there are predicted about too).
    pub fn enable_idle(&mut self, mut idle: PerCache) -> Result<()> {
        idle.after_ingest_into(&self.bank, None)?;
        self.idle = Some(idle);
        Ok(())
    }

    /// Ingests `text` under `id`, then refreshes the QA bank (and tells idle population).
    pub fn ingest_text(&mut self, id: &str, kind: DocKind, text: &str) -> Result<IngestReport> {
        let r = self.bank.ingest_text(id, kind, text)?;
        refresh_qa(&self.bank, &mut self.qa, &r.chunks_added, self.config.top_k)?;
        if let Some(idle) = &mut self.idle {
            idle.after_ingest_into(&self.bank, Some(&r))?;
        }
        Ok(r)
    }

    /// Removes document `id`, then refreshes the QA bank (and tells idle population).
    pub fn remove(&mut self, id: &str) -> Result<Vec<ChunkId>> {
        let removed = self.bank.remove(id)?;
        refresh_qa(&self.bank, &mut self.qa, &[], self.config.top_k)?;
        if let Some(idle) = &mut self.idle {
            idle.after_ingest_into(&self.bank, None)?;
        }
        Ok(removed)
    }

    /// Runs one unit of idle work (see [`PerCache::idle_unit_over`]) with the KV charged to
    /// `pool` and the chunk KV tree `tree` (the engine thread's, for this user), stopping at the
    /// next model step once `stop` says a request waits (then it stores nothing and runs again
    /// later); `None` when idle population is off or has nothing left to do.
    pub fn idle_unit(&mut self, pool: &KvPool, tree: &mut KvTree, stop: &mut dyn FnMut() -> bool) -> Result<Option<UnitReport>> {
        let Some(idle) = &mut self.idle else { return Ok(None) };
        let mut stores = Stores { model: &self.model, pool, bank: &self.bank, qa: &mut self.qa, tree, config: &self.config };
        idle.idle_unit_over(&mut stores, stop)
    }

    /// [`Library::idle_unit`] with the unit's model work run as the engine thread's background
    /// job (see [`PerCache::idle_unit_in_engine`]): finished from `work.ready`, or stopped
    /// with its work in `work.wanted`.
    pub fn idle_unit_in_engine(&mut self, pool: &KvPool, tree: &mut KvTree, work: &mut EngineWork) -> Result<Option<UnitReport>> {
        let Some(idle) = &mut self.idle else { return Ok(None) };
        let mut stores = Stores { model: &self.model, pool, bank: &self.bank, qa: &mut self.qa, tree, config: &self.config };
        idle.idle_unit_in_engine(&mut stores, work)
    }

    /// The QA bank's answer, or the prompt to generate with room for `max_tokens`.
    /// Bad input (empty query, threshold outside (0, 1], a question over the context) is an
    /// error and stores nothing.
    pub fn plan(&mut self, question: &str, threshold: f32, max_tokens: usize, use_qa: bool) -> Result<Plan> {
        let mut config = self.config.clone();
        config.params.max_tokens = max_tokens;
        let lookup = QaLookup { use_qa, threshold, field: "qa_threshold" };
        let (front, t0) = front_half(&self.model, &config, &self.bank, &mut self.qa, question, &lookup)?;
        match front {
            Front::Hit { answer, qv } => {
                if let Some(idle) = &mut self.idle {
                    idle.after_query_embedded(question, &qv, &answer);
                }
                Ok(Plan::Hit(answer))
            }
            Front::Miss { prompt, qv, timings } => Ok(Plan::Generate(Pending {
                question: question.to_string(),
                prompt,
                timings,
                qv,
                generation: self.bank.generation(),
                use_qa,
                t0,
            })),
        }
    }

    /// The answer `text` generated for `p` (its first token `ttft_ms` after the query
    /// arrived, `cached_tokens` of the prompt's KV reused, `decode_tokens` generated), stored
    /// in the QA bank when the bank is as it was at [`Library::plan`].
    pub fn record(&mut self, p: Pending, text: String, ttft_ms: f64, cached_tokens: usize, decode_tokens: usize) -> Result<Answer> {
        let sources = documents_of(&self.bank, &p.prompt.chunks);
        // The answer's tokens as the tokenizer spells its text (the engine streams text).
        let tokens = self.model.tokenizer.encode(&text, false).map(|e| e.ids).unwrap_or_default();
        if p.use_qa && self.bank.generation() == p.generation {
            self.qa.insert(&p.question, p.qv.clone(), &text, tokens.clone(), p.prompt.chunks.clone(), sources.clone(), p.generation);
            self.qa.save()?;
        }
        // Segments whose KV was reused: those ending at or before the cached tokens.
        let kv_segments = p.prompt.ends.iter().take_while(|&&e| e <= cached_tokens).count();
        let mut timings = p.timings.clone();
        timings.ttft_ms = ttft_ms;
        timings.total_ms = p.elapsed_ms();
        timings.cached_tokens = cached_tokens;
        timings.decode_tokens = decode_tokens;
        let answer = Answer {
            text,
            tokens,
            sources,
            chunks: p.prompt.chunks,
            cache_level: if kv_segments > 1 { CacheLevel::Kv } else { CacheLevel::None },
            similarity: None,
            matched_query: None,
            kv_segments,
            timings,
            blend: None,
        };
        if let Some(idle) = &mut self.idle {
            idle.after_query_embedded(&p.question, &p.qv, &answer);
        }
        Ok(answer)
    }
}
