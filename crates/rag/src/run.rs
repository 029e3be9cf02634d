//! Model work: the one way this crate's pipeline and idle units run the model — as a job of
//! `engram-engine`'s step, either alone on the caller's thread ([`alone`], through
//! [`engram_engine::run_alone`]) or as a low-priority background job of the engine thread
//! ([`job`], handed out by [`crate::TreePolicy`]).
//!
//! ```text
//!  Request { prompt, start KV (a tree prefix) + reused, params } ─┬─ alone(…, stop)  ─► Ran
//!                                                                 └─ job(owner, tag) ─► engine ─► BackgroundDone ─► Ran
//! ```
//!
//! Invariant: both ways compute the same tokens (the engine's step, greedy for jobs), and a
//! request's start KV holds exactly `prompt[..reused]`.

use engram_engine::{run_alone, BackgroundJob, BackgroundOutput, BackgroundPriority, SamplingParams, SchedulerConfig, Timings};
use engram_kv::{KvPool, SeqKv};
use engram_model::Model;
use engram_policy::{Checkout, MatchKind, OwnerKey, Repair};

use crate::error::{RagError, Result};

/// Forward work a query or an idle unit asks for.
pub struct Request {
    /// The whole prompt (a prefill: the tokens to hold afterwards).
    pub prompt: Vec<u32>,
    /// KV holding `prompt[..reused]` (a chunk KV tree prefix), or none.
    pub start: Option<SeqKv>,
    pub reused: usize,
    /// Sampling; `max_tokens` 0: the prompt is prefilled and nothing is sampled.
    pub params: SamplingParams,
    /// Moved KV in `start` the engine's step recomputes before the rest of the prompt (a
    /// blended prompt's chunks; `None`: `start` is exact). Not part of [`Request::key`]: only
    /// exact requests (idle units') are matched by key.
    pub repair: Option<Repair>,
}

/// What identifies a request's result: the same prompt, length and stop texts compute the
/// same tokens whatever prefix KV they start from (exact reuse).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    prompt: Vec<u32>,
    max_tokens: usize,
    stop: Vec<String>,
}

impl Key {
    /// Tokens of the prompt.
    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }
}

impl Request {
    /// What identifies its result (see [`Key`]).
    pub fn key(&self) -> Key {
        Key { prompt: self.prompt.clone(), max_tokens: self.params.max_tokens, stop: self.params.stop.clone() }
    }

    fn checkout(self, pool: &KvPool, session_id: String) -> (Checkout, SamplingParams) {
        let n = self.prompt.len();
        let (kv, reused) = match self.start {
            Some(kv) if self.reused > 0 => (kv, self.reused),
            _ => (SeqKv::new(pool), 0),
        };
        let kind = if reused > 0 { MatchKind::Prefix } else { MatchKind::Miss };
        let repair = self.repair.filter(|_| reused > 0);
        (Checkout { repair, ..Checkout::own(session_id, kind, self.prompt, vec![0; n], reused, kv) }, self.params)
    }
}

/// A request's result.
pub struct Ran {
    /// Exactly what `kv` holds: the prompt, then every generated token that was fed.
    pub tokens: Vec<u32>,
    pub kv: SeqKv,
    /// The generated tokens, and their text up to a stop text.
    pub generated: Vec<u32>,
    pub text: String,
    pub timings: Timings,
    /// Engine steps it sat out while requests ran (0 for a run alone).
    pub held_steps: u64,
}

impl Ran {
    /// A background job's output with `timings` measured by its caller.
    pub fn from_output(out: BackgroundOutput, timings: Timings) -> Ran {
        Ran { held_steps: out.held_steps, tokens: out.tokens, kv: out.kv, generated: out.generated, text: out.text, timings }
    }
}

/// Runs `req` alone through the engine's step on this thread, `prefill_chunk` prompt tokens a
/// step, asking `stop` before every step; `None` when it said stop (nothing kept).
pub fn alone(model: &Model, pool: &KvPool, req: Request, prefill_chunk: usize, stop: &mut dyn FnMut() -> bool) -> Result<Option<Ran>> {
    req.params.validate()?;
    let max_tokens = req.params.max_tokens;
    let (start, params) = req.checkout(pool, "rag".into());
    let job = BackgroundJob {
        owner: OwnerKey::rag("", 0),
        tag: 0,
        start,
        max_tokens,
        stop: params.stop.clone(),
        priority: BackgroundPriority::Blocking,
        hidden: Vec::new(),
    };
    let chunk = prefill_chunk.max(1);
    let config = SchedulerConfig { prefill_chunk: chunk, background_chunk: chunk, ..SchedulerConfig::default() };
    let Some(run) = run_alone(model, pool.clone(), config, job, Some(params), stop) else { return Ok(None) };
    match run.done.outcome {
        Ok(out) => Ok(Some(Ran::from_output(out, run.timings))),
        Err(e) => Err(RagError::Model(e)),
    }
}

/// `req` as a low-priority background job of the engine thread, owned by `owner`, tagged `tag`
/// (greedy: the engine's jobs sample nothing else).
pub fn job(pool: &KvPool, req: Request, owner: OwnerKey, tag: u64) -> BackgroundJob {
    let max_tokens = req.params.max_tokens;
    let (start, params) = req.checkout(pool, format!("rag-idle-{tag}"));
    BackgroundJob { owner, tag, start, max_tokens, stop: params.stop, priority: BackgroundPriority::Low, hidden: Vec::new() }
}
