//! Parity with llama.cpp's own tokenizer goldens: every `models/ggml-vocab-*.gguf` of
//! llama.cpp's source tree that comes with `.inp`/`.out` files (the format of llama.cpp's
//! `tests/test-tokenizer-0.cpp`: inputs separated by `\n__ggml_vocab_test__\n`, one line
//! of ids per input, tokenized without BOS/EOS and without parsing special tokens) must
//! tokenize token for token as those files say. The files are not part of this
//! repository: the test reads them from `ENGRAM_LLAMA_CPP_SRC`.
use crate::common;
use common::*;
use engram_tokenizer::*;

/// Vocabularies of a kind Engram does not build (WordPiece) — the test checks they are
/// refused with an error naming the model, not tokenized wrongly.
const NOT_BUILT: &[&str] = &["bert-bge"];

#[test]
fn ggml_vocab_goldens() {
    let Some(src) = llama_cpp_src("ggml_vocab_goldens") else { return };
    let mut names: Vec<String> = std::fs::read_dir(src.join("models"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| Some(f.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf.out")?.to_string()))
        .collect();
    names.sort();
    assert!(names.len() >= 10, "only {names:?} in {}", src.display());
    let mut failures = Vec::new();
    for name in &names {
        let base = src.join("models").join(format!("ggml-vocab-{name}.gguf"));
        let vocab = gguf_meta::read_vocab(&base);
        let tk = match Tokenizer::from_gguf_vocab(&vocab) {
            Ok(t) => t,
            Err(e) if NOT_BUILT.contains(&name.as_str()) => {
                assert!(e.to_string().contains(&format!("{:?}", vocab.model)), "{name}: {e}");
                println!("{name}: not built ({e})");
                continue;
            }
            Err(e) => panic!("{name}: {e}"),
        };
        let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
        let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
        // As test-tokenizer-0.cpp reads it: a separator at the very end opens no input.
        let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        if inputs.last() == Some(&"") {
            inputs.pop();
        }
        let outputs: Vec<&str> = out.lines().collect();
        assert_eq!(inputs.len(), outputs.len(), "{name}");
        let mut bad = 0;
        for (text, want) in inputs.iter().zip(&outputs) {
            let want: Vec<u32> = want.split_whitespace().map(|t| t.parse().unwrap()).collect();
            let got = tk.encode(text, false).unwrap().ids;
            if got != want {
                bad += 1;
                failures.push(format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
        println!("{name} (pre {:?}): {}/{} inputs match", vocab.pre, inputs.len() - bad, inputs.len());
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}
