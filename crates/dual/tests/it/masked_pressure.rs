//! RAM pressure offloads masked turns (`DualStream::with_masked_turns_under_pressure`): masked
//! turns stay in RAM until the engine asks the policy for room (`make_room`); then the masked-out
//! turns of idle threads are written to disk and their blocks go back to the pool. Through the
//! scheduler, four threads on a KV pool too small for their rings answer token for token as on a
//! big pool: requests that only fit after an offload are admitted, and later requests whose
//! masks keep the offloaded turns read them back exactly.

use crate::common;
use crate::masked_disk::{message, Topics};
use common::{ids, tiny, Collect};

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use engram_dual::{DualStats, DualStream, Relevance};
use engram_engine::{run_engine, Command, ContextPolicy, Job, Metrics, PolicyLayer, Retired};
use engram_engine::{FinishReason, SamplingParams, SchedulerConfig};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

const THREADS: usize = 4;
const ROUNDS: usize = 8;

/// The policy as the engine runs it, recording each retired turn's tokens, the pool's peak
/// after a turn and the policy's counters.
struct Probe {
    inner: DualStream,
    pool: KvPool,
    seen: Arc<Mutex<Seen>>,
}

#[derive(Default)]
struct Seen {
    turns: Vec<(String, Vec<u32>)>,
    peak: usize,
    stats: DualStats,
    make_room_calls: usize,
}

impl PolicyLayer for Probe {
    common::inner_layer!();
    fn retire(&mut self, r: Retired) {
        let mut seen = self.seen.lock().unwrap();
        seen.turns.push((r.session_id.clone(), r.tokens.clone()));
        self.inner.retire(r);
        seen.peak = seen.peak.max(self.pool.used());
        seen.stats = self.inner.dual_stats();
    }
    fn make_room(&mut self, bytes: usize) -> bool {
        let fits = self.inner.make_room(bytes);
        let mut seen = self.seen.lock().unwrap();
        seen.make_room_calls += 1;
        seen.stats = self.inner.dual_stats();
        fits
    }
}

/// The conversation through the scheduler on a pool of `budget` bytes, masked turns offloaded
/// under pressure to `dir`: each thread's turns in order, the threads taking turns.
fn converse(m: &Arc<Model>, budget: usize, dir: &Path) -> Seen {
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, budget);
    let relevance = Relevance { encoder: Arc::new(Topics), threshold: 0.5, keep_last: 1 };
    let mut policy = DualStream::new(m.clone(), pool.clone(), 160).with_relevance(relevance).with_masked_turns_under_pressure(dir).unwrap();
    policy.set_anchors("u", ids(m, "A system prompt for the test."));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let probe = Probe { inner: policy, pool: pool.clone(), seen: seen.clone() };
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending, pool) = (m.clone(), pending.clone(), pool.clone());
        let metrics = Arc::new(Metrics::default());
        std::thread::spawn(move || run_engine(&model, pool, SchedulerConfig::default(), Box::new(probe), metrics, pending, rx))
    };
    let params = SamplingParams { max_tokens: 3, ignore_eos: true, ..Default::default() };
    for i in 0..ROUNDS * THREADS {
        let (thread, turn) = (i % THREADS, i / THREADS);
        // Each thread its own rotation of topics, coming back every few turns.
        let prompt = ids(m, &message(turn * 3 + thread));
        let sink = Collect::default();
        let job = Job { session: Some(format!("t{thread}")), ..common::job("u", &prompt, &params) };
        pending.fetch_add(1, SeqCst);
        tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
        let t0 = Instant::now();
        while sink.outcome().1.is_none() {
            let failed =
                sink.0
                    .lock()
                    .unwrap()
                    .iter()
                    .find_map(|e| if let engram_engine::Event::Failed(e) = e { Some(e.to_string()) } else { None });
            assert!(failed.is_none(), "turn {i} failed on a {budget}-byte pool: {failed:?}");
            assert!(t0.elapsed() < Duration::from_secs(60), "turn {i} ends");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sink.outcome().1, Some(FinishReason::Length));
    }
    drop(tx);
    engine.join().unwrap();
    Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap()
}

#[test]
fn under_ram_pressure_masked_turns_of_idle_threads_go_to_disk_and_answers_do_not_change() {
    let (_d, m) = tiny();
    let big_dir = tempfile::tempdir().unwrap();
    let big = converse(&m, 64 << 20, big_dir.path());
    let s = big.stats;
    assert!(s.turns_masked > 20, "the conversation masks turns: {s:?}");
    assert_eq!(s.turns_offloaded, 0, "no pressure, nothing written: {s:?}");
    assert_eq!(std::fs::read_dir(big_dir.path()).unwrap().count(), 0);

    // A pool of two thirds of what the rings took at their peak: the rings alone overflow it.
    let budget = big.peak * 2 / 3;
    let dir = tempfile::tempdir().unwrap();
    let small = converse(&m, budget, dir.path());
    let s = small.stats;
    assert_eq!(small.turns.len(), big.turns.len());
    for (i, (a, b)) in big.turns.iter().zip(&small.turns).enumerate() {
        assert_eq!(a, b, "turn {i}: the same tokens on a {budget}-byte pool as on a big one");
    }
    assert!(small.make_room_calls > 0 && s.turns_offloaded_for_ram > 0, "the engine asked for room: {s:?}");
    assert_eq!(s.turns_offloaded, s.turns_offloaded_for_ram, "only pressure wrote turns: {s:?}");
    assert!(s.ram_bytes_offloaded > 0);
    assert!(s.masked_turns_restored > 0, "later masks kept offloaded turns, read back: {s:?}");
    assert_eq!(s.masked_restore_failures, 0, "{s:?}");
}

/// A code-flavoured message of topic `i % 3`'s words (about 40 tokens on pycode-7m).
fn code_message(i: usize) -> String {
    let w = crate::masked_disk::TOPICS[[0, 1, 2, 0, 2, 1][i % 6]];
    format!(
        "# {a} and {b} with {c}, case {i}\ndef {a}_{i}(items):\n    return [x for x in items if x.{b} == '{c}']\n",
        a = w[i % 3],
        b = w[(i + 1) % 3],
        c = w[(i + 2) % 3]
    )
}

/// RAM saved by offloading masked turns under pressure on a multi-topic conversation, and the
/// read-back time per turn, on pycode-7m (`models/pycode-7m`):
/// `cargo test --release -p engram-dual --test it masked_pressure::measure -- --ignored --nocapture`.
/// Also checks that the answers after the offload equal those of the same policy left in RAM.
#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn measure_ram_saved_and_read_back_time_on_pycode() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf");
    let m = Arc::new(Model::load(&path).unwrap());
    const HISTORY: usize = 36;
    const ANSWER: usize = 24;
    println!("| KV format | turns | turns offloaded | KV MiB in RAM, masked turns in RAM | after make_room | saved | offload ms | turns read back | ms per turn read back | KiB per turn |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for format in [KvFormat::F16, KvFormat::F32] {
        let mut answers = Vec::new();
        let mut row = String::new();
        for pressure in [false, true] {
            let pool = KvPool::new(KvLayout::of(&m.config), format, 1 << 30);
            let dir = tempfile::tempdir().unwrap();
            let relevance = Relevance { encoder: Arc::new(Topics), threshold: 0.5, keep_last: 1 };
            let mut p = DualStream::new(m.clone(), pool.clone(), 8192)
                .with_relevance(relevance)
                .with_masked_turns_under_pressure(dir.path())
                .unwrap();
            p.set_anchors("u", ids(&m, "# Python helpers, one per message.\n"));
            for i in 0..HISTORY {
                common::dual_turn(&m, &pool, &mut p, "u", "t", &ids(&m, &code_message(i)), ANSWER);
            }
            let before = pool.used();
            let t0 = Instant::now();
            if pressure {
                // Ask for more than the pool holds: every masked-out turn of the idle thread goes.
                assert!(!p.make_room(pool.budget()));
            }
            let offload_ms = t0.elapsed().as_secs_f64() * 1e3;
            let after = pool.used();
            // One message per topic: each reads back the turns of its topic.
            let mut out = Vec::new();
            for i in HISTORY..HISTORY + 3 {
                out.push(common::dual_turn(&m, &pool, &mut p, "u", "t", &ids(&m, &code_message(i)), ANSWER).0);
            }
            answers.push(out);
            let s = p.dual_stats();
            if pressure {
                assert!(s.turns_offloaded_for_ram > 0 && s.masked_turns_restored > 0, "{s:?}");
                assert_eq!(s.masked_restore_failures, 0);
                let mib = |b: usize| b as f64 / (1 << 20) as f64;
                let n = s.masked_turns_restored.max(1) as f64;
                row = format!(
                    "| {format:?} | {HISTORY} | {} | {:.2} | {:.2} | {:.0}% | {offload_ms:.1} | {} | {:.3} | {:.0} |",
                    s.turns_offloaded_for_ram,
                    mib(before),
                    mib(after),
                    100.0 * (before - after) as f64 / before as f64,
                    s.masked_turns_restored,
                    s.masked_restore_us as f64 / 1e3 / n,
                    s.masked_bytes_restored as f64 / 1024.0 / n,
                );
            }
        }
        assert_eq!(answers[0], answers[1], "{format:?}: the answers after the offload equal those in RAM");
        println!("{row}");
    }
}
