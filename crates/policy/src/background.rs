//! Forward work a policy asks the engine for ([`BackgroundJob`]) and what it gets back
//! ([`BackgroundDone`]): a policy never runs the model itself; it hands the engine a sequence
//! to run (a state entry to prefill over a user's anchors, a summary to generate), and the
//! engine runs it beside requests — batched with them, fault-contained like them — and hands
//! the result to [`crate::ContextPolicy::background_done`].
//!
//! ```text
//!  policy: next_background() ─► BackgroundJob { start: Checkout, max_tokens, priority, hidden }
//!  engine: a sequence in the batch (greedy; Low: within the background share of each step)
//!  policy: background_done(BackgroundDone { tag, outcome: tokens + KV + text | error })
//! ```
//!
//! Invariant: a job's result is what a request with the same checkout and greedy sampling
//! computes (the engine runs it through the same step), so a background computation is exact
//! whatever else shares its steps; a job that fails hands back an error and nothing of its KV.

use engram_kv::SeqKv;

use crate::{Checkout, OwnerKey};

/// How a background job shares the engine with requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackgroundPriority {
    /// A request waits on it (the owner's next job on the same session is held until it
    /// ends): it runs as a request does.
    Blocking,
    /// Every request of its owner waits on it, whatever its session (what all of an owner's
    /// sessions attend, e.g. a user's persistent stream): it runs as a request does.
    BlockingOwner,
    /// Nothing waits on it (a summary, a cache refresh): while requests run it gets at most
    /// the engine's background share of each step's rows; alone, the whole step.
    Low,
}

impl BackgroundPriority {
    /// Whether requests wait on it (it is taken into the batch before them and runs as they do).
    pub fn blocks(self) -> bool {
        self != BackgroundPriority::Low
    }
}

/// A sequence a policy asks the engine to run for it. See the module doc.
pub struct BackgroundJob {
    /// Whose work it is: forgetting the owner drops it.
    pub owner: OwnerKey,
    /// The policy's own id for the job, handed back in [`BackgroundDone::tag`].
    pub tag: u64,
    /// Where the sequence starts and what it runs: `start.kv` holds `start.tokens[..reused]`
    /// (after `start.spans`, at `start.own_first`), the rest of `start.tokens` is prefilled.
    /// `start.session_id` names the session it holds: the owner's jobs on that session wait
    /// until it ends.
    pub start: Checkout,
    /// Tokens generated greedily after the prompt (at most; an end-of-sequence token or a
    /// `stop` text ends sooner). 0: the prompt is prefilled and nothing is sampled.
    pub max_tokens: usize,
    /// Texts that end generation; the result's text stops before them.
    pub stop: Vec<String>,
    pub priority: BackgroundPriority,
    /// Slots of the job's own sequence (`start.kv`'s numbering: slot 0 is its first token) that
    /// its tokens do not attend, except a token inside such a range, which attends the range's
    /// tokens before it: segments kept in a KV but left out of every view (a persistent
    /// stream's tombstoned facts). Empty: every slot is attended.
    pub hidden: Vec<std::ops::Range<usize>>,
}

/// What a finished background job computed.
pub struct BackgroundOutput {
    /// Exactly what `kv` holds: the prompt, then every generated token that was fed.
    pub tokens: Vec<u32>,
    pub kv: SeqKv,
    /// The generated tokens (the last one may be unfed: it ended the generation).
    pub generated: Vec<u32>,
    /// The generated text, up to a stop text (empty for a prefill).
    pub text: String,
    /// Engine steps the job sat out because requests ran and the background share was spent
    /// (0: it never yielded to a request).
    pub held_steps: u64,
}

/// A background job's end, handed to the policy that asked for it.
pub struct BackgroundDone {
    pub owner: OwnerKey,
    pub tag: u64,
    /// The result, or why there is none (a model error, an engine fault, no room in the KV
    /// budget, the owner forgotten).
    pub outcome: Result<BackgroundOutput, String>,
}
