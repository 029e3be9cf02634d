//! What the scenario tests share: the tiny fixture model, the shipped scenario files, runs
//! on the in-process engine, and the working-memory checks every run must pass.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use engram_fixture::{GgufFormat, Shape};
use engram_kv::KvFormat;
use engram_model::Model;
use engram_scenario::{run, EngineBackend, EngineOptions, Report, RunOptions, Scenario};

/// The tiny fixture's Q8_0 GGUF (generated once per test binary), its path and the model.
pub fn fixture() -> &'static (tempfile::TempDir, PathBuf, Arc<Model>) {
    static M: OnceLock<(tempfile::TempDir, PathBuf, Arc<Model>)> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let files =
            engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
        let path = files.gguf(GgufFormat::Q8_0).unwrap().to_path_buf();
        let m = Model::load(&path).unwrap();
        (dir, path, Arc::new(m))
    })
}

/// A shipped scenario (`examples/scenarios/<name>.yaml`), validated.
pub fn shipped(name: &str) -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios").join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap();
    engram_scenario::load(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Short turns keep the tests fast; the phases and rounds are the files'.
pub fn options() -> RunOptions {
    RunOptions { max_tokens: Some(12), run_id: "test".into(), ..RunOptions::default() }
}

/// `scenario` run in process with f32 KV; `reuse` false computes every prompt whole.
pub fn run_in_process(scenario: &Scenario, reuse: bool, cache_dir: Option<PathBuf>, restart: bool) -> Report {
    let model = fixture().2.clone();
    let engine = EngineOptions { kv_format: KvFormat::F32, kv_budget_bytes: 256 << 20, cache_dir, reuse, ..EngineOptions::default() };
    let mut backend = EngineBackend::start(model, engine);
    let opts = RunOptions { restart_between_phases: restart, ..options() };
    run(scenario, &mut backend, &opts, &mut |_| {}).unwrap()
}

/// From an agent's second turn on (in any phase), its cache covers its whole previous
/// prompt and as much of its answer as the new prompt's own tokenization spells the same
/// way: at most every generated token but the last (sampled, never run through the model).
/// A request reuses only tokens a cold request would compute, and a random-weight model
/// often generates splits the tokenizer would not make (" 1" + "0" where the text says
/// " 10"); from the first such token on, the answer is recomputed.
pub fn assert_working_memory(report: &Report) {
    let mut last: BTreeMap<&str, (usize, usize, &str)> = BTreeMap::new();
    for phase in &report.phases {
        for t in &phase.turns {
            if let Some(&(prompt, completion, where_)) = last.get(t.agent.as_str()) {
                assert!(
                    t.cached_tokens >= prompt && t.cached_tokens < prompt + completion,
                    "{} in {} round {} (previous turn in {where_}): cached {} of {}, previous prompt {prompt} + answer {completion}",
                    t.agent,
                    phase.name,
                    t.round,
                    t.cached_tokens,
                    t.prompt_tokens
                );
                assert_eq!(t.computed_tokens, t.prompt_tokens - t.cached_tokens);
            }
            last.insert(&t.agent, (t.prompt_tokens, t.completion_tokens, &phase.name));
        }
    }
}

/// `visible_to` holds: no prompt of an agent contains a message of a phase it neither took
/// part in nor had quoted to it by one of its templates.
pub fn assert_phases_stay_private(scenario: &Scenario, report: &Report) {
    for agent in &scenario.agents {
        let known: Vec<&str> = scenario
            .phases
            .iter()
            .filter(|p| p.agents.contains(&agent.id))
            .flat_map(|p| {
                let quoted = p.per_agent_prompt_templates.get(&agent.id).map(|t| engram_scenario::template::references(t));
                std::iter::once(p.name.clone()).chain(quoted.into_iter().flatten().map(|r| r.phase))
            })
            .map(|n| scenario.phases.iter().find(|p| p.name == n).unwrap().name.as_str())
            .collect();
        let prompts: Vec<&str> =
            report.phases.iter().flat_map(|p| &p.turns).filter(|t| t.agent == agent.id).map(|t| t.prompt_text.as_str()).collect();
        assert!(!prompts.is_empty() && prompts.iter().all(|p| !p.is_empty()));
        let mut checked = 0;
        for phase in report.phases.iter().filter(|p| !known.contains(&p.name.as_str())) {
            for m in &phase.messages {
                assert_eq!(m.visible_to, phase.agents);
                assert!(!m.visible_to.contains(&agent.id));
                // Only texts long enough not to occur by chance in random-weight babble.
                if m.text.trim().len() >= 16 {
                    checked += 1;
                    for p in &prompts {
                        assert!(
                            !p.contains(m.text.trim()),
                            "{}'s prompt holds {}'s line from {}: {:?}",
                            agent.id,
                            m.agent,
                            phase.name,
                            m.text
                        );
                    }
                }
            }
        }
        let hidden = report.phases.iter().filter(|p| !known.contains(&p.name.as_str())).count();
        assert!(hidden == 0 || checked > 0, "{}: nothing long enough to check in the {hidden} phases it must not see", agent.id);
    }
}
