//! `Summarizer` (the dual-stream design's summaries): condenses a user's facts when their persistent stream passes its
//! cap — a model Engram loads (the main model by default, any other by `--summarizer`),
//! greedy, from a fixed prompt, to at most a target number of tokens.
//!
//! ```text
//!  prompt (the summarizer's tokenizer):  SUMMARY_PROMPT + "- fact\n" per fact + "Summary:"
//!  output: greedy, at most `target_tokens`, stopped at EOS or a blank line
//!  segment (the main model's tokens): `render(summary text)`, e.g. a system message
//! ```
//! With the engine's own model as summarizer ([`Summarizer::runs_in_engine`]) the policy asks the
//! engine to generate it (a background job with [`Summarizer::prompt_tokens`], greedy, stopped
//! at [`SUMMARY_STOP`], kept by [`Summarizer::segment`]). A summarizer model of its own runs
//! here instead, as a resumable [`SummaryJob`] (the idle hook's summary gives way
//! to requests): [`Summarizer::advance`] runs it a few steps at a time — one prefill chunk or
//! one decode step each — checking an [`IdleInterrupt`] between steps, and the job keeps its
//! scratch KV, tokens and last logits between calls. [`Summarizer::summarize`] is the same job
//! run to its end in one call.
//!
//! Invariant: the same facts give the same summary (greedy, fixed prompt, a scratch cache of
//! its own: nothing of the engine's sequences or pool is read or written), bit for bit however
//! often the job was stopped and resumed: every run makes the same forward calls in the same
//! order (`crates/dual/tests/it/summary_job.rs`).

use std::sync::Arc;

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

use engram_engine::{Decoding, SamplingParams};
use engram_policy::IdleInterrupt;

/// Prompt tokens per prefill step of a summary (one step between two interrupt checks).
pub const SUMMARY_PREFILL_CHUNK: usize = 32;

/// The fixed instruction the facts follow.
pub const SUMMARY_PROMPT: &str =
    "Condense the facts about the user below into a short list. Keep every name, number and preference; drop repetitions.\n\nFacts:\n";

/// The text that ends a summary's generation (a blank line): the summary is the text before it.
pub const SUMMARY_STOP: &str = "\n\n";

/// Renders a summary's text as the main model's tokens of a persistent-stream segment.
pub type RenderSegment = Arc<dyn Fn(&str) -> Result<Vec<u32>, String> + Send + Sync>;

/// A summarizer model and where its output goes. See the module doc.
pub struct Summarizer {
    model: Arc<Model>,
    pool: KvPool,
    target_tokens: usize,
    render: RenderSegment,
    prefill_chunk: usize,
}

/// A summary being generated: the summarizer's prompt, its scratch KV, the tokens generated so
/// far and the logits the next one is chosen from. Dropping it drops the work whole.
pub struct SummaryJob {
    prompt: Vec<u32>,
    kv: SeqKv,
    generated: Vec<u32>,
    /// The text released so far (a stop string is never part of it).
    text: String,
    /// The logits after the last token fed (`None` until the prompt is prefilled).
    logits: Option<Vec<f32>>,
    /// Forward calls made so far.
    steps: usize,
}

impl SummaryJob {
    /// Forward calls made so far (prefill chunks and decode steps).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    /// Whether the prompt is prefilled (the job is decoding).
    pub fn decoding(&self) -> bool {
        self.logits.is_some()
    }
}

impl Summarizer {
    /// `model` condensing to at most `target_tokens` tokens, its output rendered by `render`.
    /// Its cache is its own (f32, room for the longest prompt a capped stream makes).
    pub fn new(model: Arc<Model>, target_tokens: usize, render: RenderSegment) -> Summarizer {
        let layout = KvLayout::of(&model.config);
        let pool = KvPool::new(layout, KvFormat::F32, 256 << 20);
        Summarizer { model, pool, target_tokens: target_tokens.max(1), render, prefill_chunk: SUMMARY_PREFILL_CHUNK }
    }

    /// Prompt tokens per prefill step (at least 1; default [`SUMMARY_PREFILL_CHUNK`]).
    pub fn with_prefill_chunk(mut self, n: usize) -> Summarizer {
        self.prefill_chunk = n.max(1);
        self
    }

    /// The most tokens a summary has.
    pub fn target_tokens(&self) -> usize {
        self.target_tokens
    }

    /// The model that writes the summaries.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Whether the engine runs this summarizer: it is the engine's own model `main` (the same
    /// loaded model, not an equal one), so a summary is a sequence of the engine's batch; a
    /// model of its own runs in [`Summarizer::advance`]'s loop instead.
    pub fn runs_in_engine(&self, main: &Arc<Model>) -> bool {
        Arc::ptr_eq(&self.model, main)
    }

    /// The summarizer's prompt for `facts`, as its tokens (with the tokenizer's special
    /// prefix). Errors: a prompt that leaves no room for the summary in the summarizer's
    /// context.
    pub fn prompt_tokens(&self, facts: &[String]) -> Result<Vec<u32>, String> {
        let tok = &self.model.tokenizer;
        let ids = tok.encode(&Self::prompt(facts), true).map_err(|e| e.to_string())?.ids;
        let room = self.model.config.max_positions.saturating_sub(self.target_tokens);
        if ids.len() > room || ids.is_empty() {
            return Err(format!(
                "the summarizer's prompt is {} tokens; with a {}-token summary it passes the summarizer's {}-token context",
                ids.len(),
                self.target_tokens,
                self.model.config.max_positions
            ));
        }
        Ok(ids)
    }

    /// A generated summary's text (up to [`SUMMARY_STOP`]) as the summary kept: the text
    /// trimmed (`"(no summary)"` when the model said nothing) and its segment's tokens (main
    /// model), never empty. Errors: a render that fails or gives no tokens.
    pub fn segment(&self, generated: &str) -> Result<(String, Vec<u32>), String> {
        let text = generated.trim().to_string();
        // A model that says nothing still leaves a summary that names the facts were condensed.
        let text = if text.is_empty() { "(no summary)".to_string() } else { text };
        let tokens = (self.render)(&text)?;
        if tokens.is_empty() {
            return Err("the summary renders to no tokens".into());
        }
        Ok((text, tokens))
    }

    /// The summarizer's prompt for `facts`, as text.
    pub fn prompt(facts: &[String]) -> String {
        let mut p = SUMMARY_PROMPT.to_string();
        for f in facts {
            p.push_str("- ");
            p.push_str(f.trim());
            p.push('\n');
        }
        p.push_str("\nSummary:");
        p
    }

    /// The summary of `facts`: its text and its segment's tokens (main model), the latter
    /// never empty — [`Summarizer::start`] then [`Summarizer::advance`] to the end, uninterrupted.
    /// Errors: a prompt past the summarizer's context, a failed forward pass.
    pub fn summarize(&self, facts: &[String]) -> Result<(String, Vec<u32>), String> {
        let mut job = self.start(facts)?;
        loop {
            if let Some(done) = self.advance(&mut job, usize::MAX, &IdleInterrupt::never())? {
                return Ok(done);
            }
        }
    }

    /// A job that summarizes `facts` (nothing computed yet). Errors: a prompt that leaves no
    /// room for the summary in the summarizer's context.
    pub fn start(&self, facts: &[String]) -> Result<SummaryJob, String> {
        let ids = self.prompt_tokens(facts)?;
        Ok(SummaryJob { prompt: ids, kv: SeqKv::new(&self.pool), generated: Vec::new(), text: String::new(), logits: None, steps: 0 })
    }

    /// Runs `job` at most `max_steps` forward calls, stopping before any step once `interrupt`
    /// is requested; returns the summary (text, segment tokens) when the job is done, `None`
    /// while it is not (it resumes exactly there at the next call). Errors (the job is then
    /// spent): a failed forward pass, a summary that renders to no tokens.
    pub fn advance(&self, job: &mut SummaryJob, max_steps: usize, interrupt: &IdleInterrupt) -> Result<Option<(String, Vec<u32>)>, String> {
        let params = SamplingParams { max_tokens: self.target_tokens, stop: vec![SUMMARY_STOP.into()], ..SamplingParams::default() };
        // The decoder's state is rebuilt from the tokens accepted so far (greedy: nothing else
        // carries over), so the job holds no borrow of the tokenizer between calls.
        let mut out = Decoding::new(&self.model.tokenizer, &job.prompt, &params, 0);
        for &t in &job.generated {
            out.accept(t, true).map_err(|e| format!("summarizing: {e}"))?;
        }
        let ctx = self.model.config.max_positions;
        for _ in 0..max_steps {
            if interrupt.requested() {
                return Ok(None);
            }
            let Some(logits) = job.logits.as_mut() else {
                // One prefill chunk.
                let at = job.kv.len();
                let end = (at + self.prefill_chunk).min(job.prompt.len());
                let want = if end == job.prompt.len() { Logits::Last } else { Logits::None };
                let logits = self.feed(&mut job.kv, &job.prompt[at..end], at, want)?;
                job.steps += 1;
                if end == job.prompt.len() {
                    job.logits = Some(logits);
                }
                continue;
            };
            // One decode step: choose, accept, feed.
            let t = out.sample(logits);
            let step = out.accept(t, job.kv.len() + 1 < ctx).map_err(|e| format!("summarizing: {e}"))?;
            job.generated.push(t);
            job.text.push_str(&step.release);
            if step.done.is_some() {
                return self.finish(job).map(Some);
            }
            let at = job.kv.len();
            job.logits = Some(self.feed(&mut job.kv, &[t], at, Logits::Last)?);
            job.steps += 1;
        }
        Ok(None)
    }

    /// Feeds `tokens` at `at` on `kv`; the logits asked for.
    fn feed(&self, kv: &mut SeqKv, tokens: &[u32], at: usize, want: Logits) -> Result<Vec<f32>, String> {
        kv.reserve(tokens.len()).map_err(|e| format!("summarizing: {e}"))?;
        let mut step = [SeqStep::new(tokens, at, kv, want)];
        let out = self.model.forward(&mut step).map_err(|e| format!("summarizing: {e}"))?;
        Ok(out.into_iter().next().unwrap_or_default())
    }

    /// The finished job's text and segment tokens.
    fn finish(&self, job: &SummaryJob) -> Result<(String, Vec<u32>), String> {
        self.segment(&job.text)
    }
}
