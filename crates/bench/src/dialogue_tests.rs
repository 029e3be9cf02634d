//! `bench dialogue` on the `tiny` fixture with a word-topic encoder: the committed data parse,
//! the ring holding every turn answers as the full history, masked turns on disk answer exactly
//! as in RAM and leave less KV in the pool, and the evicted ring forgets.

use std::sync::Arc;

use engram_embed::{Embeddings, TextEncoder};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::KvFormat;
use engram_model::Model;

use super::{measure, parse, Options, DIALOGUES};

/// Hashes each word into one of 16 buckets: texts sharing words are similar.
#[derive(Debug)]
struct Words;

impl TextEncoder for Words {
    fn id(&self) -> &str {
        "words"
    }
    fn dim(&self) -> usize {
        16
    }
    fn describe(&self) -> String {
        "word buckets (test)".into()
    }
    fn encode(&self, texts: &[String]) -> engram_embed::Result<Embeddings> {
        let vectors = texts
            .iter()
            .map(|t| {
                let mut v = vec![0f32; 16];
                for w in t.split(|c: char| !c.is_alphanumeric()).filter(|w| w.len() > 3) {
                    let h = w.to_lowercase().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
                    v[(h % 16) as usize] += 1.0;
                }
                v
            })
            .collect();
        Ok(Embeddings { vectors, num_tokens: texts.iter().map(|t| t.split_whitespace().count()).collect() })
    }
}

#[test]
fn the_rows_on_the_tiny_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    let all = parse(DIALOGUES).unwrap();
    assert!(all.len() >= 3 && all.iter().all(|c| (20..=40).contains(&c.turns.len()) && c.probes.iter().all(|p| p.2 < c.turns.len())));
    let o =
        Options { threshold: 0.5, keep_last: 1, ring_tokens: 1 << 14, evicted_ring_tokens: 200, answer_tokens: 6, format: KvFormat::F32 };
    let rows = measure(&model, Some(Arc::new(Words)), &all[..1], &o).unwrap();
    let row = |name: &str| rows.iter().find(|r| r.name == name).unwrap();
    let (full, ring, masks, disk, evicted) = (row("full"), row("ring"), row("masks"), row("masks-disk"), row("evicted"));
    assert_eq!(full.exact, full.probes);
    assert!(ring.agree * 10 >= ring.tokens * 9, "the ring with every turn agrees with the full history: {}/{}", ring.agree, ring.tokens);
    assert_eq!(masks.answers, disk.answers, "masked turns on disk answer as in RAM");
    assert!(masks.stats.turns_masked > 0 && disk.stats.turns_offloaded > 0 && disk.stats.masked_turns_restored > 0, "{:?}", disk.stats);
    assert!(disk.kv_bytes < masks.kv_bytes, "KV after the history: {} on disk, {} in RAM", disk.kv_bytes, masks.kv_bytes);
    assert!(evicted.stats.turns_evicted > 0);
}
