//! GGUF vocabularies: byte-level BPE equals the tokenizer.json path; SentencePiece
//! merges/byte fallback; token types; errors.
use crate::common;
use common::*;
use engram_tokenizer::*;

/// A GgufVocab carrying the fixture tokenizer (what the fixture GGUF writer stores).
fn fixture_vocab(pre: &str) -> GgufVocab {
    let j: serde_json::Value = serde_json::from_str(fixture_json()).unwrap();
    let tk = fixture();
    let n = tk.get_vocab_size(true) as u32;
    let tokens: Vec<String> = (0..n).map(|i| tk.id_to_token(i).unwrap()).collect();
    let merges = gguf_merges(&j).expect("fixture merges");
    let token_types = (0..n).map(|i| if i < 4 { 3 } else { 1 }).collect();
    GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        merges: Some(merges),
        token_types: Some(token_types),
        bos_id: Some(0),
        eos_id: Some(1),
        eot_id: Some(3),
        add_bos: Some(true),
        chat_template: Some(CHATML.into()),
        ..Default::default()
    }
}

#[test]
fn gpt2_vocab_matches_tokenizer_json() {
    let from_json = Tokenizer::from_tokenizers(fixture().clone()).unwrap();
    let from_gguf = Tokenizer::from_gguf_vocab(&fixture_vocab("gpt-2")).unwrap();
    assert_eq!(from_gguf.vocab_size(), from_json.vocab_size());
    let corpus_bits = [&FIXTURE_CORPUS[1000..3000], &FIXTURE_CORPUS[FIXTURE_CORPUS.len() - 3000..]];
    for s in SAMPLES.iter().copied().chain(corpus_bits) {
        for add in [true, false] {
            let a = from_json.encode(s, add).unwrap();
            let b = from_gguf.encode(s, add).unwrap();
            assert_eq!(a.ids, b.ids, "{s:?} add={add}");
            assert_eq!(a.offsets, b.offsets, "{s:?}");
            for skip in [true, false] {
                assert_eq!(from_json.decode(&a.ids, skip).unwrap(), from_gguf.decode(&b.ids, skip).unwrap());
            }
        }
    }
    assert_eq!(from_gguf.bos_id(), Some(0));
    assert_eq!(from_gguf.eos_token(), Some("</s>"));
    assert!(from_gguf.is_stop_token(1) && from_gguf.is_stop_token(3) && !from_gguf.is_stop_token(2));
    assert!(from_gguf.is_special_id(2));
    let t = from_gguf.chat_template().unwrap();
    assert!(t.render(&[ChatMessage::new("user", "x")], true, "<s>", "</s>").unwrap().ends_with("assistant\n"));
}

#[test]
fn gpt2_add_bos_defaults_off() {
    let mut v = fixture_vocab("default");
    v.add_bos = None;
    let tk = Tokenizer::from_gguf_vocab(&v).unwrap();
    let e = tk.encode("Hello", true).unwrap();
    assert_ne!(e.ids[0], 0);
    v.add_eos = Some(true);
    let tk = Tokenizer::from_gguf_vocab(&v).unwrap();
    let e = tk.encode("Hello", true).unwrap();
    assert_eq!(*e.ids.last().unwrap(), 1);
}

#[test]
fn llama3_and_qwen2_pretokenizers_roundtrip() {
    for pre in ["llama-bpe", "llama3", "qwen2"] {
        let tk = Tokenizer::from_gguf_vocab(&fixture_vocab(pre)).unwrap();
        for s in SAMPLES {
            let e = tk.encode(s, false).unwrap();
            assert_eq!(tk.decode(&e.ids, false).unwrap(), *s, "{pre}");
        }
        // Llama 3 splits digits in groups of three, Qwen2 one by one
        let digits = tk.encode("1234567", false).unwrap().ids.len();
        if pre == "qwen2" {
            assert_eq!(digits, 7);
        } else {
            assert!(digits >= 3);
        }
        // "'s" contractions and newlines are split as in the HF regexes
        let e = tk.encode("it's\n\nok", false).unwrap();
        assert!(e.ids.len() >= 4, "{pre}");
    }
}

#[test]
fn sentencepiece_vocab_encodes_like_llama() {
    let tk = Tokenizer::from_gguf_vocab(&spm_vocab()).unwrap();
    let e = tk.encode("hello world", true).unwrap();
    let toks: Vec<String> = e.ids.iter().map(|&i| tk.id_to_token(i).unwrap()).collect();
    assert_eq!(toks, ["<s>", "▁hello", "▁world"]);
    assert_eq!(tk.decode(&e.ids, true).unwrap(), "hello world");
    assert_eq!(tk.decode(&e.ids, false).unwrap(), "<s> hello world");

    // byte fallback for pieces outside the vocabulary, unk never needed
    let e = tk.encode("hi é日", false).unwrap();
    let toks: Vec<String> = e.ids.iter().map(|&i| tk.id_to_token(i).unwrap()).collect();
    assert_eq!(toks, ["▁h", "<0x69>", "▁", "é", "<0xE6>", "<0x97>", "<0xA5>"]);
    assert_eq!(tk.decode(&e.ids, false).unwrap(), "hi é日");

    // merges ranked by score: "▁cat" via "▁c"+"at" (both ranked above "ca"/"▁ca")
    let e = tk.encode("cat", false).unwrap();
    assert_eq!(e.ids, vec![tk.token_to_id("▁cat").unwrap()]);
    // runs of spaces
    let e = tk.encode("a    ", false).unwrap();
    let toks: Vec<String> = e.ids.iter().map(|&i| tk.id_to_token(i).unwrap()).collect();
    assert_eq!(toks, ["▁", "a", "▁▁▁▁"]);
    assert_eq!(tk.decode(&e.ids, false).unwrap(), "a    ");

    // token types: control special, user-defined matched but not special, BOS default on
    assert!(tk.is_special_id(1) && tk.is_special_id(2) && tk.is_special_id(0));
    let tag = tk.token_to_id("<tag>").unwrap();
    assert!(!tk.is_special_id(tag));
    let e = tk.encode("hello<tag>", true).unwrap();
    assert_eq!(e.ids[0], 1);
    assert!(e.ids.contains(&tag));
    assert_eq!(tk.decode(&e.ids, true).unwrap(), "hello<tag>");
    assert_eq!(tk.bos_token(), Some("<s>"));
    assert_eq!(tk.eos_id(), Some(2));
    assert!(tk.is_stop_token(2));
    assert_eq!(tk.vocab_size(), spm_vocab().tokens.len());

    let mut v = spm_vocab();
    v.add_bos = Some(false);
    let tk = Tokenizer::from_gguf_vocab(&v).unwrap();
    assert_ne!(tk.encode("hello", true).unwrap().ids[0], 1);
}

#[test]
fn gguf_errors_are_clear() {
    let mut v = spm_vocab();
    v.model = "bert".into();
    let e = Tokenizer::from_gguf_vocab(&v).unwrap_err().to_string();
    assert!(e.contains("\"bert\" is not supported"), "{e}");

    let mut v = fixture_vocab("gpt-2");
    v.pre = Some("mystery".into());
    let e = Tokenizer::from_gguf_vocab(&v).unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.pre \"mystery\""), "{e}");

    let mut v = fixture_vocab("gpt-2");
    v.merges = None;
    assert!(Tokenizer::from_gguf_vocab(&v).unwrap_err().to_string().contains("merges"));

    let mut v = spm_vocab();
    v.eos_id = Some(100_000);
    let e = Tokenizer::from_gguf_vocab(&v).unwrap_err().to_string();
    assert!(e.contains("eos_token_id = 100000"), "{e}");

    let mut v = spm_vocab();
    v.scores = Some(vec![0.0; 3]);
    assert!(Tokenizer::from_gguf_vocab(&v).unwrap_err().to_string().contains("scores"));

    let mut v = spm_vocab();
    v.chat_template = Some("{% if %}".into());
    let e = Tokenizer::from_gguf_vocab(&v).unwrap_err().to_string();
    assert!(e.contains("tokenizer.chat_template"), "{e}");
}

/// Merges derived from SentencePiece scores equal transformers' `generate_merges`
/// (reference produced by `tests/data/gen_spm_reference.py`; scores have ties).
#[test]
fn sentencepiece_merges_match_transformers() {
    let r: serde_json::Value = serde_json::from_str(include_str!("../data/spm_merges_reference.json")).unwrap();
    let tokens: Vec<String> = r["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    let scores: Vec<f32> = r["scores"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap() as f32).collect();
    let want: Vec<&str> = r["merges"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    let n = tokens.len();
    let v = GgufVocab {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(
            (0..n)
                .map(|i| {
                    if i == 0 {
                        2
                    } else if i < 3 {
                        3
                    } else {
                        1
                    }
                })
                .collect(),
        ),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..Default::default()
    };
    let tk = Tokenizer::from_gguf_vocab(&v).unwrap();
    let j: serde_json::Value = serde_json::from_str(&tk.inner().to_string(false).unwrap()).unwrap();
    let got = gguf_merges(&j).expect("merges");
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "merge #{i}");
    }
}

/// Broken vocabulary arrays are errors that name the field, never panics.
#[test]
fn broken_vocab_arrays_name_the_field() {
    let expect_err = |v: &GgufVocab, field: &str| {
        let e = Tokenizer::from_gguf_vocab(v).expect_err(field).to_string();
        assert!(e.contains(field), "{field}: {e}");
    };
    // arrays of different lengths
    let mut v = spm_vocab();
    v.token_types.as_mut().unwrap().pop();
    expect_err(&v, "tokenizer.ggml.token_type");
    let mut v = spm_vocab();
    v.scores.as_mut().unwrap().push(0.0);
    expect_err(&v, "tokenizer.ggml.scores");
    let mut v = spm_vocab();
    v.tokens.clear();
    expect_err(&v, "tokenizer.ggml.tokens");
    // token types outside llama.cpp's enum
    let mut v = spm_vocab();
    v.token_types.as_mut().unwrap()[7] = 99;
    expect_err(&v, "tokenizer.ggml.token_type");
    // merges naming tokens the vocabulary lacks, or not "left right"
    let mut v = fixture_vocab("gpt-2");
    v.merges.as_mut().unwrap().insert(3, "Ġnot_a_token Ġx".into());
    expect_err(&v, "tokenizer.ggml.merges[3]");
    let mut v = fixture_vocab("gpt-2");
    v.merges.as_mut().unwrap().push("nospace".into());
    expect_err(&v, "tokenizer.ggml.merges[");
    let mut v = fixture_vocab("gpt-2");
    v.tokens.truncate(v.tokens.len() / 2); // the merges outgrow the tokens
    v.token_types.as_mut().unwrap().truncate(v.tokens.len());
    expect_err(&v, "tokenizer.ggml.merges[");
    // ids outside the vocabulary
    for set in [
        |v: &mut GgufVocab| v.bos_id = Some(u32::MAX),
        |v: &mut GgufVocab| v.unk_id = Some(1 << 20),
        |v: &mut GgufVocab| v.pad_id = Some(5000),
    ] {
        let mut v = fixture_vocab("gpt-2");
        set(&mut v);
        expect_err(&v, "_token_id = ");
    }
}

/// Random mutations of both kinds of vocabulary either build a tokenizer that encodes
/// and decodes, or give an error — no panic.
#[test]
fn mutated_vocabs_never_panic() {
    let mut rng = Rng(0x5eed_cafe);
    for round in 0..60 {
        let mut v = if round % 2 == 0 { spm_vocab() } else { fixture_vocab("gpt-2") };
        for _ in 0..1 + rng.below(3) {
            let n = v.tokens.len();
            match rng.below(8) {
                0 => v.tokens[rng.below(n)] = String::new(),
                1 => v.tokens[rng.below(n)] = v.tokens[rng.below(n)].clone(),
                2 => {
                    if let Some(m) = v.merges.as_mut() {
                        let i = rng.below(m.len());
                        m[i] = format!("{} {}", v.tokens[rng.below(n)], v.tokens[rng.below(n)]);
                    }
                }
                3 => {
                    if let Some(t) = v.token_types.as_mut() {
                        t[rng.below(n)] = rng.below(7) as i32;
                    }
                }
                4 => {
                    if let Some(s) = v.scores.as_mut() {
                        s[rng.below(n)] = [f32::NAN, f32::INFINITY, -f32::INFINITY, 1e30][rng.below(4)];
                    }
                }
                5 => v.eos_id = Some(rng.below(n + 2) as u32),
                6 => v.tokens[rng.below(n)] = "<0xZZ>".into(),
                _ => v.add_eos = Some(true),
            }
        }
        let r = std::panic::catch_unwind(|| match Tokenizer::from_gguf_vocab(&v) {
            Ok(tk) => {
                for s in SAMPLES {
                    let e = tk.encode(s, true).unwrap();
                    tk.decode(&e.ids, false).unwrap();
                }
            }
            Err(e) => assert!(e.to_string().contains("tokenizer."), "{e}"),
        });
        assert!(r.is_ok(), "round {round}: panicked on {:?}", (&v.model, v.eos_id));
    }
}

/// `tokenizer.ggml.tokens` entries may be 64 MiB long: deriving SentencePiece merges hashed
/// every left and right half of every piece, so one 100k-character token (a 100 KB file)
/// took 27 s to load and a 1M-character one would take tens of minutes. The halves are now
/// looked up only when some piece has their length; the merges are the same.
#[test]
fn one_long_spm_token_loads_quickly() {
    let mut v = spm_vocab();
    let long = "l".repeat(1_000_000);
    v.tokens.push(long.clone());
    v.token_types.as_mut().unwrap().push(1);
    v.scores.as_mut().unwrap().push(-50.0);
    let t = std::time::Instant::now();
    let tk = Tokenizer::from_gguf_vocab(&v).unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(secs < 20.0, "loading took {secs:.1} s");
    // Same merges as before the long token: text encodes as with spm_vocab() alone.
    let plain = Tokenizer::from_gguf_vocab(&spm_vocab()).unwrap();
    for text in ["hello world", " llo, wor"] {
        assert_eq!(tk.encode(text, true).unwrap().ids, plain.encode(text, true).unwrap().ids, "{text:?}");
    }
}
