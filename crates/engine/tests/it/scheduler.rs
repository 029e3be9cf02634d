//! The scheduler without HTTP: jobs submitted to `run_engine` through a plain `EventSink`
//! stream the same text as a cold `LoneSequence` (one sequence through the same step) on the
//! same prompt — alone and batched with other jobs — and end the same way.

use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use crate::common;
use common::Collect;
use engram_engine::{run_engine, Command, FinishReason, Job, LoneSequence, Metrics, SamplingParams, SchedulerConfig};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

#[test]
fn scheduled_jobs_equal_a_lone_sequence_alone_and_batched() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    let layout = KvLayout::of(&model.config);
    let prompts = ["def parse_args(argv):", "The cache keeps whole turns", "x = [i * i for i in range(10)]\nprint("];
    let params = SamplingParams { max_tokens: 20, ignore_eos: true, stop: vec!["\n\n".into()], ..Default::default() };

    // The CLI's path, one prompt at a time.
    let pool = KvPool::new(layout, KvFormat::F32, 64 << 20);
    let want: Vec<(String, FinishReason)> = prompts
        .iter()
        .map(|p| {
            let ids = model.tokenizer.encode(p, true).unwrap().ids;
            let g = LoneSequence::new(&model, &pool).generate(&ids, &params, &mut |_| true).unwrap();
            (g.text, g.finish)
        })
        .collect();

    // The scheduler: all three submitted at once (batched), with a small prefill chunk so
    // prefills interleave with decoding.
    let (tx, rx) = mpsc::channel();
    let config = SchedulerConfig { prefill_chunk: 3, ..SchedulerConfig::default() };
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending) = (model.clone(), pending.clone());
        let pool = KvPool::new(layout, KvFormat::F32, 64 << 20);
        std::thread::spawn(move || {
            run_engine(&model, pool.clone(), config, common::sessions(&model, &pool), Arc::new(Metrics::default()), pending, rx)
        })
    };
    let sinks: Vec<Collect> = prompts.iter().map(|_| Collect::default()).collect();
    for (i, (p, sink)) in prompts.iter().zip(&sinks).enumerate() {
        let ids = model.tokenizer.encode(p, true).unwrap().ids;
        let job = Job { text: Some(p.to_string()), add_special: true, ..common::job(&format!("t{i}"), &ids, &params) };
        pending.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
    }
    drop(tx);
    engine.join().unwrap();
    for ((sink, (text, finish)), p) in sinks.iter().zip(&want).zip(prompts) {
        let (got, got_finish) = sink.outcome();
        assert_eq!(&got, text, "{p:?}: scheduled text differs from the generator's");
        assert_eq!(got_finish, Some(*finish), "{p:?}");
    }
}

#[test]
fn prompts_share_each_steps_prefill_budget() {
    let (_dir, model) = common::tiny();
    let params = SamplingParams { max_tokens: 1, ignore_eos: true, ..Default::default() };
    let jobs: Vec<(String, SamplingParams)> = ["def parse_args(argv):", "The cache keeps whole turns", "x = [i * i for i in range(10)]"]
        .iter()
        .map(|p| (p.to_string(), params.clone()))
        .collect();
    let total: usize = jobs.iter().map(|(p, _)| model.tokenizer.encode(p, true).unwrap().ids.len()).sum();
    // Each job ends at its first token: the engine's step count and every first token.
    let first_tokens = |config| {
        let (outcomes, metrics) = common::run_jobs(&model, KvFormat::F32, config, &jobs);
        (metrics.steps.load(std::sync::atomic::Ordering::Relaxed), outcomes.into_iter().map(|(text, _, _)| text).collect::<Vec<_>>())
    };
    let budget = |prefill_chunk| SchedulerConfig { prefill_chunk, ..SchedulerConfig::default() };
    // Every prompt fits one step's budget: all three go in the first step.
    let (steps, together) = first_tokens(budget(total));
    assert_eq!(steps, 1, "three prompts within the budget take one step");
    // A budget of 7 tokens: the prompts are cut wherever it runs out, every step full but the
    // last, never more than 7 prompt tokens in one.
    let (steps, cut) = first_tokens(budget(7));
    assert_eq!(steps as usize, total.div_ceil(7), "{total} prompt tokens, 7 a step");
    assert_eq!(cut, together, "where the prompts were cut changed a first token");
    // Without packing, one prompt a step.
    let (steps, apart) = first_tokens(SchedulerConfig { pack_prompts: false, ..budget(total) });
    assert_eq!(steps, 3, "one prompt a step");
    assert_eq!(apart, together);
    // And both equal each prompt alone.
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20);
    for ((p, params), got) in jobs.iter().zip(&together) {
        let ids = model.tokenizer.encode(p, true).unwrap().ids;
        let want = LoneSequence::new(&model, &pool).generate(&ids, params, &mut |_| true).unwrap();
        assert_eq!(&want.text, got);
    }
}
