//! Speculative decoding with prompt lookup (`speculate.rs`) changes how many tokens a step
//! produces, never which: on the trained pycode-7m, asked to repeat a function, the scheduler
//! with speculation streams the same text and tokens as without — greedy, seeded sampling and
//! a stop string, batched together, on every KV format — while accepting drafts.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use crate::common;
use common::Collect;
use engram_engine::{run_engine, Command, DraftBudget, Event, Metrics, PromptLookup, SamplingParams, SchedulerConfig};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

const FUNCTION: &str = "def moving_average(values, window):\n    total = 0.0\n    out = []\n    for i, v in enumerate(values):\n        total += v\n        if i >= window:\n            total -= values[i - window]\n        out.append(total / min(i + 1, window))\n    return out\n";

fn pycode() -> Model {
    Model::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf")).unwrap()
}

/// Per job: streamed text, completion tokens and finish; and the engine's metrics.
use common::Run;

/// Runs `jobs` (prompt, params) submitted together to one engine.
fn run(model: &Arc<Model>, format: KvFormat, speculation: Option<PromptLookup>, jobs: &[(String, SamplingParams)]) -> Run {
    common::run_jobs(
        model,
        format,
        SchedulerConfig { speculation, draft_budget: DraftBudget::Acceptance, ..SchedulerConfig::default() },
        jobs,
    )
}

fn jobs() -> Vec<(String, SamplingParams)> {
    let copy = format!("{FUNCTION}\n\n# the same function, again:\n{}", &FUNCTION[..20]);
    let greedy = SamplingParams { max_tokens: 96, ..Default::default() };
    let sampled = SamplingParams { max_tokens: 64, temperature: 0.7, top_p: 0.95, seed: 7, ..Default::default() };
    let stopped = SamplingParams { max_tokens: 96, stop: vec!["return".into()], repetition_penalty: 1.1, ..Default::default() };
    vec![(copy.clone(), greedy), (copy.clone(), sampled), (copy, stopped)]
}

#[test]
fn speculation_streams_exactly_what_decoding_one_by_one_does() {
    let model = Arc::new(pycode());
    let jobs = jobs();
    for format in [KvFormat::F32, KvFormat::F16, KvFormat::Q8, KvFormat::Q4] {
        let (plain, plain_metrics) = run(&model, format, None, &jobs);
        let (fast, metrics) = run(&model, format, Some(PromptLookup::default()), &jobs);
        assert_eq!(plain_metrics.draft_tokens.load(Relaxed), 0, "{format}: no drafts without speculation");
        for (i, (p, f)) in plain.iter().zip(&fast).enumerate() {
            assert_eq!(p, f, "{format}: job {i} differs with speculation");
        }
        let (drafted, accepted) = (metrics.draft_tokens.load(Relaxed), metrics.draft_tokens_accepted.load(Relaxed));
        let steps = (metrics.steps.load(Relaxed), plain_metrics.steps.load(Relaxed));
        eprintln!("{format}: {accepted} of {drafted} drafts accepted; {} steps against {}; {:?}", steps.0, steps.1, fast[0]);
        assert!(accepted > 0 && accepted <= drafted, "{format}: {accepted} of {drafted} drafts accepted");
        assert!(
            metrics.steps.load(Relaxed) < plain_metrics.steps.load(Relaxed),
            "{format}: accepted drafts save steps ({} with, {} without)",
            metrics.steps.load(Relaxed),
            plain_metrics.steps.load(Relaxed)
        );
    }
}

/// The default draft budget sizes trees by this machine's timed steps, so the trees differ
/// from run to run and machine to machine; the streamed text never does.
#[test]
fn the_measured_draft_budget_streams_exactly_what_decoding_one_by_one_does() {
    let model = Arc::new(pycode());
    let jobs = jobs();
    assert_eq!(SchedulerConfig::default().draft_budget, DraftBudget::Measured);
    let (plain, _) = run(&model, KvFormat::F16, None, &jobs);
    for round in 0..2 {
        let config = SchedulerConfig { speculation: Some(PromptLookup::default()), ..SchedulerConfig::default() };
        let (fast, metrics) = common::run_jobs(&model, KvFormat::F16, config, &jobs);
        let (drafted, accepted) = (metrics.draft_tokens.load(Relaxed), metrics.draft_tokens_accepted.load(Relaxed));
        eprintln!("round {round}: {accepted} of {drafted} drafts accepted");
        assert!(accepted <= drafted);
        for (i, (p, f)) in plain.iter().zip(&fast).enumerate() {
            assert_eq!(p, f, "round {round}: job {i} differs with the measured draft budget");
        }
    }
}

#[test]
fn a_request_can_turn_speculation_on_or_off() {
    let model = Arc::new(pycode());
    let (prompt, params) = jobs().remove(0);
    let on = SamplingParams { speculate: Some(true), ..params.clone() };
    let off = SamplingParams { speculate: Some(false), ..params };
    let (a, m_on) = run(&model, KvFormat::F16, None, &[(prompt.clone(), on)]);
    let (b, m_off) = run(&model, KvFormat::F16, Some(PromptLookup::default()), &[(prompt, off)]);
    assert_eq!(a, b);
    assert!(m_on.draft_tokens_accepted.load(Relaxed) > 0, "asked for, on an engine without it");
    assert_eq!(m_off.draft_tokens.load(Relaxed), 0, "refused, on an engine with it");
}

/// Log-probabilities (`logprobs.rs`) come one per generated token, before its text, and are the
/// same whether the token was decoded alone or verified in a tree of drafts.
#[test]
fn logprobs_are_reported_per_token_with_or_without_speculation() {
    let model = Arc::new(pycode());
    let (prompt, params) = jobs().remove(0);
    let params = SamplingParams { logprobs: Some(3), max_tokens: 48, ..params };
    let ids = model.tokenizer.encode(&prompt, true).unwrap().ids;
    let mut runs = Vec::new();
    for speculation in [None, Some(PromptLookup::default())] {
        let (tx, rx) = mpsc::channel();
        let config = SchedulerConfig { speculation, draft_budget: DraftBudget::Acceptance, ..SchedulerConfig::default() };
        let (pending, metrics) = (Arc::new(AtomicUsize::new(1)), Arc::new(Metrics::default()));
        let sink = Collect::default();
        tx.send(Command::Submit(common::job("t", &ids, &params), Box::new(sink.clone()), Instant::now())).unwrap();
        drop(tx);
        let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 256 << 20);
        run_engine(&model, pool.clone(), config, common::sessions(&model, &pool), metrics.clone(), pending, rx);
        let events = sink.0.lock().unwrap();
        let lps: Vec<engram_engine::TokenLogprob> =
            events.iter().filter_map(|e| if let Event::Logprob(l) = e { Some(l.clone()) } else { None }).collect();
        let n = events.iter().find_map(|e| if let Event::Finished { completion_tokens, .. } = e { Some(*completion_tokens) } else { None });
        assert_eq!(Some(lps.len()), n, "one entry per generated token");
        for l in &lps {
            assert_eq!(l.top.len(), 3);
            assert_eq!(l.token, l.top[0].0, "greedy: the sampled token is the most likely");
            assert!(l.logprob <= 0.0 && (l.logprob - l.top[0].1).abs() < 1e-6);
        }
        runs.push((lps, metrics.draft_tokens_accepted.load(Relaxed)));
    }
    assert!(runs[1].1 > 0, "drafts were accepted");
    assert_eq!(runs[0].0.len(), runs[1].0.len());
    for (a, b) in runs[0].0.iter().zip(&runs[1].0) {
        assert_eq!(a.token, b.token);
        assert!((a.logprob - b.logprob).abs() < 1e-4, "{a:?} vs {b:?}");
    }
}
