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
use crate::common;
use common::goldens::*;
use common::*;
use engram_tokenizer::*;

/// Compare one vocabulary's groups; the tokenizer of a name is built once per distinct
/// (type, flags) pair, which is what it depends on. Returns the mismatches.
fn check(label: &str, base: &GgufVocab, groups: &serde_json::Value, probe: &str) -> Vec<String> {
    let corpus = corpus();
    let mut built = PreTokenizers::new(base);
    let mut bad = Vec::new();
    let mut n_names = 0;
    for g in groups.as_array().unwrap() {
        for name in g["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()) {
            n_names += 1;
            let (tk, kind) = built.get(name);
            let lines = g["lines"].as_array().unwrap();
            assert_eq!(lines.len(), corpus.len(), "{label}: goldens and corpus differ in length");
            let mut n_bad = 0;
            for (text, want) in corpus.iter().zip(lines) {
                let got = tk.encode(text, false).unwrap().ids;
                if want.is_null() {
                    // llama.cpp aborts on this line (a GGML_ASSERT): Engram must not panic
                    continue;
                }
                if LLAMA_CPP_KNOWN.contains(&(name, text.as_str())) {
                    println!(
                        "{label} {name}: known difference on {text:?} (see LLAMA_CPP_KNOWN): {}",
                        if got == ids(want) { "now equal" } else { "differs" }
                    );
                    continue;
                }
                if got != ids(want) {
                    n_bad += 1;
                    bad.push(format!("{label} {name} ({kind}): {text:?}\n  want {:?}\n  got  {got:?}", ids(want)));
                }
            }
            let got = tk.encode(probe, true).unwrap().ids;
            if got != ids(&g["probe"]) {
                n_bad += 1;
                bad.push(format!("{label} {name} ({kind}): probe with BOS/EOS\n  want {:?}\n  got  {got:?}", ids(&g["probe"])));
            }
            if n_bad > 0 {
                println!("{label} {name} ({kind}): {n_bad} mismatches");
            }
        }
    }
    println!("{label}: {n_names} names, {} tokenizers built, {} mismatches", built.num_built(), bad.len());
    bad
}

#[test]
fn every_llama_cpp_pre_name_is_in_the_goldens() {
    let g = llama_cpp_goldens();
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
    let g = llama_cpp_goldens();
    let probe = g["probe"].as_str().unwrap();
    let gpt2 = pre_base(&src, "gpt-2");
    let gemma = pre_base(&src, "gemma-4");
    let mut bad = check("gpt-2", &gpt2, &g["vocabs"]["gpt-2"], probe);
    bad.extend(check("gemma-4", &gemma, &g["vocabs"]["gemma-4"], probe));
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn smollm2_file_tokenizes_as_llama_cpp() {
    let Some(path) = smollm2() else { return };
    let v = gguf_meta::read_vocab(&path);
    assert_eq!(v.pre.as_deref(), Some("smollm"));
    let g = llama_cpp_goldens();
    let bad = check("smollm2", &v, &g["vocabs"]["smollm2"], g["probe"].as_str().unwrap());
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}

/// Flag variants of whole vocabularies (SentencePiece's `add_space_prefix`, BOS/EOS
/// rules of both kinds) and Gemma 4's vocabulary as its file says (model `gemma4`)
/// tokenize as llama.cpp.
#[test]
fn flag_variants_tokenize_as_llama_cpp() {
    let Some(src) = llama_cpp_src("flag_variants_tokenize_as_llama_cpp") else { return };
    let g = llama_cpp_goldens();
    let probe = g["probe"].as_str().unwrap();
    let corpus = corpus();
    let mut bad = Vec::new();
    for var in g["variants"].as_array().unwrap() {
        let label = variant_label(var);
        let v = variant_vocab(&src, var);
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
