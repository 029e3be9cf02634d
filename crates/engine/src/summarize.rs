//! `Summarizer` (seed 000): condenses a user's facts when their persistent stream passes its
//! cap — a model Engram loads (the main model by default, any other by `--summarizer`),
//! greedy, from a fixed prompt, to at most a target number of tokens.
//!
//! ```text
//!  prompt (the summarizer's tokenizer):  SUMMARY_PROMPT + "- fact\n" per fact + "Summary:"
//!  output: greedy, at most `target_tokens`, stopped at EOS or a blank line
//!  segment (the main model's tokens): `render(summary text)`, e.g. a system message
//! ```
//! Invariant: the same facts give the same summary (greedy, fixed prompt, a scratch cache of
//! its own: nothing of the engine's sequences or pool is read or written).

use std::sync::Arc;

use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

use crate::{Generator, SamplingParams};

/// The fixed instruction the facts follow.
pub const SUMMARY_PROMPT: &str =
    "Condense the facts about the user below into a short list. Keep every name, number and preference; drop repetitions.\n\nFacts:\n";

/// Renders a summary's text as the main model's tokens of a persistent-stream segment.
pub type RenderSegment = Arc<dyn Fn(&str) -> Result<Vec<u32>, String> + Send + Sync>;

/// A summarizer model and where its output goes. See the module doc.
pub struct Summarizer {
    model: Arc<Model>,
    pool: KvPool,
    target_tokens: usize,
    render: RenderSegment,
}

impl Summarizer {
    /// `model` condensing to at most `target_tokens` tokens, its output rendered by `render`.
    /// Its cache is its own (f32, room for the longest prompt a capped stream makes).
    pub fn new(model: Arc<Model>, target_tokens: usize, render: RenderSegment) -> Summarizer {
        let layout = KvLayout::of(&model.config);
        let pool = KvPool::new(layout, KvFormat::F32, 256 << 20);
        Summarizer { model, pool, target_tokens: target_tokens.max(1), render }
    }

    /// The most tokens a summary has.
    pub fn target_tokens(&self) -> usize {
        self.target_tokens
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
    /// never empty. Errors: a prompt past the summarizer's context, a failed forward pass.
    pub fn summarize(&self, facts: &[String]) -> Result<(String, Vec<u32>), String> {
        let tok = &self.model.tokenizer;
        let ids = tok.encode(&Self::prompt(facts), true).map_err(|e| e.to_string())?.ids;
        let room = self.model.config.max_positions.saturating_sub(self.target_tokens);
        if ids.len() > room {
            return Err(format!(
                "the summarizer's prompt is {} tokens; with a {}-token summary it passes the summarizer's {}-token context",
                ids.len(),
                self.target_tokens,
                self.model.config.max_positions
            ));
        }
        let params = SamplingParams { max_tokens: self.target_tokens, stop: vec!["\n\n".into()], ..SamplingParams::default() };
        let mut generator = Generator::new(&self.model, &self.pool);
        let out = generator.generate(&ids, &params, &mut |_| true).map_err(|e| format!("summarizing: {e}"))?;
        let text = out.text.trim().to_string();
        // A model that says nothing still leaves a summary that names the facts were condensed.
        let text = if text.is_empty() { "(no summary)".to_string() } else { text };
        let tokens = (self.render)(&text)?;
        if tokens.is_empty() {
            return Err("the summary renders to no tokens".into());
        }
        Ok((text, tokens))
    }
}
