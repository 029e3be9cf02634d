//! Loading Hugging Face folders: required/optional files, config variants, errors, encode.
use crate::common;
use common::*;
use engram_tokenizer::*;

#[test]
fn missing_tokenizer_json_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    let want = format!("{}: missing (a Hugging Face model folder needs tokenizer.json)", dir.path().join("tokenizer.json").display());
    assert_eq!(e, want);
}

#[test]
fn parse_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), "{not json").unwrap();
    let e = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(e.starts_with(&dir.path().join("tokenizer.json").display().to_string()), "{e}");

    write_dir(dir.path(), &[("tokenizer_config.json", "[1,")]);
    let e = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer_config.json: invalid JSON"), "{e}");

    write_dir(dir.path(), &[("tokenizer_config.json", r#"{"bos_token": 5}"#)]);
    let e = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer_config.json") && e.contains("bos_token"), "{e}");

    write_dir(dir.path(), &[("tokenizer_config.json", "{}"), ("chat_template.jinja", "{% for %}")]);
    let e = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(e.contains("chat_template.jinja") && e.contains("does not compile"), "{e}");
}

#[test]
fn tokenizer_json_alone_is_enough() {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path(), &[]);
    let tk = Tokenizer::from_hf_dir(dir.path()).unwrap();
    // BOS from the post-processor, EOS from the well-known spellings
    assert_eq!(tk.bos_id(), Some(0));
    assert_eq!(tk.bos_token(), Some("<s>"));
    assert_eq!(tk.eos_id(), Some(1));
    assert_eq!(tk.eos_token(), Some("</s>"));
    assert!(tk.is_stop_token(1));
    assert!(!tk.is_stop_token(3));
    assert!(tk.chat_template().is_none());
    assert_eq!(tk.vocab_size(), 2048);
    assert_eq!(tk.token_to_id("<|im_end|>"), Some(3));
    assert_eq!(tk.id_to_token(2).as_deref(), Some("<|im_start|>"));
    assert_eq!(tk.inner().get_vocab_size(true), 2048);
}

#[test]
fn config_variants() {
    let dir = tempfile::tempdir().unwrap();
    // object-form tokens, list-form template, generation_config eos list
    write_dir(
        dir.path(),
        &[
            (
                "tokenizer_config.json",
                &serde_json::json!({
                    "bos_token": {"content": "<s>", "lstrip": false},
                    "eos_token": {"content": "<|im_end|>"},
                    "chat_template": [
                        {"name": "tool_use", "template": "TOOLS"},
                        {"name": "default", "template": CHATML}
                    ]
                })
                .to_string(),
            ),
            ("generation_config.json", r#"{"bos_token_id": 0, "eos_token_id": [3, 1]}"#),
        ],
    );
    let tk = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tk.bos_id(), Some(0));
    assert_eq!(tk.eos_id(), Some(3));
    assert_eq!(tk.eos_token(), Some("<|im_end|>"));
    assert!(tk.is_stop_token(3) && tk.is_stop_token(1) && !tk.is_stop_token(0));
    let t = tk.chat_template().unwrap();
    assert_eq!(t.source(), CHATML);

    // chat_template.jinja wins over tokenizer_config's; int eos in generation_config
    write_dir(
        dir.path(),
        &[
            ("tokenizer_config.json", r#"{"bos_token": "<s>", "eos_token": "</s>", "chat_template": "CONFIG"}"#),
            ("chat_template.jinja", LLAMA3),
            ("generation_config.json", r#"{"eos_token_id": 3}"#),
        ],
    );
    let tk = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tk.chat_template().unwrap().source(), LLAMA3);
    assert_eq!(tk.eos_id(), Some(1));
    assert!(tk.is_stop_token(1) && tk.is_stop_token(3));
}

#[test]
fn add_bos_token_from_config_is_obeyed() {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path(), &[("tokenizer_config.json", r#"{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false}"#)]);
    let tk = Tokenizer::from_hf_dir(dir.path()).unwrap();
    let e = tk.encode("Hello", true).unwrap();
    assert_eq!(e.ids, tk.encode("Hello", false).unwrap().ids);
    // a literal "<s>" in the text is still kept
    let e = tk.encode("<s>Hello", true).unwrap();
    assert_eq!(e.ids[0], 0);

    write_dir(dir.path(), &[("tokenizer_config.json", r#"{"bos_token": "<s>", "add_bos_token": true}"#)]);
    let tk = Tokenizer::from_hf_dir(dir.path()).unwrap();
    let e = tk.encode("Hello", true).unwrap();
    assert_eq!(e.ids[0], 0);
    assert_eq!(e.ids[1..], tk.encode("Hello", false).unwrap().ids[..]);
}

#[test]
fn encode_offsets_are_byte_ranges() {
    let tk = Tokenizer::from_tokenizers(fixture().clone()).unwrap();
    for s in SAMPLES {
        let e = tk.encode(s, true).unwrap();
        assert_eq!(e.ids.len(), e.offsets.len());
        assert_eq!(e.ids[0], 0);
        assert_eq!(e.offsets[0], (0, 0), "BOS added by the post-processor");
        let mut last_end = 0;
        let mut last_start = 0;
        for (&id, &(a, b)) in e.ids.iter().zip(&e.offsets).skip(1) {
            assert!(a <= b && b <= s.len(), "{s:?}: {a}..{b}");
            assert!(s.is_char_boundary(a) && s.is_char_boundary(b));
            assert!(a >= last_start, "{s:?}: offsets go backwards");
            last_start = a;
            last_end = last_end.max(b);
            // whole-character tokens: the slice is exactly what the token decodes to
            let text = tk.decode(&[id], false).unwrap();
            if !text.contains('\u{FFFD}') {
                assert_eq!(&s[a..b], text, "{s:?}");
            }
        }
        assert_eq!(last_end, s.len(), "{s:?}");
    }
}

#[test]
fn special_tokens_in_text_are_recognised() {
    let tk = Tokenizer::from_tokenizers(fixture().clone()).unwrap();
    let e = tk.encode("<|im_start|>user\nHi<|im_end|>", true).unwrap();
    assert_eq!(e.ids[0], 0);
    assert_eq!(e.ids[1], 2);
    assert_eq!(*e.ids.last().unwrap(), 3);
    assert_eq!(e.offsets[1], (0, 12));
    assert!(tk.is_special_id(2) && !tk.is_special_id(100));
    assert_eq!(tk.decode(&e.ids, true).unwrap(), "user\nHi");
}
