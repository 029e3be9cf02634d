//! The shipped scenarios on the tiny fixture, in process: each agent's cache acts as its
//! working memory across phases (cached tokens = its whole previous prompt and answer),
//! phases stay private to their participants, the transcript equals a run that reuses
//! nothing, and a restart between phases resumes warm with the same transcript.

use crate::common;
use common::*;

fn check_shipped(name: &str) {
    let scenario = shipped(name);
    let cached = run_in_process(&scenario, true, None, false);
    assert_eq!(cached.phases.len(), scenario.phases.len());
    assert_working_memory(&cached);
    assert_phases_stay_private(&scenario, &cached);
    let cold = run_in_process(&scenario, false, None, false);
    assert!(cold.phases.iter().flat_map(|p| &p.turns).all(|t| t.cached_tokens == 0 && t.computed_tokens == t.prompt_tokens));
    assert_eq!(cached.transcript(), cold.transcript(), "{name}: working memory changed what the agents said");
    let (c, w): (usize, usize) =
        cached.phases.iter().flat_map(|p| &p.turns).fold((0, 0), |(c, w), t| (c + t.computed_tokens, w + t.prompt_tokens));
    assert!(c * 2 < w, "{name}: computed {c} of {w} prompt tokens");
}

#[test]
fn gossip_runs_on_working_memory_and_keeps_phases_private() {
    check_shipped("gossip");
}

#[test]
fn prisoners_dilemma_runs_on_working_memory_and_keeps_phases_private() {
    check_shipped("prisoners-dilemma");
}

/// The engine stopped and started again between every two phases: each agent's first turn
/// of a phase is served from its persisted cache (restored from disk, as warm as in RAM)
/// and the agents say what they said without the restarts.
#[test]
fn a_restart_between_phases_resumes_warm_with_the_same_transcript() {
    let scenario = shipped("prisoners-dilemma");
    let dir = tempfile::tempdir().unwrap();
    let restarted = run_in_process(&scenario, true, Some(dir.path().to_path_buf()), true);
    assert_working_memory(&restarted);
    let live = run_in_process(&scenario, true, None, false);
    assert_eq!(restarted.transcript(), live.transcript());
}
