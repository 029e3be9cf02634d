//! `engram serve --context dual --masked-turns disk`: with relevance masks, a turn masked out of
//! attention keeps its KV in a file under the cache directory (`kv/dual/masked`) and is read
//! back when a later message wants it; the same conversation answers exactly as with masked
//! turns in RAM, and `/metrics` counts the turns written and read back.

use std::sync::Arc;

use crate::common;
use common::*;
use engram_embed::{Embeddings, TextEncoder};
use engram_server::{ContextMode, MaskedTurns};
use serde_json::json;

/// Topic words: a text's embedding counts its words of each topic (other words, the
/// template's included, count for nothing: texts of different topics are dissimilar).
const TOPICS: [&[&str]; 3] = [&["apple", "pear", "fig"], &["red", "blue", "green"], &["cat", "dog", "bird"]];

#[derive(Debug)]
struct Topics;

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
}

const TURNS: [&str; 8] =
    ["apple and pear", "red and blue", "cat and dog", "the fig and the apple", "green or red", "a bird and a cat", "pear pie", "blue sky"];

/// The conversation on a persisting server with masked turns in `masked`: answers and metrics.
fn run(masked: MaskedTurns) -> (Vec<String>, f64, f64, usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = persisting(dir.path(), engram_kv::EvictionPolicy::Lru);
    config.context = ContextMode::Dual { ring_tokens: 4096, threshold: 0.5, keep_last: 1, persistent_cap: 512, summary_target: 300 };
    config.embedder = Some(Arc::new(Topics));
    config.masked_turns = masked;
    let addr = start(64 << 20, config);
    let mut answers = Vec::new();
    for t in TURNS {
        // The masked turns' writes of the last turn land first (a write still in flight when
        // the next mask keeps its turn again is dropped, and on a loaded machine a write's
        // fsync can outlast a whole turn of the tiny model: then nothing would reach disk).
        std::thread::sleep(std::time::Duration::from_millis(150));
        let messages = json!([{"role": "system", "content": "You answer in one line."}, {"role": "user", "content": t}]);
        let r = chat(addr, &messages, json!({"user": "ann", "thread_id": "t", "max_tokens": 4}));
        answers.push(content(&r));
    }
    let files = std::fs::read_dir(dir.path().join("kv/dual/masked")).map_or(0, |d| d.count());
    (answers, metric(addr, "engram_masked_turns_offloaded_total "), metric(addr, "engram_masked_turns_restored_total "), files)
}

#[test]
fn masked_turns_on_disk_answer_as_in_ram_and_are_counted() {
    let (ram, ram_offloaded, _, ram_files) = run(MaskedTurns::Ram);
    let (disk, offloaded, restored, _) = run(MaskedTurns::Disk);
    assert_eq!(ram, disk);
    assert_eq!((ram_offloaded, ram_files), (0.0, 0), "masked turns stay in RAM by default");
    assert!(offloaded > 0.0 && restored > 0.0, "written {offloaded}, read back {restored}");
}
