//! The scenario file: agents and phases as written in YAML, parsed without judging them
//! ([`crate::validate`] does that, with line numbers).
//!
//! ```yaml
//! id: gossip
//! max_tokens: 48
//! agents:
//!   - id: alice
//!     name: Alice
//!     system: You are Alice.
//!     lifecycle: permanent          # or ephemeral (dropped at the end of the run)
//! phases:
//!   - name: alice_bob
//!     label: "Phase 1: Alice & Bob (Private)"
//!     agents: [alice, bob]
//!     auto_rounds: 3
//!     initial_prompt: Talk about Eve.
//!     per_agent_prompt_templates:
//!       alice: "From your chat with Bob:\n${alice_bob.messages[alice]}"
//! ```
//!
//! Invariant: parsing refuses unknown fields (a misspelt key is an error with its line,
//! never silently a default).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A whole scenario file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Names the scenario; permanent agents' cache keys are built from it.
    pub id: String,
    /// A title for people (printed before the transcript).
    #[serde(default)]
    pub title: Option<String>,
    /// Most tokens an agent says per turn (greedy decoding).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Who takes part, in the order they are registered.
    pub agents: Vec<AgentSpec>,
    /// What happens, in the order it runs.
    pub phases: Vec<PhaseSpec>,
}

fn default_max_tokens() -> usize {
    48
}

/// Whether an agent's cache outlives the run.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Lifecycle {
    /// An identity-based cache key (`scenario/agent`): kept, pinned and persisted across
    /// phases, runs and restarts.
    #[default]
    Permanent,
    /// A cache key of this run only, dropped when the run ends (the multi-agent design's analyst).
    Ephemeral,
}

/// One agent.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// The key phases and templates name it by (`\w+`).
    pub id: String,
    /// How others see its lines ("Alice: ..."); the id when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Its system prompt.
    #[serde(default)]
    pub system: Option<String>,
    /// Permanent (default) or ephemeral.
    #[serde(default)]
    pub lifecycle: Lifecycle,
}

impl AgentSpec {
    /// The name its lines carry in other agents' prompts.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

/// One phase: some agents talking for a number of rounds.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseSpec {
    /// The key templates name it by (`\w+`).
    pub name: String,
    /// A heading for people and for the agents' prompts.
    #[serde(default)]
    pub label: Option<String>,
    /// Who takes part, in speaking order.
    pub agents: Vec<String>,
    /// Rounds of turns; in each, every agent answers what it has heard so far.
    #[serde(default = "default_rounds")]
    pub auto_rounds: usize,
    /// What every participant is told when the phase opens.
    #[serde(default)]
    pub initial_prompt: Option<String>,
    /// Per participant, text added to its opening (`${phase.messages[agent]}` resolved).
    #[serde(default)]
    pub per_agent_prompt_templates: BTreeMap<String, String>,
}

fn default_rounds() -> usize {
    1
}

impl PhaseSpec {
    /// The heading shown to agents and people.
    pub fn heading(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.name)
    }
}
