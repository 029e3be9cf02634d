//! Chat templates against outputs of Python transformers (jinja2, same settings):
//! `tests/data/expected.json` was produced from the `.jinja` files next to it.
use crate::common;
use common::*;
use engram_tokenizer::*;

fn conversations() -> Vec<(&'static str, Vec<ChatMessage>)> {
    vec![
        ("sys_user", vec![ChatMessage::new("system", "  You are helpful.  "), ChatMessage::new("user", "Hi  there!")]),
        (
            "multi",
            vec![
                ChatMessage::new("user", "Hello"),
                ChatMessage::new("assistant", " Hi! How can I help? "),
                ChatMessage::new("user", "Tell me about café 日本語 🚀"),
            ],
        ),
        ("bad", vec![ChatMessage::new("user", "a"), ChatMessage::new("user", "b")]),
    ]
}

#[test]
fn templates_match_transformers() {
    let expected: serde_json::Value = serde_json::from_str(include_str!("../data/expected.json")).unwrap();
    let mut checked = 0;
    for (name, src) in [("chatml", CHATML), ("llama3", LLAMA3), ("llama2", LLAMA2), ("blocks", BLOCKS)] {
        let t = ChatTemplate::new(src).unwrap();
        for (conv, msgs) in conversations() {
            for agp in [false, true] {
                let key = format!("{name}/{conv}/{}", if agp { "True" } else { "False" });
                let want = expected[&key].as_str().unwrap();
                let got = t.render(&msgs, agp, "<s>", "</s>");
                match want.strip_prefix("ERROR: ") {
                    Some(msg) => {
                        let e = got.unwrap_err().to_string();
                        assert!(e.contains(msg), "{key}: {e}");
                    }
                    None => assert_eq!(got.unwrap(), want, "{key}"),
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 24);
}

#[test]
fn raise_exception_is_an_error() {
    let t = ChatTemplate::new(LLAMA2).unwrap();
    let e = t.render(&[ChatMessage::new("assistant", "x")], false, "<s>", "</s>").unwrap_err();
    assert!(matches!(e, TokenizerError::ChatTemplate(_)));
    assert!(e.to_string().contains("Conversation roles must alternate"), "{e}");
}

#[test]
fn syntax_errors_surface_at_compile_time() {
    let e = ChatTemplate::new("{% if %}").unwrap_err().to_string();
    assert!(e.contains("does not compile"), "{e}");
}

#[test]
fn strftime_now_and_helpers() {
    let t = ChatTemplate::new(
        "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}|{{ 'a,b'.split(',') | tojson }}|{{ '  x '.strip() }}|{{ 3.0 | tojson }}|{{ {'b': [1, none, true]} | tojson(sort_keys=true) }}",
    )
    .unwrap();
    let out = t.render(&[], false, "", "").unwrap();
    let parts: Vec<&str> = out.split('|').collect();
    assert_eq!(parts.len(), 6, "{out}");
    let d = parts[0].as_bytes();
    assert!(d.len() == 10 && d[4] == b'-' && d[7] == b'-', "{out}");
    let year: i32 = parts[0][..4].parse().unwrap();
    assert!((2024..2200).contains(&year));
    assert!(parts[1].ends_with(&parts[0][..4]) && parts[1].len() == 11, "{out}");
    assert_eq!(parts[2], r#"["a", "b"]"#);
    assert_eq!(parts[3], "x");
    assert_eq!(parts[4], "3.0");
    assert_eq!(parts[5], r#"{"b": [1, null, true]}"#);
}

#[test]
fn fixture_chatml_renders_to_special_tokens() {
    // what the fixture models do: ChatML template over the fixture tokenizer
    let tk = Tokenizer::from_tokenizers(fixture().clone()).unwrap();
    let t = ChatTemplate::new(CHATML).unwrap();
    let text = t.render(&[ChatMessage::new("user", "Hi")], true, "<s>", "</s>").unwrap();
    let ids = tk.encode(&text, true).unwrap().ids;
    assert_eq!(&ids[..2], &[0, 2]);
    assert_eq!(ids.iter().filter(|&&i| i == 3).count(), 1);
}
