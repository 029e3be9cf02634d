//! The synthetic corpus is a pure function of its seed, every document parses, and its
//! timelines exercise what the benchmark claims: repeats, paraphrases, follow-ups, and
//! updates that arrive after their topic was asked about and before the questions on them.

use engram_rag::parse::parse_bytes;
use engram_rag::synth::{generate, QueryKind, Step, SynthConfig};

#[test]
fn the_corpus_is_seeded_parses_and_exercises_refresh() {
    let cfg = SynthConfig::default();
    let a = generate(&cfg);
    let b = generate(&cfg);
    assert_eq!(format!("{a:?}"), format!("{b:?}"), "same seed, same corpus");
    assert_ne!(format!("{a:?}"), format!("{:?}", generate(&SynthConfig { seed: 4, ..cfg })));
    assert_eq!(a.len(), cfg.users);
    for u in &a {
        let mut asked: Vec<&str> = Vec::new();
        let mut kinds = std::collections::HashSet::new();
        let mut updates = 0;
        for (i, s) in u.steps.iter().enumerate() {
            match s {
                Step::Ingest(d) => {
                    let docs = parse_bytes(&d.id, &d.id, d.kind, false, d.text.as_bytes()).unwrap();
                    assert_eq!(docs.len(), 1);
                    if d.id.contains("update") {
                        updates += 1;
                        let topic = match &u.steps[i + 1] {
                            Step::Query { topic, kind: QueryKind::Later, .. } => topic.as_str(),
                            other => panic!("an update is followed by a question on it, not {other:?}"),
                        };
                        assert!(asked.contains(&topic), "the update's topic {topic:?} was asked before it arrived");
                    }
                }
                Step::Query { topic, kind, .. } => {
                    asked.push(topic);
                    kinds.insert(*kind);
                }
            }
        }
        assert_eq!(updates, cfg.updates_per_user);
        assert_eq!(kinds.len(), 5, "first, repeat, paraphrase, follow-up, later: {kinds:?}");
    }
}
