//! The seam between the scenario runner (policy: who speaks, what they are told) and what
//! runs the turns (mechanism): the engine's scheduler in this process
//! ([`crate::EngineBackend`]) or a server's agents API ([`crate::HttpBackend`]).
//!
//! Invariant: a backend runs every turn of a round together (batched), on the cache its
//! [`AgentKey`] names, and reports what the cache gave it (`cached_tokens`).

use std::time::Duration;

use engram_tokenizer::ChatMessage;

/// Where an agent's cache lives: the key it is kept under, and whether it outlives the run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AgentKey {
    /// A cache owner (engine tenant key, or server agent id): identity-based
    /// (`scn-<scenario>-<agent>`) for a permanent agent, with the run's id for an ephemeral one.
    pub key: String,
    /// Kept pinned and persisted past the run (a permanent agent).
    pub permanent: bool,
}

impl AgentKey {
    /// The key of `agent` in `scenario`: the same in every run when permanent, this run's
    /// own (`run`) when ephemeral.
    pub fn new(scenario: &str, agent: &str, permanent: bool, run: &str) -> AgentKey {
        let key = if permanent { format!("scn-{scenario}-{agent}") } else { format!("scn-{scenario}-{run}-{agent}") };
        AgentKey { key, permanent }
    }
}

/// One agent's turn: its whole conversation so far, ending with what it is to answer.
#[derive(Clone, Debug)]
pub struct Turn {
    pub agent: AgentKey,
    /// The agent's system prompt (the server keeps its own copy, given at registration).
    pub system: Option<String>,
    /// Everything after the system prompt: what it was told (user) and said (assistant).
    pub messages: Vec<ChatMessage>,
}

impl Turn {
    /// The chat as the model's template renders it: system first, then the messages.
    pub fn chat(&self) -> Vec<ChatMessage> {
        let mut chat: Vec<ChatMessage> = self.system.iter().map(|s| ChatMessage::new("system", s.clone())).collect();
        chat.extend(self.messages.iter().cloned());
        chat
    }
}

/// What one turn produced and cost.
#[derive(Clone, Debug)]
pub struct TurnOutcome {
    /// What the agent said.
    pub text: String,
    /// The rendered prompt (kept to check `visible_to`; empty where the backend cannot see it).
    pub prompt_text: String,
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the agent's cache instead of computed.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Submission to first streamed text (`None` where the backend cannot see it).
    pub ttft: Option<Duration>,
    /// Submission to the end of the turn.
    pub total: Duration,
}

/// Runs agents' turns. See the module doc.
pub trait Backend {
    /// Makes `agent` known (a server agent with its system prompt); idempotent for a
    /// permanent agent that already exists.
    fn register(&mut self, agent: &AgentKey, name: &str, system: Option<&str>) -> Result<(), String>;

    /// Runs `turns` together and returns their outcomes in the same order.
    fn run_round(&mut self, turns: &[Turn], max_tokens: usize) -> Result<Vec<TurnOutcome>, String>;

    /// Drops everything cached for `agent` (an ephemeral agent at the end of the run).
    fn release(&mut self, agent: &AgentKey) -> Result<(), String>;

    /// Stops the engine and starts it again on the same persisted caches (a restart between
    /// phases); an error where the backend cannot (a remote server restarts on its own).
    fn restart(&mut self) -> Result<(), String>;
}
