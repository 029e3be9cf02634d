//! The model's top-1 next token at every position of a token sequence, for comparing
//! implementations on the same ids (`scripts/faithfulness.py` runs it beside transformers and
//! llama.cpp): `cargo run --release -p engram-kv --example next_token_argmax -- MODEL IDS.json
//! [CHUNK]`. Reads a JSON array of token ids, prefills them in chunks of CHUNK (default 256)
//! with exact f32 KV and every token's logits, and prints one JSON object:
//! `{"argmax": [...], "top_logit": [...]}`, entry `i` being the prediction after token `i`.

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(model_path), Some(ids_path)) = (args.first(), args.get(1)) else {
        eprintln!("usage: next_token_argmax MODEL IDS.json [CHUNK]");
        std::process::exit(2);
    };
    let chunk: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(256).max(1);
    let model = Model::load(std::path::Path::new(model_path)).unwrap_or_else(|e| fail(&format!("loading {model_path}: {e}")));
    let text = std::fs::read_to_string(ids_path).unwrap_or_else(|e| fail(&format!("reading {ids_path}: {e}")));
    let ids: Vec<u32> = serde_json::from_str(&text).unwrap_or_else(|e| fail(&format!("{ids_path}: not a JSON array of token ids: {e}")));
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 16 << 30);
    let mut kv = SeqKv::new(&pool);
    kv.reserve(ids.len()).unwrap_or_else(|e| fail(&format!("KV for {} tokens: {e}", ids.len())));
    let vocab = model.config.vocab;
    let (mut argmax, mut top) = (Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()));
    for first in (0..ids.len()).step_by(chunk) {
        let tokens = &ids[first..(first + chunk).min(ids.len())];
        let logits = model
            .forward(&mut [SeqStep::new(tokens, first, &mut kv, Logits::All)])
            .unwrap_or_else(|e| fail(&format!("forward at {first}: {e}")))
            .pop()
            .unwrap_or_default();
        for row in logits.chunks_exact(vocab) {
            let (i, v) = row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best });
            argmax.push(i as u32);
            top.push(v);
        }
    }
    println!("{}", serde_json::json!({ "argmax": argmax, "top_logit": top }));
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}
