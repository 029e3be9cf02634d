//! The `tiny` fixture against Hugging Face transformers' outputs for the very
//! same files, recorded in `tests/golden/tiny.json` by
//! `scripts/golden_logits.py`: tokenizer ids, f32 logits, greedy decoding and
//! the chat template.
//!
//! If the fixture generator changes (weights, tokenizer), the first check
//! fails and says how to regenerate the golden file.

use crate::common;
use common::*;
use engram_model::Model;
use engram_tokenizer::ChatMessage;
use serde_json::Value;

const GOLDEN_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tiny.json");
const REGENERATE: &str = "cargo build --release -p engram-cli && python3 scripts/golden_logits.py \
     (needs torch + transformers; see scripts/README.md)";

/// Tolerance on the last-position logits: max |ours - golden| / max |golden|.
pub(crate) const LOGIT_TOL: f32 = 1e-4;

fn golden() -> Value {
    let text = std::fs::read_to_string(GOLDEN_PATH).unwrap_or_else(|e| panic!("reading {GOLDEN_PATH}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {GOLDEN_PATH}: {e}"))
}

pub(crate) fn fnv1a64(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

pub(crate) fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("integer") as u32).collect()
}

pub(crate) fn f32s(v: &Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

/// Panics (with the way to regenerate) unless the fixture the test generated
/// is the one the golden file was computed from.
fn check_fixture(g: &Value) {
    let problems = fixture_differences(g, &tiny_hf());
    assert!(
        problems.is_empty(),
        "the tiny fixture no longer matches {GOLDEN_PATH} (was the fixture generator changed?):\n  {}\n\
         If the change is intended, regenerate the golden file: {REGENERATE}",
        problems.join("\n  ")
    );
}

/// How the HF folder `hf` differs from the fixture recorded in golden file `g` (sizes,
/// hashes and edge values of `model.safetensors` and `tokenizer.json`); empty if it does not.
pub(crate) fn fixture_differences(g: &Value, hf: &std::path::Path) -> Vec<String> {
    let fx = &g["fixture"];
    let mut problems = Vec::new();
    for name in ["model.safetensors", "tokenizer.json"] {
        let bytes = std::fs::read(hf.join(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"));
        let want = &fx[name];
        if want["size"].as_u64() != Some(bytes.len() as u64) {
            problems.push(format!("{name}: size {} != golden {}", bytes.len(), want["size"]));
        }
        let h = fnv1a64(&bytes);
        if want["fnv1a64"].as_str() != Some(h.as_str()) {
            problems.push(format!("{name}: fnv1a64 {h} != golden {}", want["fnv1a64"]));
        }
        if name == "model.safetensors" {
            let off = want["data_offset"].as_u64().expect("data_offset") as usize;
            let n = want["first_bits"].as_array().map_or(0, |a| a.len());
            let bits = |b: &[u8]| -> Vec<u32> { b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect() };
            if bytes.len() >= off + 4 * n {
                if bits(&bytes[off..off + 4 * n]) != u32s(&want["first_bits"]) {
                    problems.push(format!("{name}: first {n} f32 values differ"));
                }
                if bits(&bytes[bytes.len() - 4 * n..]) != u32s(&want["last_bits"]) {
                    problems.push(format!("{name}: last {n} f32 values differ"));
                }
            } else {
                problems.push(format!("{name}: shorter than the golden data offset"));
            }
        }
    }
    problems
}

/// Loads the golden data after checking the fixture, and the tiny HF model.
fn setup() -> (Value, Model) {
    let g = golden();
    check_fixture(&g);
    let model = Model::load(&tiny_hf()).expect("load tiny HF folder");
    (g, model)
}

fn prompt_ids(g: &Value) -> Vec<u32> {
    u32s(&g["prompt_ids"])
}

#[test]
fn fixture_matches_golden_file() {
    let g = golden();
    check_fixture(&g);
    assert_eq!(g["prompt"].as_str(), Some(PROMPT), "golden prompt differs from common::PROMPT");
}

#[test]
fn tokenizer_ids_match_transformers() {
    let (g, model) = setup();
    let ours = model.tokenizer.encode(g["prompt"].as_str().unwrap(), true).unwrap().ids;
    assert_eq!(ours, prompt_ids(&g), "token ids differ from transformers' (add_special_tokens=True)");
}

#[test]
fn last_position_logits_match_transformers() {
    let (g, model) = setup();
    let ids = prompt_ids(&g);
    let vocab = model.config.vocab;
    let all = all_logits(&model, &ids);
    assert_eq!(all.len(), ids.len() * vocab);
    let last = &all[(ids.len() - 1) * vocab..];
    let want = f32s(&g["last_logits"]);
    assert_eq!(last.len(), want.len(), "vocab size differs from the golden file");
    let err = rel_err(last, &want);
    eprintln!("tiny f32 vs transformers: max relative last-position logit error {err:.3e}");
    assert!(err < LOGIT_TOL, "last-position logits differ from transformers: relative error {err:.3e} >= {LOGIT_TOL:e}");
}

#[test]
fn argmax_at_every_prompt_position_matches_transformers() {
    let (g, model) = setup();
    let ids = prompt_ids(&g);
    let vocab = model.config.vocab;
    let all = all_logits(&model, &ids);
    let want = u32s(&g["argmax_per_position"]);
    assert_eq!(want.len(), ids.len());
    let mut bad = Vec::new();
    for (pos, &w) in want.iter().enumerate() {
        let row = &all[pos * vocab..(pos + 1) * vocab];
        let ours = argmax(row);
        if ours != w {
            // Accept only a true near-tie: transformers' pick is within the
            // logit tolerance of our maximum.
            let scale = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let gap = row[ours as usize] - row[w as usize];
            if gap > LOGIT_TOL * scale {
                bad.push(format!("position {pos}: ours {ours}, transformers {w} (our gap {gap:.3e})"));
            }
        }
    }
    assert!(bad.is_empty(), "argmax differs from transformers:\n  {}", bad.join("\n  "));
}

#[test]
fn greedy_continuation_matches_transformers() {
    let (g, model) = setup();
    let ids = prompt_ids(&g);
    let want = u32s(&g["greedy_ids"]);
    let ours = greedy(&model, &ids, want.len());
    let agree = ours.iter().zip(&want).take_while(|(a, b)| a == b).count();
    assert_eq!(ours, want, "greedy continuation diverges from transformers after {agree} tokens");
}

#[test]
fn chat_template_renders_like_transformers() {
    let (g, model) = setup();
    let msgs: Vec<ChatMessage> = g["chat_messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let tk = &model.tokenizer;
    let template = tk.chat_template().expect("tiny fixture has a chat template");
    let rendered = template.render(&msgs, true, tk.bos_token().unwrap_or(""), tk.eos_token().unwrap_or("")).unwrap();
    assert_eq!(rendered, g["chat_rendered"].as_str().unwrap(), "chat template renders differently from transformers");
}
