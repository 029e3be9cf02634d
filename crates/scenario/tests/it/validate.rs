//! `engram scenario validate`'s checks: the shipped files pass; each kind of bad file is
//! refused with a message that says what is wrong and names its line.

use engram_scenario::{load, Problem};

const GOOD: &str = "\
id: t
agents:
  - id: alice
    name: Alice
  - id: bob
phases:
  - name: one
    agents: [alice, bob]
    auto_rounds: 2
  - name: two
    agents: [alice]
    per_agent_prompt_templates:
      alice: \"Earlier: ${one.messages[alice]}\"
";

/// The problems `text` has (it must have some).
fn problems(text: &str) -> Vec<Problem> {
    match load(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(p) => p.0,
    }
}

/// `GOOD` with `from` replaced by `to` has exactly one problem, at `line`, whose message
/// holds every one of `words`.
fn refused(from: &str, to: &str, line: usize, words: &[&str]) {
    assert!(GOOD.contains(from), "{from:?}");
    let text = GOOD.replacen(from, to, 1);
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].line, line, "{}", p[0]);
    for w in words {
        assert!(p[0].message.contains(w), "{:?} lacks {w:?}", p[0].message);
    }
    assert!(p[0].to_string().starts_with(&format!("line {line}: ")));
}

#[test]
fn good_and_shipped_files_pass() {
    load(GOOD).unwrap();
    for f in ["gossip", "prisoners-dilemma"] {
        let path = format!("{}/../../examples/scenarios/{f}.yaml", env!("CARGO_MANIFEST_DIR"));
        load(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

#[test]
fn an_unknown_agent_in_a_phase_names_the_agent_and_its_line() {
    refused("agents: [alice, bob]", "agents: [alice, carol]", 8, &["\"carol\"", "not defined"]);
}

#[test]
fn a_template_naming_an_unknown_phase_or_agent_names_it() {
    refused("${one.messages[alice]}", "${three.messages[alice]}", 13, &["phase \"three\"", "not defined"]);
    refused("${one.messages[alice]}", "${one.messages[zed]}", 13, &["agent \"zed\"", "not defined"]);
    refused("${one.messages[alice]}", "${one.message[alice]}", 13, &["${one.message[alice]}"]);
}

#[test]
fn a_template_for_an_agent_outside_the_phase_is_refused() {
    refused("      alice: \"Earlier", "      bob: \"Earlier", 13, &["\"bob\"", "does not take part"]);
}

#[test]
fn a_cycle_of_templates_is_refused_with_its_path() {
    let text = GOOD
        .replace("    auto_rounds: 2\n", "    auto_rounds: 2\n    per_agent_prompt_templates:\n      bob: \"${two.messages[alice]}\"\n");
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].message.contains("cycle: one -> two -> one"), "{}", p[0]);
    assert_eq!(p[0].line, 11);
    // A phase quoting itself is the shortest cycle.
    let p = problems(&GOOD.replace("${one.messages", "${two.messages"));
    assert!(p[0].message.contains("cycle: two -> two"), "{}", p[0]);
}

#[test]
fn a_phase_reading_a_later_phase_is_refused() {
    let text = GOOD
        .replace("    auto_rounds: 2\n", "    auto_rounds: 2\n    per_agent_prompt_templates:\n      bob: \"${two.messages[alice]}\"\n");
    // Break the cycle: phase two no longer reads phase one.
    let text = text.replace("Earlier: ${one.messages[alice]}", "Earlier.");
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].message.contains("phase \"one\" reads phase \"two\", which runs after it"), "{}", p[0]);
    assert_eq!(p[0].line, 11);
}

#[test]
fn empty_phases_are_refused() {
    refused("agents: [alice, bob]", "agents: []", 7, &["phase \"one\" has no agents"]);
    refused("auto_rounds: 2", "auto_rounds: 0", 9, &["auto_rounds 0"]);
}

#[test]
fn duplicates_syntax_and_unknown_fields_name_their_line() {
    refused("  - id: bob\n", "  - id: alice\n  - id: bob\n", 3, &["agent \"alice\" is defined twice"]);
    refused("  - name: two\n", "  - name: one\n", 7, &["phase \"one\" is defined twice"]);
    refused("    auto_rounds: 2\n", "    auto_round: 2\n", 9, &["auto_round"]);
    refused("    agents: [alice]\n", "    agents: [alice\n", 12, &["flow sequence at line 11"]);
}
