//! Running a scenario: phases in order, rounds within a phase, every participant's turn of a
//! round submitted together to the [`Backend`] (so they decode in one batch).
//!
//! ```text
//!  phase opens --> each participant hears: heading, initial prompt, its own template
//!                  (${phase.messages[agent]} resolved from its point of view)
//!  round r     --> all participants' prompts (their Memory) --run_round--> answers
//!                  each answer: said by its agent, heard by the phase's other participants
//!  run ends    --> ephemeral agents released
//! ```
//!
//! NOTE: within a round the agents speak at once (each answers what was said up to the
//! previous round), not one after another: that is what lets a round's turns share a batch,
//! and suits the multi-agent design's scenarios (a prisoner's choice is simultaneous anyway).
//!
//! Invariants: an agent hears only the phases it takes part in (plus what its templates
//! quote); its prompts only grow (see [`crate::memory`]), so from its second turn on its
//! cache covers its whole previous prompt and answer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::{AgentKey, Backend, Turn, TurnOutcome};
use crate::memory::Memory;
use crate::spec::{Lifecycle, PhaseSpec, Scenario};
use crate::template::{self, Line};

/// How to run a scenario.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Rounds per phase instead of each phase's `auto_rounds`.
    pub rounds: Option<usize>,
    /// Tokens per turn instead of the scenario's `max_tokens`.
    pub max_tokens: Option<usize>,
    /// Restart the backend (engine stopped, started again on its persisted caches) before
    /// every phase but the first.
    pub restart_between_phases: bool,
    /// Names this run's ephemeral caches (a timestamp when empty).
    pub run_id: String,
}

/// A line said in a phase, as the transcript shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Message {
    /// 0-based round of its phase.
    pub round: usize,
    /// The agent's id and display name.
    pub agent: String,
    pub name: String,
    /// What it said, as generated.
    pub text: String,
    /// Who heard it: the phase's participants (nobody else's prompt contains it, unless a
    /// template quotes the phase to them).
    pub visible_to: Vec<String>,
}

/// What one turn cost.
#[derive(Clone, Debug, Serialize)]
pub struct TurnFigures {
    /// The agent's id and the 0-based round.
    pub agent: String,
    pub round: usize,
    /// The prompt's length and how much of it the agent's cache held.
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// `prompt_tokens - cached_tokens`: what the model prefilled.
    pub computed_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Submission to first text (`None` through a server), and to the end of the turn.
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
    /// The rendered prompt (for checks; left out of the JSON).
    #[serde(skip)]
    pub prompt_text: String,
}

/// One phase as it ran.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseReport {
    /// The phase's key, heading and participants.
    pub name: String,
    pub label: String,
    pub agents: Vec<String>,
    /// What was said (the public transcript) and what each turn cost, in order.
    pub messages: Vec<Message>,
    pub turns: Vec<TurnFigures>,
    /// Wall time of the phase (its rounds; a restart before it not included).
    pub elapsed_ms: f64,
}

/// A whole run: the transcript and its figures.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The scenario's id, its phases as they ran, and the run's wall time (restarts included).
    pub scenario: String,
    pub phases: Vec<PhaseReport>,
    pub elapsed_ms: f64,
}

impl Report {
    /// The transcript alone (who said what in which phase), for comparing runs.
    pub fn transcript(&self) -> Vec<(String, Vec<Message>)> {
        self.phases.iter().map(|p| (p.name.clone(), p.messages.clone())).collect()
    }
}

/// What a run tells its observer as it goes (the CLI streams these).
pub enum Progress<'a> {
    /// A phase opens (before its first round).
    Phase(&'a PhaseSpec),
    /// A turn ended: what was said and what it cost.
    Turn { phase: &'a PhaseSpec, message: &'a Message, figures: &'a TurnFigures },
    /// The backend was restarted before the next phase.
    Restarted,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs `scenario` on `backend`. The scenario must have passed [`crate::validate`].
pub fn run(
    scenario: &Scenario,
    backend: &mut dyn Backend,
    options: &RunOptions,
    observe: &mut dyn FnMut(Progress),
) -> Result<Report, String> {
    let started = Instant::now();
    let run_id = if options.run_id.is_empty() {
        format!("{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis())
    } else {
        options.run_id.clone()
    };
    let max_tokens = options.max_tokens.unwrap_or(scenario.max_tokens);
    let agents: BTreeMap<&str, _> = scenario.agents.iter().map(|a| (a.id.as_str(), a)).collect();
    let keys: BTreeMap<&str, AgentKey> = scenario
        .agents
        .iter()
        .map(|a| (a.id.as_str(), AgentKey::new(&scenario.id, &a.id, a.lifecycle == Lifecycle::Permanent, &run_id)))
        .collect();
    for a in &scenario.agents {
        backend.register(&keys[a.id.as_str()], a.display_name(), a.system.as_deref())?;
    }
    let display = |id: &str| agents.get(id).map_or(id.to_string(), |a| a.display_name().to_string());
    let mut memory: BTreeMap<&str, Memory> = BTreeMap::new();
    let mut phases: Vec<PhaseReport> = Vec::new();
    for (i, phase) in scenario.phases.iter().enumerate() {
        if i > 0 && options.restart_between_phases {
            backend.restart()?;
            observe(Progress::Restarted);
        }
        observe(Progress::Phase(phase));
        let phase_started = Instant::now();
        for a in &phase.agents {
            let mut opening = format!("## {}", phase.heading());
            if let Some(p) = &phase.initial_prompt {
                opening = format!("{opening}\n{}", p.trim_end());
            }
            if let Some(tpl) = phase.per_agent_prompt_templates.get(a) {
                let quoted = template::resolve(tpl, &mut |q, who| {
                    let lines: Vec<Line> = phases
                        .iter()
                        .filter(|r| r.name == q)
                        .flat_map(|r| &r.messages)
                        .map(|m| Line { speaker: &m.agent, text: &m.text })
                        .collect();
                    template::from_perspective(&lines, who, &display)
                });
                opening = format!("{opening}\n{}", quoted.trim_end());
            }
            memory.entry(a.as_str()).or_default().hear(opening);
        }
        let mut report = PhaseReport {
            name: phase.name.clone(),
            label: phase.heading().to_string(),
            agents: phase.agents.clone(),
            messages: Vec::new(),
            turns: Vec::new(),
            elapsed_ms: 0.0,
        };
        for round in 0..options.rounds.unwrap_or(phase.auto_rounds) {
            let turns: Vec<Turn> = phase
                .agents
                .iter()
                .map(|a| Turn {
                    agent: keys[a.as_str()].clone(),
                    system: agents[a.as_str()].system.clone(),
                    messages: memory.get_mut(a.as_str()).expect("opened above").prompt(),
                })
                .collect();
            let outcomes: Vec<TurnOutcome> = backend.run_round(&turns, max_tokens)?;
            for (a, o) in phase.agents.iter().zip(&outcomes) {
                memory.get_mut(a.as_str()).expect("opened above").said(&o.text);
                for other in phase.agents.iter().filter(|o| *o != a) {
                    memory.get_mut(other.as_str()).expect("opened above").hear(format!("{}: {}", display(a), o.text));
                }
                let message = Message { round, agent: a.clone(), name: display(a), text: o.text.clone(), visible_to: phase.agents.clone() };
                let figures = TurnFigures {
                    agent: a.clone(),
                    round,
                    prompt_tokens: o.prompt_tokens,
                    cached_tokens: o.cached_tokens,
                    computed_tokens: o.prompt_tokens.saturating_sub(o.cached_tokens),
                    completion_tokens: o.completion_tokens,
                    ttft_ms: o.ttft.map(ms),
                    total_ms: ms(o.total),
                    prompt_text: o.prompt_text.clone(),
                };
                observe(Progress::Turn { phase, message: &message, figures: &figures });
                report.messages.push(message);
                report.turns.push(figures);
            }
        }
        report.elapsed_ms = ms(phase_started.elapsed());
        phases.push(report);
    }
    for a in scenario.agents.iter().filter(|a| a.lifecycle == Lifecycle::Ephemeral) {
        backend.release(&keys[a.id.as_str()])?;
    }
    Ok(Report { scenario: scenario.id.clone(), phases, elapsed_ms: ms(started.elapsed()) })
}
