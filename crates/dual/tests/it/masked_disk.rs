//! Masked turns on disk (`DualStream::with_masked_turns`): a turn masked out of attention has its
//! KV written to a file and its RAM blocks returned to the pool, and is read back when a later
//! message wants it. The same conversation (topics coming back, turns evicted and moved while
//! on disk, a new persistent stream moving every turn) answers bit for bit the same with masked
//! turns in RAM and on disk, writes landing before the next turn or racing it, in f32, f16, q8 and
//! q4 KV; the pool holds less with them on disk; a damaged or missing file drops its turn with a
//! warning and the conversation goes on.

use std::path::Path;
use std::sync::Arc;

use crate::common;
use common::{dual_turn, fact, ids, tiny};
use engram_dual::{DualStats, DualStream, Relevance};
use engram_embed::{Embeddings, TextEncoder};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

/// Topic words: a text's embedding counts its words of each topic (a turn is relevant to a
/// message of the same topic and to nothing else).
pub(crate) const TOPICS: [&[&str]; 3] = [&["apple", "pear", "fig"], &["red", "blue", "green"], &["cat", "dog", "bird"]];

/// An encoder by topic words (see [`TOPICS`]), deterministic.
#[derive(Debug)]
pub(crate) struct Topics;

impl TextEncoder for Topics {
    fn id(&self) -> &str {
        "topics"
    }
    fn dim(&self) -> usize {
        TOPICS.len() + 1
    }
    fn describe(&self) -> String {
        "topic words (test)".into()
    }
    fn encode(&self, texts: &[String]) -> engram_embed::Result<Embeddings> {
        let vectors = texts
            .iter()
            .map(|t| {
                let mut v = vec![0f32; TOPICS.len() + 1];
                v[TOPICS.len()] = 0.01;
                for w in t.split(|c: char| !c.is_alphanumeric()) {
                    if let Some(i) = TOPICS.iter().position(|ws| ws.contains(&w)) {
                        v[i] += 1.0;
                    }
                }
                v
            })
            .collect();
        Ok(Embeddings { vectors, num_tokens: texts.iter().map(|t| t.split_whitespace().count()).collect() })
    }
    fn ranks_relevance(&self) -> bool {
        true
    }
}

/// The conversation: topic `i % 3` with a twist, coming back every third turn or so.
pub(crate) fn message(i: usize) -> String {
    let topic = [0, 1, 0, 2, 1, 2, 0, 0, 1, 2][i % 10];
    let w = TOPICS[topic];
    format!(" the {} and the {} with {} number {i}", w[i % 3], w[(i + 1) % 3], w[(i + 2) % 3])
}

struct Run {
    /// Each turn's answer and the logits after its prompt (bits).
    turns: Vec<(Vec<u32>, Vec<u32>)>,
    /// The pool's bytes in use after each turn.
    used: Vec<usize>,
    stats: DualStats,
}

/// `n` turns of one thread; `disk`: masked turns to this directory, `flush`: each write waited
/// for before the next turn (else writes race the turns); `damage` runs on the directory once,
/// after turn `n / 2`.
fn run(m: &Arc<Model>, format: KvFormat, n: usize, disk: Option<&Path>, flush: bool, damage: &dyn Fn(&Path)) -> Run {
    let pool = KvPool::new(KvLayout::of(&m.config), format, 64 << 20);
    let mut p =
        DualStream::new(m.clone(), pool.clone(), 120).with_relevance(Relevance { encoder: Arc::new(Topics), threshold: 0.5, keep_last: 1 });
    if let Some(d) = disk {
        p = p.with_masked_turns(d).unwrap();
    }
    p.set_anchors("u", ids(m, "A system prompt for the test."));
    let mut out = Run { turns: Vec::new(), used: Vec::new(), stats: DualStats::default() };
    for i in 0..n {
        if i == n / 3 {
            // A new persistent stream: every turn (those on disk too) moves.
            p.set_facts("u", vec![fact(m, 1, "the user likes tea")]);
        }
        let (answer, logits) = dual_turn(m, &pool, &mut p, "u", "t", &ids(m, &message(i)), 3);
        out.turns.push((answer, logits.iter().map(|x| x.to_bits()).collect()));
        if flush {
            p.flush_masked();
        }
        out.used.push(pool.used());
        if i == n / 2 {
            if let Some(d) = disk {
                p.flush_masked();
                damage(d);
            }
        }
    }
    out.stats = p.dual_stats();
    out
}

fn no_damage(_: &Path) {}

#[test]
fn masked_turns_on_disk_answer_bit_for_bit_as_in_ram() {
    let (_d, m) = tiny();
    for format in [KvFormat::F32, KvFormat::F16, KvFormat::Q8, KvFormat::Q4] {
        let ram = run(&m, format, 30, None, false, &no_damage);
        assert!(
            ram.stats.turns_masked > 20 && ram.stats.turns_evicted > 0,
            "{format:?}: the conversation masks and evicts: {:?}",
            ram.stats
        );
        for flush in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let disk = run(&m, format, 30, Some(dir.path()), flush, &no_damage);
            for (i, (a, b)) in ram.turns.iter().zip(&disk.turns).enumerate() {
                assert_eq!(a.0, b.0, "{format:?} flush {flush}: turn {i}'s answer");
                assert!(a.1 == b.1, "{format:?} flush {flush}: turn {i}'s logits differ");
            }
            let s = disk.stats;
            assert_eq!(s.masked_restore_failures, 0);
            // Racing the turns, how many writes land in time depends on the machine's load.
            if flush {
                assert!(s.turns_offloaded > 5 && s.masked_turns_restored > 3, "{format:?}: {s:?}");
                // Every masked turn's blocks are back in the pool once written.
                let (r, d) = (ram.used.iter().sum::<usize>(), disk.used.iter().sum::<usize>());
                assert!(d < r, "{format:?}: the pool held {d} bytes summed over the turns on disk, {r} in RAM");
            }
        }
    }
}

#[test]
fn a_damaged_or_missing_masked_file_drops_its_turn_and_the_thread_goes_on() {
    let (_d, m) = tiny();
    let damage = |d: &Path| {
        let files: Vec<_> = std::fs::read_dir(d).unwrap().flatten().map(|e| e.path()).collect();
        assert!(files.len() >= 2, "masked turns were written: {files:?}");
        for (i, f) in files.iter().enumerate() {
            if i % 2 == 0 {
                std::fs::remove_file(f).unwrap();
            } else {
                // A byte flipped in the KV: the checksum catches it.
                let mut b = std::fs::read(f).unwrap();
                let at = b.len() - 7;
                b[at] ^= 0x5a;
                std::fs::write(f, b).unwrap();
            }
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let r = run(&m, KvFormat::F32, 30, Some(dir.path()), true, &damage);
    assert!(r.stats.masked_restore_failures >= 2, "{:?}", r.stats);
    assert_eq!(r.turns.len(), 30, "every turn answered");
}
