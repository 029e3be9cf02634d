//! The flags that choose how context is kept between chat turns (`engram serve`, `engram
//! chat`): `--context sessions|dual` and dual-stream's settings, read into the stack's
//! [`ContextMode`], [`MaskedTurns`] and summarizer model.
//!
//! Invariant: both commands read the same flags the same way, so a chat and a server started
//! with the same flags build the same policy (`engram_stack::build`); a bad combination is an
//! error at start naming the flags, never a silent default.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use engram_model::Model;
use engram_stack::{ContextMode, MaskedTurns};

/// `--context` and dual-stream's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ContextArgs {
    /// How context is kept between chat turns: `sessions` (default: conversations matched by
    /// their text, every turn kept) or `dual` (dual-stream: per user a persistent stream of the
    /// system prompt and facts, per thread a ring of whole turns within --ring-tokens, the
    /// oldest evicted; only a turn's new message is computed). Over HTTP the request's `user`
    /// picks the stream and `thread_id` / `X-Engram-Thread` the ring; in `engram chat`, `--user`
    /// and `/thread NAME`.
    #[arg(long, default_value = "sessions", value_name = "sessions|dual")]
    pub context: String,
    /// With --context dual: the ring's capacity in tokens per thread.
    #[arg(long, default_value_t = 1536)]
    pub ring_tokens: usize,
    /// With --context dual and a sentence encoder: turns less similar than this (cosine) to the
    /// new message are masked out of attention (kept for later). The default keeps recall high
    /// (all-MiniLM-L6-v2 on the labelled pairs: recall 0.91, precision 0.80 at 0.25; docs/embeddings.md):
    /// masking a turn that mattered costs answers, attending one that did not costs only time.
    /// Without a sentence encoder (the LLM's pooled hidden states) masks are off.
    #[arg(long, default_value_t = 0.25)]
    pub relevance_threshold: f32,
    /// With --context dual: the last turns always attended, whatever their similarity.
    #[arg(long, default_value_t = 1)]
    pub keep_last_turns: usize,
    /// With --context dual and relevance masks: where a turn masked out of attention keeps its
    /// KV: `ram` (with the disk tier, written to disk only when RAM runs short), or `disk` (a
    /// checksummed file under the cache directory at once, its RAM returned to the pool, read
    /// back exactly when a later message wants it; needs the disk tier). Either way the files
    /// count against --disk-budget-mib.
    #[arg(long, default_value = "ram", value_name = "ram|disk")]
    pub masked_turns: String,
    /// With --context dual: the most tokens a user's persistent stream (system prompt and
    /// facts: `/v1/users/{id}/facts`, chat's `/fact`) holds; past it the facts are summarized.
    #[arg(long, default_value_t = 512)]
    pub persistent_cap_tokens: usize,
    /// With --context dual: the most tokens a summary of a user's facts has.
    #[arg(long, default_value_t = 300)]
    pub summary_target_tokens: usize,
    /// With --context dual: the model that summarizes facts past the cap (any model Engram
    /// loads: GGUF or a Hugging Face folder); default the served model.
    #[arg(long, value_name = "PATH")]
    pub summarizer: Option<PathBuf>,
}

impl ContextArgs {
    /// Whether `--context dual` was asked for.
    pub fn is_dual(&self) -> bool {
        self.context == "dual"
    }

    /// The stack's context mode; errors name the flag (an unknown mode, a summary target not
    /// below the cap).
    pub fn mode(&self) -> Result<ContextMode> {
        match self.context.as_str() {
            "sessions" => Ok(ContextMode::Sessions),
            "dual" => {
                if self.summary_target_tokens >= self.persistent_cap_tokens {
                    bail!(
                        "--summary-target-tokens ({}) must be below --persistent-cap-tokens ({})",
                        self.summary_target_tokens,
                        self.persistent_cap_tokens
                    );
                }
                Ok(ContextMode::Dual {
                    ring_tokens: self.ring_tokens.max(1),
                    threshold: self.relevance_threshold,
                    keep_last: self.keep_last_turns.max(1),
                    persistent_cap: self.persistent_cap_tokens.max(1),
                    summary_target: self.summary_target_tokens.max(1),
                })
            }
            other => bail!("--context wants sessions or dual, got {other:?}"),
        }
    }

    /// Where masked-out turns keep their KV (`--masked-turns`).
    pub fn masked_turns(&self) -> Result<MaskedTurns> {
        self.masked_turns.parse().map_err(anyhow::Error::msg)
    }

    /// The summarizer model `--summarizer` names, loaded (`None`: the served model).
    pub fn summarizer_model(&self) -> Result<Option<Arc<Model>>> {
        match &self.summarizer {
            Some(p) => Ok(Some(Arc::new(Model::load(p).with_context(|| format!("--summarizer {}", p.display()))?))),
            None => Ok(None),
        }
    }
}
