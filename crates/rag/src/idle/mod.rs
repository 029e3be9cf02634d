//! Idle-time population (PerCache §4.2–4.3): knowledge abstracts, query
//! prediction, and the layer choice that spends idle compute on the QA bank or the chunk
//! KV tree, one small unit at a time.
//!
//! ```text
//!  after_ingest:  abstracts synced (new documents' topics asked about first)
//!  after_query:   history += query; predictions it matched (QA threshold) or followed (first
//!                 chunk) counted → p_qa, p_kv; a prefilled prediction whose chunks it used → KV→QA
//!  idle_unit:     one of, in this order:
//!                   1. an invalidated answer regenerated (refresh's idle half)
//!                   2. queued work: the answer stage of a split answer, a KV→QA conversion
//!                   3. a QA→KV conversion (a predicted answer nobody asked for)
//!                   4. the next predicted question: plan, decide (answer / prefill / skip), do it
//!                      (an answer whose chunks the tree lacks runs as two units: prefill, answer)
//!                   5. a prediction: with `predictor: By::Llm` and a model that has a chat
//!                      template, the model is asked about the next new chunk, else (a real query
//!                      came since) about the recent queries (`llm_predict.rs`) — one unit; its
//!                      questions are queued for 4; no question parsed from its answer (or a
//!                      failed generation): the templates' `stride` questions instead. Else the
//!                      templates (`predict.rs`).
//!                 None when there is nothing left to do
//!  after a QA hit served from a predicted answer to a question worded differently: the real
//!  question is queued (2) and answered through the pipeline (exact KV path); its answer replaces
//!  the predicted one in the QA bank
//! ```
//! A unit hands its model work to a [`preempt::StepClock`]: run here through the engine's step,
//! the caller's `stop` asked before every step ([`PerCache::idle_unit_over`]), or left for the
//! engine thread as a background job, the unit put back until the result is ready
//! ([`PerCache::idle_unit_in_engine`]). Told to stop, a unit drops its unfinished work whole,
//! stores nothing and is put back (the stale query, the queued work, the conversion victim), so
//! a user request waits for at most one model step of it (`UnitReport::longest_step_ms`). Invariant: population stores only what [`Rag::query`]
//! would store for the same question, so answers afterwards equal the cold path's (exact KV)
//! or are QA answers of a question at the threshold, and a refresh invalidates predicted
//! answers like any other (`tests/it/idle.rs`). The abstracts persist (`abstracts.rs`); the history and hit counts live
//! in RAM (a restart starts them again).

pub mod abstracts;
pub mod budget;
pub mod layer_choice;
pub mod llm_predict;
pub mod populate;
pub mod predict;
pub mod preempt;

use std::collections::{BTreeSet, VecDeque};
use std::path::Path;
use std::time::Instant;

use crate::bank::{ChunkId, IngestReport, KnowledgeBank};
use crate::error::Result;
use crate::pipeline::{Answer, CacheLevel, Rag};
use crate::stores::Stores;
use abstracts::AbstractStore;
use layer_choice::{decide, kv_to_qa, qa_to_kv, Candidate, Estimates, HitStats, LayerChoiceConfig, Rate, Strategy};
use llm_predict::Basis;
use predict::{By, PredictConfig, Predicted, Predictor, Source};
use preempt::{EngineWork, StepClock, Via};

/// Consecutive predictions the model answers without a usable question before the LLM
/// predictor gives up for good (a model that is not instruction-tuned, e.g. pycode-7m) —
/// unless it wrote a usable question before.
pub const LLM_GIVE_UP_AFTER: u32 = 3;

/// [`IdleConfig::prefill_chunk`]'s default.
pub const DEFAULT_IDLE_PREFILL_CHUNK: usize = 32;

/// How idle time is spent.
#[derive(Clone, Copy, Debug)]
pub struct IdleConfig {
    pub predict: PredictConfig,
    pub layer_choice: LayerChoiceConfig,
    /// Predicted answers go into the QA bank (off: prefill only).
    pub use_qa: bool,
    /// The chunk KV tree is filled and used (off: answers prefill cold, no prefill-only units).
    pub use_kv: bool,
    /// Decide by expected benefit and convert between layers (off: answer every prediction —
    /// plain sleep-time compute).
    pub schedule: bool,
    /// Regenerate answers a refresh invalidated.
    pub regenerate: bool,
    /// The QA threshold real queries use (for matching predictions and the τ cutoff).
    pub threshold: f32,
    /// Prompt tokens per forward call in idle units: the step a waiting request may wait for
    /// (an interrupt is checked between steps). NOTE: smaller than the engine's 256 so a step
    /// is a few ms on a small model; chunking changes no result beyond float tolerance
    /// (`crates/model/tests/it/chunking.rs`), as the tree's own reuse already re-chunks prompts.
    pub prefill_chunk: usize,
    /// Who writes the predicted questions: the model (`By::Llm`; the templates stay the
    /// fallback, and are used alone for a model with no chat template) or the templates.
    pub predictor: By,
    /// A QA hit served from a predicted answer queues the real answer to the user's question,
    /// which replaces the predicted one.
    pub real_answers: bool,
}

impl Default for IdleConfig {
    fn default() -> Self {
        IdleConfig {
            predict: PredictConfig::default(),
            layer_choice: LayerChoiceConfig::default(),
            use_qa: true,
            use_kv: true,
            schedule: true,
            regenerate: true,
            threshold: crate::qa::DEFAULT_THRESHOLD,
            prefill_chunk: DEFAULT_IDLE_PREFILL_CHUNK,
            predictor: By::Template,
            real_answers: true,
        }
    }
}

/// What a unit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnitKind {
    Regenerate,
    Answer,
    Prefill,
    Skip,
    KvToQa,
    QaToKv,
    /// The model asked for questions (LLM prediction).
    Predict,
    /// The real answer to a question a predicted answer served.
    RealAnswer,
}

/// One unit's report. An interrupted unit (`interrupted`) stored nothing and will run again;
/// its `kind` is what it was doing, its token counts are 0.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UnitReport {
    pub kind: UnitKind,
    pub query: String,
    pub ms: f64,
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    /// Stopped at a step boundary because a request was waiting.
    pub interrupted: bool,
    /// The longest stretch between two asks of `stop` (what a request could wait for it).
    pub longest_step_ms: f64,
}

/// Counts over a [`PerCache`]'s life.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct IdleStats {
    /// Units finished (interrupted ones are counted apart).
    pub units: u64,
    /// Units stopped because a request was waiting (put back, nothing stored).
    pub interrupted: u64,
    /// The longest stretch between two asks of `stop` in any unit.
    pub longest_step_ms: f64,
    /// Milliseconds of units plus the bookkeeping after each real query.
    pub idle_ms: f64,
    pub longest_unit_ms: f64,
    pub predicted: u64,
    pub answered: u64,
    pub prefilled: u64,
    pub skipped: u64,
    pub regenerated: u64,
    pub kv_to_qa: u64,
    pub qa_to_kv: u64,
    pub real_queries: u64,
    /// Real queries whose cosine to some earlier prediction reached the QA threshold.
    pub matched_by_prediction: u64,
    /// QA hits served from a predicted question's answer.
    pub served_by_prediction: u64,
    /// Predictions the model was asked for (finished), questions it wrote that were kept, and
    /// predictions that fell back to the templates (no usable question, or a failed generation).
    pub llm_predictions: u64,
    pub llm_questions: u64,
    pub template_fallbacks: u64,
    /// Real answers that replaced a predicted answer after a hit.
    pub real_answers: u64,
    pub hits: HitStats,
}

/// A prediction and what became of it.
#[derive(Clone, Debug)]
pub struct PredictionRecord {
    pub query: String,
    pub source: Source,
    /// Which predictor wrote it.
    pub by: By,
    /// Empty until planned.
    pub vector: Vec<f32>,
    pub first_chunk: Option<ChunkId>,
    pub strategy: Option<Strategy>,
    pub qa_id: Option<u64>,
    /// Real queries seen when its answer was stored.
    pub answered_at: u64,
    /// Real queries seen when it was planned (`None` before).
    pub planned_at: Option<u64>,
    qa_judged: bool,
    kv_judged: bool,
    kv_queued: bool,
}

#[derive(Clone, Debug)]
enum Work {
    Populate(usize),
    AnswerStage(usize),
    KvToQa(usize),
    /// The user's question, and the predicted answer's QA entry it replaces.
    RealAnswer {
        query: String,
        replaces: Option<u64>,
    },
}

/// The idle-time half of PerCache over a [`Rag`]. See the module doc.
pub struct PerCache {
    cfg: IdleConfig,
    abstracts: AbstractStore,
    predictor: Predictor,
    preds: Vec<PredictionRecord>,
    queue: VecDeque<Work>,
    prefill_rate: Rate,
    decode_rate: Rate,
    stats: IdleStats,
    /// New chunks the model has not been asked about yet (LLM prediction), newest first.
    llm_chunks: VecDeque<crate::bank::ChunkId>,
    /// Chunks the model was asked about.
    llm_asked: BTreeSet<crate::bank::ChunkId>,
    /// Real queries since the last history-based LLM prediction.
    history_new: usize,
    /// Consecutive LLM predictions with no usable question; past [`LLM_GIVE_UP_AFTER`] (and none
    /// ever usable) the LLM predictor is off.
    llm_failures: u32,
    llm_off: bool,
}

impl PerCache {
    /// Idle population whose abstracts are kept at `path` (see [`AbstractStore::open`]).
    pub fn open(path: &Path, cfg: IdleConfig) -> Result<PerCache> {
        Ok(PerCache::with_store(AbstractStore::open(path)?, cfg))
    }

    /// Idle population with abstracts in RAM only.
    pub fn in_memory(cfg: IdleConfig) -> PerCache {
        PerCache::with_store(AbstractStore::in_memory(), cfg)
    }

    fn with_store(abstracts: AbstractStore, cfg: IdleConfig) -> PerCache {
        PerCache {
            predictor: Predictor::new(cfg.predict),
            cfg,
            abstracts,
            preds: Vec::new(),
            queue: VecDeque::new(),
            // Until measured: 1 ms per prefilled token, 10 per decoded one (their ratio is
            // what matters for the first decisions).
            prefill_rate: Rate::new(1.0),
            decode_rate: Rate::new(10.0),
            stats: IdleStats::default(),
            llm_chunks: VecDeque::new(),
            llm_asked: BTreeSet::new(),
            history_new: 0,
            llm_failures: 0,
            llm_off: false,
        }
    }

    /// The abstracts.
    pub fn abstracts(&self) -> &AbstractStore {
        &self.abstracts
    }

    /// Counts so far.
    pub fn stats(&self) -> &IdleStats {
        &self.stats
    }

    /// Every prediction made so far, in order.
    pub fn predictions(&self) -> &[PredictionRecord] {
        &self.preds
    }

    /// The layer choice's inputs now.
    pub fn estimates(&self) -> Estimates {
        Estimates {
            p_qa: self.stats.hits.p_qa(),
            p_kv: self.stats.hits.p_kv(),
            prefill_ms_per_token: self.prefill_rate.value,
            decode_ms_per_token: self.decode_rate.value,
        }
    }

    /// Brings the abstracts in step with the bank after an ingest or removal; the topics of
    /// `report`'s documents are asked about first.
    pub fn after_ingest(&mut self, rag: &Rag, report: Option<&IngestReport>) -> Result<()> {
        self.after_ingest_into(&rag.bank, report)
    }

    /// [`PerCache::after_ingest`] over a bank alone (the server's [`crate::Library`]).
    pub fn after_ingest_into(&mut self, bank: &KnowledgeBank, report: Option<&IngestReport>) -> Result<()> {
        self.abstracts.sync(bank)?;
        if let Some(r) = report {
            let fresh = self.abstracts.topics_of_docs(&r.docs);
            self.predictor.note_fresh(&fresh);
        }
        if self.cfg.predictor == By::Llm {
            self.note_chunks(bank, report);
        }
        Ok(())
    }

    /// Queues the chunks the model has not been asked about: `report`'s new chunks first (in
    /// order), or, without a report, every chunk of the bank (documents already there).
    fn note_chunks(&mut self, bank: &KnowledgeBank, report: Option<&IngestReport>) {
        let chunks: Vec<crate::bank::ChunkId> = match report {
            Some(r) => r.chunks_added.clone(),
            None => bank.docs().values().flat_map(|d| d.chunks.iter().cloned()).collect(),
        };
        let new: Vec<_> = chunks.into_iter().filter(|c| !self.llm_asked.contains(c) && !self.llm_chunks.contains(c)).collect();
        if report.is_some() {
            for c in new.into_iter().rev() {
                self.llm_chunks.push_front(c);
            }
        } else {
            self.llm_chunks.extend(new);
        }
    }

    /// Records a real query and its answer (see the module doc). Its cost is counted as idle.
    pub fn after_query(&mut self, rag: &Rag, question: &str, answer: &Answer) -> Result<()> {
        let t = Instant::now();
        let qv = rag.bank.embed(question)?;
        // The embedding counts as idle too (the bookkeeping after the call adds its own time).
        self.stats.idle_ms += t.elapsed().as_secs_f64() * 1e3;
        self.after_query_embedded(question, &qv, answer);
        Ok(())
    }

    /// [`PerCache::after_query`] for a query already embedded as `qv` (the server's
    /// [`crate::Library`] has the vector from its plan); its cost is counted as idle.
    pub fn after_query_embedded(&mut self, question: &str, qv: &[f32], answer: &Answer) {
        let t = Instant::now();
        self.stats.real_queries += 1;
        let mut matched = false;
        for p in self.preds.iter_mut().filter(|p| !p.vector.is_empty()) {
            if engram_embed::cosine(qv, &p.vector) >= self.cfg.threshold {
                matched = true;
                if !p.qa_judged {
                    p.qa_judged = true;
                    self.stats.hits.qa_matched += 1;
                }
            }
        }
        self.stats.matched_by_prediction += matched as u64;
        let served = match (&answer.cache_level, &answer.matched_query) {
            (CacheLevel::Qa, Some(m)) => self.preds.iter().find(|p| &p.query == m),
            _ => None,
        };
        if let Some(p) = served {
            self.stats.served_by_prediction += 1;
            // The predicted answer stands in for the user's own question; its real answer is
            // generated in idle time and takes the predicted one's place.
            let (replaces, differs) = (p.qa_id, !p.query.trim().eq_ignore_ascii_case(question.trim()));
            let queued = self.queue.iter().any(|w| matches!(w, Work::RealAnswer { query, .. } if query == question));
            if self.cfg.real_answers && self.cfg.use_qa && differs && !queued {
                // First in line: a user asked it (a split answer's second stage re-plans after).
                self.queue.push_front(Work::RealAnswer { query: question.to_string(), replaces });
            }
        }
        if let Some(first) = answer.chunks.first() {
            for (i, p) in self.preds.iter_mut().enumerate() {
                if p.first_chunk.as_ref() != Some(first) {
                    continue;
                }
                if !p.kv_judged {
                    p.kv_judged = true;
                    self.stats.hits.kv_matched += 1;
                }
                let prefilled_only = p.strategy == Some(Strategy::Prefill) && p.qa_id.is_none();
                if self.cfg.schedule
                    && self.cfg.use_qa
                    && prefilled_only
                    && !p.kv_queued
                    && kv_to_qa(&self.cfg.layer_choice, 1, self.cfg.threshold)
                {
                    p.kv_queued = true;
                    self.queue.push_back(Work::KvToQa(i));
                }
            }
        }
        // Predictions that went `patience` real queries without a match are judged missed.
        let (now, patience) = (self.stats.real_queries, self.cfg.layer_choice.patience);
        for p in &mut self.preds {
            if p.planned_at.is_some_and(|t| now - t >= patience.max(1)) {
                if !p.qa_judged {
                    p.qa_judged = true;
                    self.stats.hits.qa_missed += 1;
                }
                if !p.kv_judged {
                    p.kv_judged = true;
                    self.stats.hits.kv_missed += 1;
                }
            }
        }
        self.predictor.observe(question);
        self.history_new += 1;
        self.stats.idle_ms += t.elapsed().as_secs_f64() * 1e3;
    }

    /// Runs one unit of idle work (see the module doc) to its end; `None` when there is none
    /// left.
    pub fn idle_unit(&mut self, rag: &mut Rag) -> Result<Option<UnitReport>> {
        self.idle_unit_over(&mut rag.stores(), &mut || false)
    }

    /// [`PerCache::idle_unit`] over borrowed stores (the server: the tenant's banks and the
    /// engine thread's tree, KV charged to the engine's pool), asking `stop` before every model
    /// step: when it says yes the unit stops there, stores nothing, is put back, and its report
    /// says `interrupted`.
    pub fn idle_unit_over(&mut self, rag: &mut Stores<'_>, stop: &mut dyn FnMut() -> bool) -> Result<Option<UnitReport>> {
        let chunk = self.cfg.prefill_chunk;
        self.unit_via(rag, StepClock::new(stop, chunk), true)
    }

    /// One unit whose model work runs as the engine thread's background job (see
    /// [`preempt`]): the unit takes its work's result from `work.ready` and finishes (its
    /// report), or leaves the work in `work.wanted` and is put back, storing nothing (its
    /// report says `interrupted`; it is not counted as one), to run again once the engine has
    /// computed it. `None` when there is nothing left to do.
    pub fn idle_unit_in_engine(&mut self, rag: &mut Stores<'_>, work: &mut EngineWork) -> Result<Option<UnitReport>> {
        work.wanted = None;
        let mut never = || false;
        self.unit_via(rag, StepClock::via(&mut never, Via::Engine(work)), false)
    }

    /// Runs the next unit with `clock`; a stopped one counts as interrupted if `count_stops`.
    fn unit_via(&mut self, rag: &mut Stores<'_>, mut clock: StepClock<'_>, count_stops: bool) -> Result<Option<UnitReport>> {
        // The unit's time starts with its clock, so every step lies within it.
        let t = clock.started();
        let r = self.next_unit(rag, &mut clock)?;
        let step = clock.finish();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(r.map(|mut r| {
            r.ms = ms;
            r.longest_step_ms = step;
            if !r.interrupted {
                self.stats.units += 1;
                self.stats.longest_unit_ms = self.stats.longest_unit_ms.max(ms);
            } else if count_stops {
                self.stats.interrupted += 1;
            }
            self.stats.idle_ms += ms;
            self.stats.longest_step_ms = self.stats.longest_step_ms.max(step);
            r
        }))
    }

    fn next_unit(&mut self, rag: &mut Stores<'_>, clock: &mut StepClock<'_>) -> Result<Option<UnitReport>> {
        if self.cfg.regenerate && self.cfg.use_qa {
            if let Some(q) = rag.qa.pop_stale() {
                let plan = populate::plan(rag, &q)?;
                let Some(w) = self.answer(rag, plan, clock)? else {
                    // Still stale: regenerated by a later unit.
                    rag.qa.push_stale_front(q.clone());
                    return Ok(Some(stopped(UnitKind::Regenerate, q)));
                };
                self.stats.regenerated += 1;
                return Ok(Some(report(UnitKind::Regenerate, q, &w)));
            }
        }
        loop {
            if let Some(w) = self.queue.pop_front() {
                return self.run(rag, w, clock).map(Some);
            }
            if let Some(r) = self.convert_to_kv(rag, clock)? {
                return Ok(Some(r));
            }
            if self.llm_active(rag) {
                return self.llm_unit(rag, clock);
            }
            let fresh: Vec<Predicted> = self.predictor.predict(&self.abstracts);
            if fresh.is_empty() {
                return Ok(None);
            }
            self.push_predictions(fresh);
        }
    }

    /// Whether predictions are asked of the model (see the module doc).
    fn llm_active(&self, rag: &Stores<'_>) -> bool {
        self.cfg.predictor == By::Llm && !self.llm_off && rag.model.tokenizer.chat_template().is_some()
    }

    /// Records `fresh` predictions and queues their population.
    fn push_predictions(&mut self, fresh: Vec<Predicted>) {
        for p in fresh {
            self.stats.predicted += 1;
            self.queue.push_back(Work::Populate(self.preds.len()));
            self.preds.push(PredictionRecord {
                query: p.query,
                source: p.source,
                by: p.by,
                vector: Vec::new(),
                first_chunk: None,
                strategy: None,
                qa_id: None,
                answered_at: 0,
                planned_at: None,
                qa_judged: false,
                kv_judged: false,
                kv_queued: false,
            });
        }
    }

    /// One LLM prediction (see the module doc); `None` when no chunk is left to ask about and
    /// no real query came since the last history-based one. Stopped, the chunk is put back
    /// (the history stays due) and nothing is recorded.
    fn llm_unit(&mut self, rag: &mut Stores<'_>, clock: &mut StepClock<'_>) -> Result<Option<UnitReport>> {
        let stride = self.predictor.config().stride;
        let (chunk, basis, source) = loop {
            if let Some(c) = self.llm_chunks.pop_front() {
                // A chunk removed since it was queued is skipped.
                let Some(e) = rag.bank.chunk(&c) else { continue };
                let kind = rag.bank.docs().get(&e.doc).map_or(crate::parse::DocKind::Text, |d| d.kind);
                let topic = self.abstracts.topics_of_docs(std::slice::from_ref(&e.doc)).into_iter().next();
                break (Some(c), Basis::Chunk { kind, text: e.text.clone(), topic }, Source::Knowledge);
            }
            let recent = self.predictor.recent();
            if self.history_new == 0 || recent.is_empty() {
                return Ok(None);
            }
            break (None, Basis::History(recent), Source::History);
        };
        let label = match &chunk {
            Some(c) => format!("llm: chunk {}", c.0),
            None => "llm: query history".to_string(),
        };
        let prompt = llm_predict::chat_tokens(rag.model, &llm_predict::prompt_text(&basis, stride))?.expect("checked by llm_active");
        let g = match llm_predict::generate(rag.model, rag.pool, &prompt, stride, clock) {
            Ok(Some(g)) => Some(g),
            Ok(None) => {
                if let Some(c) = chunk {
                    self.llm_chunks.push_front(c);
                }
                return Ok(Some(stopped(UnitKind::Predict, label)));
            }
            Err(e) => {
                eprintln!("warning: LLM query prediction failed, the templates predict instead: {e}");
                None
            }
        };
        match chunk {
            Some(c) => {
                self.llm_asked.insert(c);
            }
            None => self.history_new = 0,
        }
        self.stats.llm_predictions += 1;
        let parsed = g.as_ref().map(|g| llm_predict::parse_questions(&g.text, 2 * stride)).unwrap_or_default();
        let mut fresh = Vec::new();
        for q in &parsed {
            if fresh.len() < stride && self.predictor.claim(q) {
                fresh.push(Predicted { query: q.clone(), source, by: By::Llm });
            }
        }
        if parsed.is_empty() {
            self.llm_failures += 1;
            if self.llm_failures >= LLM_GIVE_UP_AFTER && self.stats.llm_questions == 0 {
                eprintln!(
                    "warning: the model wrote no usable question in {LLM_GIVE_UP_AFTER} predictions (not instruction-tuned?): \
                     the templates predict from now on"
                );
                self.llm_off = true;
            }
        } else {
            self.llm_failures = 0;
        }
        if fresh.is_empty() {
            self.stats.template_fallbacks += 1;
            fresh = self.predictor.predict(&self.abstracts);
        }
        self.stats.llm_questions += fresh.iter().filter(|p| p.by == By::Llm).count() as u64;
        let mut w = populate::Work::default();
        if let Some(g) = &g {
            let t = &g.timings;
            self.prefill_rate.add(t.prefill_ms, t.prompt_tokens - t.cached_tokens);
            self.decode_rate.add(t.decode_ms, t.decode_tokens);
            w = populate::Work { prefill_tokens: t.prompt_tokens - t.cached_tokens, decode_tokens: t.decode_tokens, ..w };
        }
        self.push_predictions(fresh);
        Ok(Some(report(UnitKind::Predict, label, &w)))
    }

    /// An answer (`None`: stopped, nothing stored); the rates learn only from finished ones.
    fn answer(&mut self, rag: &mut Stores<'_>, plan: populate::Plan, clock: &mut StepClock<'_>) -> Result<Option<populate::Work>> {
        let Some(w) = populate::answer(rag, plan, self.cfg.use_kv, clock)? else { return Ok(None) };
        self.prefill_rate.add(w.prefill_ms, w.prefill_tokens);
        self.decode_rate.add(w.decode_ms, w.decode_tokens);
        Ok(Some(w))
    }

    /// A prefill (`None`: stopped, nothing stored).
    fn prefill(&mut self, rag: &mut Stores<'_>, plan: &populate::Plan, clock: &mut StepClock<'_>) -> Result<Option<populate::Work>> {
        let Some(w) = populate::prefill(rag, plan, clock)? else { return Ok(None) };
        self.prefill_rate.add(w.prefill_ms, w.prefill_tokens);
        Ok(Some(w))
    }

    /// Runs `work`; stopped, it goes back to the front of the queue (nothing stored).
    fn run(&mut self, rag: &mut Stores<'_>, work: Work, clock: &mut StepClock<'_>) -> Result<UnitReport> {
        let r = self.run_inner(rag, work.clone(), clock)?;
        if r.interrupted {
            self.queue.push_front(work);
        }
        Ok(r)
    }

    fn run_inner(&mut self, rag: &mut Stores<'_>, work: Work, clock: &mut StepClock<'_>) -> Result<UnitReport> {
        let threshold = self.cfg.threshold;
        match work {
            Work::Populate(i) => {
                let q = self.preds[i].query.clone();
                let plan = populate::plan(rag, &q)?;
                let p = &mut self.preds[i];
                // A unit put back after an interruption is planned again, counted once.
                if p.planned_at.is_none() {
                    self.stats.hits.issued += 1;
                    p.planned_at = Some(self.stats.real_queries);
                }
                p.vector = plan.vector.clone();
                p.first_chunk = plan.prompt.chunks.first().cloned();
                // Already answered at the threshold (a real query or an earlier prediction).
                if self.cfg.use_qa && rag.qa.best(&plan.vector).is_some_and(|(_, s)| s >= threshold) {
                    p.strategy = Some(Strategy::Skip);
                    self.stats.skipped += 1;
                    return Ok(report(UnitKind::Skip, q, &populate::Work::default()));
                }
                let end = plan.chunks_end();
                let cached = if self.cfg.use_kv { plan.cached_tokens } else { 0 };
                let cand = Candidate {
                    rest_tokens: plan.prompt.tokens.len() - cached,
                    rest_chunk_tokens: end.saturating_sub(cached),
                    decode_tokens: rag.config.params.max_tokens,
                };
                let mut s = if self.cfg.schedule {
                    decide(&self.cfg.layer_choice, &self.estimates(), &cand, threshold).strategy
                } else {
                    Strategy::Answer
                };
                if s == Strategy::Answer && !self.cfg.use_qa {
                    s = Strategy::Prefill;
                }
                if s == Strategy::Prefill && (!self.cfg.use_kv || cand.rest_chunk_tokens == 0) {
                    s = Strategy::Skip;
                }
                self.preds[i].strategy = Some(s);
                match s {
                    Strategy::Skip => {
                        self.stats.skipped += 1;
                        Ok(report(UnitKind::Skip, q, &populate::Work::default()))
                    }
                    Strategy::Prefill => {
                        let Some(w) = self.prefill(rag, &plan, clock)? else { return Ok(stopped(UnitKind::Prefill, q)) };
                        self.stats.prefilled += 1;
                        Ok(report(UnitKind::Prefill, q, &w))
                    }
                    Strategy::Answer if self.cfg.use_kv && cand.rest_chunk_tokens > 0 => {
                        // Two units: the chunks now, the question and decode next.
                        let Some(w) = self.prefill(rag, &plan, clock)? else { return Ok(stopped(UnitKind::Prefill, q)) };
                        self.queue.push_front(Work::AnswerStage(i));
                        Ok(report(UnitKind::Prefill, q, &w))
                    }
                    // Stopped, the unit is put back as it was: planning it again is the same.
                    Strategy::Answer => self.run_inner(rag, Work::AnswerStage(i), clock),
                }
            }
            Work::RealAnswer { query, replaces } => {
                // NOTE: no QA lookup: the predicted answer would match it again.
                let plan = populate::plan(rag, &query)?;
                let Some(w) = self.answer(rag, plan, clock)? else { return Ok(stopped(UnitKind::RealAnswer, query)) };
                if let Some(id) = replaces {
                    if rag.qa.remove(id).is_some() {
                        rag.qa.save()?;
                    }
                    for p in self.preds.iter_mut().filter(|p| p.qa_id == Some(id)) {
                        p.qa_id = None;
                    }
                }
                self.stats.real_answers += 1;
                Ok(report(UnitKind::RealAnswer, query, &w))
            }
            Work::AnswerStage(i) | Work::KvToQa(i) => {
                let q = self.preds[i].query.clone();
                let plan = populate::plan(rag, &q)?;
                let kind = if matches!(work, Work::KvToQa(_)) { UnitKind::KvToQa } else { UnitKind::Answer };
                let Some(w) = self.answer(rag, plan, clock)? else { return Ok(stopped(kind, q)) };
                let p = &mut self.preds[i];
                p.qa_id = w.qa_id;
                p.answered_at = self.stats.real_queries;
                if kind == UnitKind::KvToQa {
                    p.strategy = Some(Strategy::Answer);
                    self.stats.kv_to_qa += 1;
                } else {
                    self.stats.answered += 1;
                }
                Ok(report(kind, q, &w))
            }
        }
    }

    /// QA → KV: the first predicted answer the layer choice gives up on (no hit in `patience`
    /// real queries, or threshold ≥ τ) leaves the QA bank; its prompt's chunks go into the tree.
    /// Stopped, the victim keeps its QA entry (and is chosen again next time).
    fn convert_to_kv(&mut self, rag: &mut Stores<'_>, clock: &mut StepClock<'_>) -> Result<Option<UnitReport>> {
        if !self.cfg.schedule {
            return Ok(None);
        }
        let (cfg, now, threshold) = (self.cfg.layer_choice, self.stats.real_queries, self.cfg.threshold);
        let victim = self
            .preds
            .iter()
            .position(|p| p.qa_id.and_then(|id| rag.qa.entry(id)).is_some_and(|e| qa_to_kv(&cfg, e.hits, now - p.answered_at, threshold)));
        let Some(i) = victim else { return Ok(None) };
        let q = self.preds[i].query.clone();
        let mut w = populate::Work::default();
        if self.cfg.use_kv {
            let plan = populate::plan(rag, &q)?;
            match self.prefill(rag, &plan, clock)? {
                Some(done) => w = done,
                None => return Ok(Some(stopped(UnitKind::QaToKv, q))),
            }
        }
        let id = self.preds[i].qa_id.take().expect("victim has an entry");
        rag.qa.remove(id);
        rag.qa.save()?;
        self.preds[i].strategy = Some(Strategy::Prefill);
        self.stats.qa_to_kv += 1;
        Ok(Some(report(UnitKind::QaToKv, q, &w)))
    }
}

fn report(kind: UnitKind, query: String, w: &populate::Work) -> UnitReport {
    UnitReport {
        kind,
        query,
        ms: 0.0,
        prefill_tokens: w.prefill_tokens,
        decode_tokens: w.decode_tokens,
        interrupted: false,
        longest_step_ms: 0.0,
    }
}

/// The report of a unit stopped before it stored anything.
fn stopped(kind: UnitKind, query: String) -> UnitReport {
    UnitReport { interrupted: true, ..report(kind, query, &populate::Work::default()) }
}
