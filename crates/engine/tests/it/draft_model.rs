//! Speculative decoding with a draft model (`draft_model.rs`): a second model
//! sharing the target's vocabulary drafts greedy chains, the target verifies them in one step.
//! The scheduler streams exactly what it streams without speculation — greedy, seeded
//! sampling and a stop string with a penalty, batched together — with pycode-7m drafting for
//! pycode-long (same tokenizer) and for itself; a draft model with another vocabulary is
//! refused with a clear error; and the walk's acceptance is standard speculative sampling
//! (a draft `d` accepted with probability p(d), the token's distribution exactly p).

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::common;
use engram_engine::{DraftBudget, DraftModel, PromptLookup, Sampler, SamplingParams, SchedulerConfig};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::KvFormat;
use engram_model::Model;

const FUNCTION: &str = "def moving_average(values, window):\n    total = 0.0\n    out = []\n    for i, v in enumerate(values):\n        total += v\n        if i >= window:\n            total -= values[i - window]\n        out.append(total / min(i + 1, window))\n    return out\n";

fn models_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn pycode_7m() -> Arc<Model> {
    Arc::new(Model::load(&models_dir().join("pycode-7m/pycode-7m-q8_0.gguf")).unwrap())
}

/// Per job: streamed text, completion tokens and finish; and the engine's metrics.
use common::Run;

fn run(model: &Arc<Model>, draft: Option<Arc<DraftModel>>, jobs: &[(String, SamplingParams)]) -> Run {
    let config = SchedulerConfig {
        speculation: draft.is_some().then(PromptLookup::default),
        draft_model: draft,
        draft_budget: DraftBudget::Acceptance,
        ..SchedulerConfig::default()
    };
    common::run_jobs(model, KvFormat::F32, config, jobs)
}

fn jobs() -> Vec<(String, SamplingParams)> {
    let copy = format!("{FUNCTION}\n\n# the same function, again:\n{}", &FUNCTION[..20]);
    let greedy = SamplingParams { max_tokens: 64, ..Default::default() };
    let sampled = SamplingParams { max_tokens: 48, temperature: 0.8, top_p: 0.95, seed: 11, ..Default::default() };
    let stopped = SamplingParams { max_tokens: 64, stop: vec!["return".into()], repetition_penalty: 1.1, ..Default::default() };
    vec![(copy.clone(), greedy), (copy.clone(), sampled), (copy, stopped)]
}

#[test]
fn a_draft_model_streams_exactly_what_decoding_one_by_one_does() {
    let small = pycode_7m();
    let long = Arc::new(Model::load(&models_dir().join("pycode-long")).unwrap());
    let jobs = jobs();
    for (name, target) in [("pycode-7m for pycode-long", &long), ("pycode-7m for itself", &small)] {
        let draft = Arc::new(DraftModel::new(target, small.clone(), 4, 64 << 20).unwrap());
        let (plain, _) = run(target, None, &jobs);
        let (fast, metrics) = run(target, Some(draft), &jobs);
        for (i, (p, f)) in plain.iter().zip(&fast).enumerate() {
            assert_eq!(p, f, "{name}: job {i} differs with the draft model");
        }
        let (drafted, accepted) = (metrics.draft_tokens.load(Relaxed), metrics.draft_tokens_accepted.load(Relaxed));
        eprintln!("{name}: {accepted} of {drafted} drafts accepted");
        assert!(accepted > 0 && accepted < drafted, "{name}: some drafts accepted, some rejected ({accepted} of {drafted})");
    }
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let target = pycode_7m();
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let tiny = Arc::new(Model::load(&files.hf_dir).unwrap());
    let e = DraftModel::new(&target, tiny, 4, 1 << 20).unwrap_err();
    assert!(e.contains("vocabulary") || e.contains("tokenizer"), "{e}");
    let e = DraftModel::new(&target, target.clone(), 0, 1 << 20).unwrap_err();
    assert!(e.contains("at least one"), "{e}");
}

/// The walk samples the target's row and accepts the draft when the sample equals it. For a
/// greedy draft (a point mass q = δ_d) that is the standard rule — accept with min(1, p(d)/q(d))
/// = p(d), else draw from the residual max(0, p − q) renormalized = p without d — so the token
/// is distributed exactly as p. Checked empirically over 40,000 seeded draws.
#[test]
fn the_walk_is_speculative_sampling_for_a_greedy_draft() {
    let logits = [1.2f32, 0.3, -0.5, 2.0, 0.0, -1.0];
    let z: f32 = logits.iter().map(|l| l.exp()).sum();
    let p: Vec<f64> = logits.iter().map(|l| (l.exp() / z) as f64).collect();
    let draft = 0u32; // not the argmax: accepted well under half the time
    let n = 40_000;
    let (mut counts, mut accepted) = (vec![0usize; logits.len()], 0usize);
    let mut residual = vec![0usize; logits.len()];
    for seed in 0..n {
        let mut sampler = Sampler::new(SamplingParams { temperature: 1.0, seed: seed as u64, ..Default::default() });
        let t = sampler.sample(&mut logits.clone()) as usize;
        counts[t] += 1;
        if t as u32 == draft {
            accepted += 1;
        } else {
            residual[t] += 1;
        }
    }
    let acc = accepted as f64 / n as f64;
    assert!((acc - p[draft as usize]).abs() < 0.01, "accepted {acc:.4}, p(d) = {:.4}", p[draft as usize]);
    for (i, &c) in counts.iter().enumerate() {
        let f = c as f64 / n as f64;
        assert!((f - p[i]).abs() < 0.01, "token {i}: {f:.4} against p {:.4}", p[i]);
    }
    // On rejection the token follows p without d, renormalized.
    let rejected = n - accepted;
    for (i, &c) in residual.iter().enumerate().filter(|&(i, _)| i as u32 != draft) {
        let want = p[i] / (1.0 - p[draft as usize]);
        let f = c as f64 / rejected as f64;
        assert!((f - want).abs() < 0.012, "residual token {i}: {f:.4} against {want:.4}");
    }
}
