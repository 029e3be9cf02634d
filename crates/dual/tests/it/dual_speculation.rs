//! Prompt lookup over a dual-stream thread's earlier turns: the policy hands
//! the scheduler the view's tokens (`Checkout::lookup`: anchors, then the attended turns), and
//! the drafter searches them with the sequence's own. On the trained pycode-7m, a file sent in
//! an earlier turn and asked for again in the next answers exactly as without speculation
//! (greedy), with drafts accepted.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use crate::common;
use common::Collect;

use engram_dual::DualStream;
use engram_engine::{run_engine, Command, ContextPolicy, DraftBudget, Job, Metrics, PromptLookup, SamplingParams, SchedulerConfig};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

const FILE: &str = "def moving_average(values, window):\n    total = 0.0\n    out = []\n    for i, v in enumerate(values):\n        total += v\n        if i >= window:\n            total -= values[i - window]\n        out.append(total / min(i + 1, window))\n    return out\n";

fn pycode() -> Arc<Model> {
    Arc::new(Model::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf")).unwrap())
}

fn ids(m: &Model, text: &str) -> Vec<u32> {
    m.tokenizer.encode(text, false).unwrap().ids
}

/// Two turns of one thread: the file, then a request to write it again (renamed); returns the
/// second answer and the engine's metrics.
fn conversation(m: &Arc<Model>, speculation: Option<PromptLookup>) -> (String, Arc<Metrics>) {
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 256 << 20);
    let mut dual = DualStream::new(m.clone(), pool.clone(), 1024);
    dual.set_anchors("u", m.tokenizer.encode("# A Python file, then edits to it.\n", true).unwrap().ids);
    let (tx, rx) = mpsc::channel();
    let (pending, metrics) = (Arc::new(AtomicUsize::new(0)), Arc::new(Metrics::default()));
    let engine = {
        let (m, pending, metrics) = (m.clone(), pending.clone(), metrics.clone());
        let config = SchedulerConfig { speculation, draft_budget: DraftBudget::Acceptance, ..SchedulerConfig::default() };
        std::thread::spawn(move || run_engine(&m, pool, config, Box::new(dual) as Box<dyn ContextPolicy>, metrics, pending, rx))
    };
    let turns = [(format!("{FILE}\n"), 2), (format!("\n# the same function, with `total` renamed to `acc`:\n{}", &FILE[..20]), 96)];
    let mut last = String::new();
    for (prompt, max_tokens) in turns {
        let sink = Collect::default();
        let params = SamplingParams { max_tokens, ignore_eos: true, ..Default::default() };
        let job = Job { session: Some("t".into()), ..common::job("u", &ids(m, &prompt), &params) };
        pending.fetch_add(1, Relaxed);
        tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
        while sink.outcome().1.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        last = sink.outcome().0;
    }
    drop(tx);
    engine.join().unwrap();
    (last, metrics)
}

#[test]
fn prompt_lookup_drafts_from_earlier_turns_and_changes_no_token() {
    let m = pycode();
    let (plain, plain_metrics) = conversation(&m, None);
    let (fast, metrics) = conversation(&m, Some(PromptLookup::default()));
    assert_eq!(plain_metrics.draft_tokens.load(Relaxed), 0);
    assert_eq!(fast, plain, "greedy output with speculation = without");
    let (drafted, accepted) = (metrics.draft_tokens.load(Relaxed), metrics.draft_tokens_accepted.load(Relaxed));
    eprintln!(
        "{accepted} of {drafted} drafts accepted; {} steps against {}; {fast:?}",
        metrics.steps.load(Relaxed),
        plain_metrics.steps.load(Relaxed)
    );
    assert!(accepted > 0, "drafts copied from the earlier turn are accepted ({accepted} of {drafted})");
    assert!(metrics.steps.load(Relaxed) < plain_metrics.steps.load(Relaxed), "accepted drafts save steps");
}

#[test]
fn the_checkout_carries_the_views_tokens_for_the_drafter() {
    let m = pycode();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let anchors = m.tokenizer.encode("# A Python file.\n", true).unwrap().ids;
    let mut p = DualStream::new(m.clone(), pool.clone(), 1024);
    p.set_anchors("u", anchors.clone());
    let first = ids(&m, FILE);
    let (answer, _) = common::dual_turn(&m, &pool, &mut p, "u", "t", &first, 3);
    let c = p.admit_tokens("u", Some("t"), &ids(&m, "\n# again:\n"), &m.tokenizer).unwrap();
    // The anchors, then the turn as the ring holds it: the prompt and the answer's fed tokens.
    let want: Vec<u32> = anchors.iter().chain(&first).chain(&answer[..answer.len() - 1]).copied().collect();
    assert_eq!(c.lookup, want);
}
