//! Checking a scenario file before it runs: syntax, unknown or duplicate agents and phases,
//! empty phases, templates naming unknown phases or agents, and phases whose templates
//! depend on each other in a cycle or on a phase that has not run yet.
//!
//! Invariant: [`load`] returns a scenario only when no problem was found; every problem
//! names the file's line it is about.

use std::collections::{BTreeMap, BTreeSet};

use crate::lines::SourceLines;
use crate::spec::Scenario;
use crate::template;

/// One thing wrong with a scenario file, at a 1-based line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line of the file.
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// Everything wrong with a file (never empty).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{}", .0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct Problems(pub Vec<Problem>);

/// Parses and checks a scenario file's text.
pub fn load(text: &str) -> Result<Scenario, Problems> {
    let scenario: Scenario = serde_yaml_ng::from_str(text).map_err(|e| {
        let line = e.location().map_or(1, |l| l.line());
        Problems(vec![Problem { line, message: e.to_string() }])
    })?;
    let problems = check(&scenario, text);
    if problems.is_empty() {
        Ok(scenario)
    } else {
        Err(Problems(problems))
    }
}

fn is_key(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Every problem of a parsed scenario, located in its source `text`.
pub fn check(s: &Scenario, text: &str) -> Vec<Problem> {
    let src = SourceLines::new(text);
    let mut out = Vec::new();
    let mut say = |line: usize, message: String| out.push(Problem { line, message });
    let agent_line = |id: &str| src.item("agents", "id", id).map_or(src.top_key("agents"), |r| r.0);
    let phase_block = |name: &str| src.item("phases", "name", name).unwrap_or((src.top_key("phases"), src.top_key("phases") + 1));

    if s.agents.is_empty() {
        say(src.top_key("agents"), "the scenario has no agents".into());
    }
    if s.phases.is_empty() {
        say(src.top_key("phases"), "the scenario has no phases".into());
    }
    if s.max_tokens == 0 {
        say(src.top_key("max_tokens"), "max_tokens must be at least 1".into());
    }
    let mut agents = BTreeSet::new();
    for a in &s.agents {
        if !is_key(&a.id) {
            say(agent_line(&a.id), format!("agent id {:?} must be letters, digits and _", a.id));
        }
        if !agents.insert(a.id.as_str()) {
            say(agent_line(&a.id), format!("agent {:?} is defined twice", a.id));
        }
    }
    let mut order: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, p) in s.phases.iter().enumerate() {
        let block = phase_block(&p.name);
        if !is_key(&p.name) {
            say(block.0, format!("phase name {:?} must be letters, digits and _", p.name));
        }
        if order.insert(p.name.as_str(), i).is_some() {
            say(block.0, format!("phase {:?} is defined twice", p.name));
        }
    }
    // With two phases of one name, which one a template reads is ambiguous: fix that first.
    let duplicates = order.len() < s.phases.len();
    // Which phases each phase's templates read, for the cycle check.
    let mut reads: BTreeMap<&str, Vec<(&str, usize)>> = BTreeMap::new();
    for p in &s.phases {
        let block = phase_block(&p.name);
        if p.agents.is_empty() {
            say(block.0, format!("phase {:?} has no agents", p.name));
        }
        if p.auto_rounds == 0 {
            say(src.find_in(block, "auto_rounds"), format!("phase {:?} has auto_rounds 0: it would say nothing", p.name));
        }
        let mut seen = BTreeSet::new();
        for a in &p.agents {
            if !agents.contains(a.as_str()) {
                say(src.find_in(block, a), format!("phase {:?} names agent {a:?}, which is not defined under agents", p.name));
            } else if !seen.insert(a.as_str()) {
                say(src.find_in(block, a), format!("phase {:?} lists agent {a:?} twice", p.name));
            }
        }
        for (target, tpl) in &p.per_agent_prompt_templates {
            if !p.agents.contains(target) {
                say(
                    src.find_in(block, target),
                    format!("phase {:?} has a template for {target:?}, which does not take part in it", p.name),
                );
            }
            for bad in template::malformed(tpl) {
                say(src.find_in(block, &bad), format!("template for {target:?} has {bad:?}: write ${{phase.messages[agent]}}"));
            }
            for r in template::references(tpl) {
                let line = src.find_in(block, &format!("{}.messages[{}]", r.phase, r.agent));
                if !agents.contains(r.agent.as_str()) {
                    say(line, format!("template for {target:?} names agent {:?}, which is not defined under agents", r.agent));
                }
                match order.get(r.phase.as_str()) {
                    None => say(line, format!("template for {target:?} names phase {:?}, which is not defined", r.phase)),
                    Some(&j) => reads.entry(p.name.as_str()).or_default().push((s.phases[j].name.as_str(), line)),
                }
            }
        }
    }
    // A cycle of template dependencies (a phase reading itself included), then reads of
    // phases that run later: a phase's messages exist only once it has run.
    if duplicates {
        reads.clear();
    }
    let mut in_cycle = BTreeSet::new();
    for p in &s.phases {
        if let Some(path) = cycle_from(&p.name, &reads) {
            if path.iter().all(|n| !in_cycle.contains(n.as_str())) {
                let line = reads[p.name.as_str()].iter().find(|(q, _)| *q == path[1]).map_or(1, |x| x.1);
                say(line, format!("templates form a cycle: {}", path.join(" -> ")));
            }
            in_cycle.extend(path);
        }
    }
    for p in &s.phases {
        for &(q, line) in reads.get(p.name.as_str()).into_iter().flatten() {
            if !in_cycle.contains(p.name.as_str()) && order[q] > order[p.name.as_str()] {
                say(line, format!("phase {:?} reads phase {q:?}, which runs after it", p.name));
            }
        }
    }
    out.sort_by_key(|p| p.line);
    out
}

/// A path `start -> ... -> start` through `reads`, if one exists.
fn cycle_from(start: &str, reads: &BTreeMap<&str, Vec<(&str, usize)>>) -> Option<Vec<String>> {
    fn walk(
        at: &str,
        start: &str,
        reads: &BTreeMap<&str, Vec<(&str, usize)>>,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for &(next, _) in reads.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.to_string());
                return true;
            }
            if seen.insert(next.to_string()) {
                path.push(next.to_string());
                if walk(next, start, reads, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(start, start, reads, &mut path, &mut BTreeSet::new()).then_some(path)
}
