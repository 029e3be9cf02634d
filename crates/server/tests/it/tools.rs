//! Tool calls over HTTP on random-weight fixtures, on the two call syntaxes they cover: the
//! ChatML `tiny` (a template without tool support: the generic JSON answer) and
//! `tiny-qwen3` (Qwen3's template: Hermes `<tool_call>` and `<think>`). Random weights
//! write garbage, so the structure is what is asserted: with `required` or a named tool
//! every answer is calls whose arguments fit the tool's schema; with `auto` an answer is
//! text or such calls; streamed deltas put together equal the whole answer; a tool loop's
//! history extends the session's cache; bad tools are a 400 naming the field.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use engram_fixture::{GgufFormat, Shape};
use engram_model::Model;
use engram_server::ServerConfig;
use serde_json::{json, Value};

use crate::common::{chat, post, shared, start_model};

/// A server on `tiny-qwen3` (generated once per test binary).
fn qwen3() -> SocketAddr {
    static A: OnceLock<(tempfile::TempDir, SocketAddr)> = OnceLock::new();
    A.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let files =
            engram_fixture::generate(Shape::TinyQwen3, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
        let model = Arc::new(Model::load(&files.hf_dir).unwrap());
        let addr = start_model(model, 256 << 20, ServerConfig::new("tiny"));
        (dir, addr)
    })
    .1
}

/// A server on `tiny-gpt-oss` (GPT-OSS's harmony template; generated once per test binary).
fn gpt_oss() -> SocketAddr {
    static A: OnceLock<(tempfile::TempDir, SocketAddr)> = OnceLock::new();
    A.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let files = engram_fixture::generate(Shape::TinyGptOss, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {})
            .unwrap();
        let model = Arc::new(Model::load(&files.hf_dir).unwrap());
        let addr = start_model(model, 256 << 20, ServerConfig::new("tiny"));
        (dir, addr)
    })
    .1
}

fn servers() -> [(&'static str, SocketAddr); 2] {
    [("tiny (generic)", shared()), ("tiny-qwen3 (hermes)", qwen3())]
}

pub fn weather_schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": false})
}

pub fn add_schema() -> Value {
    json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
           "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"], "additionalProperties": false})
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "weather", "description": "The weather in a city", "parameters": weather_schema()}},
        {"type": "function", "function": {"name": "add", "description": "Adds two numbers", "parameters": add_schema()}},
    ])
}

/// Whether `args` (a JSON object) fits tool `name`'s schema.
pub fn valid_args(name: &str, args: &Value) -> bool {
    let o = match args.as_object() {
        Some(o) => o,
        None => return false,
    };
    match name {
        "weather" => {
            o.len() == 2
                && args["city"].as_str().is_some_and(|c| c.chars().count() <= 8)
                && ["c", "f"].contains(&args["unit"].as_str().unwrap_or(""))
        }
        "add" => o.len() == 2 && ["a", "b"].iter().all(|k| args[k].as_i64().is_some_and(|n| (0..=99).contains(&n))),
        _ => false,
    }
}

/// Checks a response's calls; returns their names.
fn check_calls(what: &str, message: &Value) -> Vec<String> {
    let mut names = Vec::new();
    for c in message["tool_calls"].as_array().cloned().unwrap_or_default() {
        assert!(c["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{what}: {c}");
        assert_eq!(c["type"], "function", "{what}: {c}");
        let name = c["function"]["name"].as_str().unwrap().to_string();
        let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().expect("arguments is a JSON string"))
            .unwrap_or_else(|e| panic!("{what}: {e}: {c}"));
        assert!(valid_args(&name, &args), "{what}: {name} {args}");
        names.push(name);
    }
    names
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[test]
fn required_and_named_choices_always_answer_valid_calls() {
    for (what, addr) in servers() {
        for seed in 0..3 {
            for (choice, only) in [(json!("required"), None), (json!({"type": "function", "function": {"name": "add"}}), Some("add"))] {
                let extra = json!({"tools": tools(), "tool_choice": choice, "parallel_tool_calls": false,
                                   "max_tokens": 120, "temperature": 1.0, "seed": seed});
                let r = chat(addr, &user("What is 2 plus 3?"), extra);
                assert_eq!(r.status, 200, "{what}: {}", r.body);
                let c = &r.json()["choices"][0];
                assert_eq!(c["finish_reason"], "tool_calls", "{what} seed {seed} {choice}: {c}");
                let names = check_calls(what, &c["message"]);
                assert_eq!(names.len(), 1, "{what}: one call without parallel calls: {c}");
                assert!(c["message"]["content"].is_null(), "{what}: calls only: {c}");
                if let Some(n) = only {
                    assert_eq!(names[0], n, "{what}: {c}");
                }
            }
        }
    }
}

/// With thinking turned on by the request, a call it requires may follow reasoning: the
/// grammar lets the answer open `<think>` (random weights then reason until `max_tokens`) or
/// call at once; either way nothing else comes back. Without it, or with thinking off (the
/// prompt closes the section), the answer is the call alone.
#[test]
fn qwen3_may_reason_before_a_required_call() {
    let addr = qwen3();
    let (mut reasoned, mut called) = (0, 0);
    for seed in 0..12 {
        let extra = json!({"tools": tools(), "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 120,
                           "temperature": 1.0, "seed": seed, "chat_template_kwargs": {"enable_thinking": true}});
        let r = chat(addr, &user("What is 2 plus 3?"), extra);
        assert_eq!(r.status, 200, "{}", r.body);
        let c = &r.json()["choices"][0];
        let m = &c["message"];
        assert!(m["content"].is_null() || m["content"] == "", "seed {seed}: {c}");
        if m["reasoning_content"].as_str().is_some_and(|t| !t.is_empty()) {
            reasoned += 1;
        }
        if c["finish_reason"] == "tool_calls" {
            assert_eq!(check_calls("qwen3", m).len(), 1, "seed {seed}: {c}");
            called += 1;
        } else {
            assert_eq!(c["finish_reason"], "length", "seed {seed}: {c}");
            assert!(m["tool_calls"].is_null(), "seed {seed}: {c}");
        }
    }
    assert!(reasoned > 0 && called > 0, "{reasoned} answers reasoned, {called} called");
    for (seed, kwargs) in (0..4).flat_map(|s| [(s, json!({})), (s, json!({"enable_thinking": false}))]) {
        let extra = json!({"tools": tools(), "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 120, "temperature": 1.0,
                   "seed": seed, "chat_template_kwargs": kwargs});
        let c = chat(addr, &user("What is 2 plus 3?"), extra).json()["choices"][0].clone();
        assert_eq!(c["finish_reason"], "tool_calls", "seed {seed} {kwargs}: {c}");
        assert!(c["message"]["reasoning_content"].is_null(), "seed {seed} {kwargs}: {c}");
    }
}

#[test]
fn parallel_calls_are_each_valid() {
    for (what, addr) in servers() {
        let extra = json!({"tools": tools(), "tool_choice": "required", "max_tokens": 200, "temperature": 1.0, "seed": 5});
        let r = chat(addr, &user("Weather in Oslo and 2+2?"), extra);
        assert_eq!(r.status, 200, "{what}: {}", r.body);
        let c = &r.json()["choices"][0];
        let names = check_calls(what, &c["message"]);
        assert!(!names.is_empty() || c["finish_reason"] == "length", "{what}: {c}");
    }
}

#[test]
fn auto_answers_text_or_valid_calls() {
    for (what, addr) in servers() {
        for seed in 0..4 {
            // Room for a call to end (a call cut short is reported as far as it went).
            let extra = json!({"tools": tools(), "tool_choice": "auto", "max_tokens": 200, "temperature": 1.0, "seed": seed});
            let r = chat(addr, &user("Weather in Oslo?"), extra);
            assert_eq!(r.status, 200, "{what}: {}", r.body);
            let c = &r.json()["choices"][0];
            let names = check_calls(what, &c["message"]);
            if names.is_empty() {
                assert!(c["message"]["content"].is_string(), "{what}: text: {c}");
                assert_ne!(c["finish_reason"], "tool_calls", "{what}: {c}");
            } else {
                assert_eq!(c["finish_reason"], "tool_calls", "{what}: {c}");
            }
        }
        // `none`: no call grammar, text only.
        let r = chat(addr, &user("Weather?"), json!({"tools": tools(), "tool_choice": "none", "max_tokens": 8}));
        assert_eq!(r.status, 200, "{what}: {}", r.body);
        assert!(r.json()["choices"][0]["message"]["tool_calls"].is_null(), "{what}: {}", r.body);
    }
}

/// A streamed answer's deltas put together: (reasoning, content, calls as (name, arguments)).
fn reassemble(r: &crate::common::Resp) -> (String, String, Vec<(String, String)>, String) {
    let (mut reasoning, mut content, mut calls, mut finish) = (String::new(), String::new(), Vec::<(String, String)>::new(), String::new());
    for (_, data) in r.sse() {
        let Ok(v) = serde_json::from_str::<Value>(&data) else { continue };
        let Some(choice) = v["choices"].get(0) else { continue };
        let d = &choice["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
        for tc in d["tool_calls"].as_array().cloned().unwrap_or_default() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                // A call's first delta: index, id, type, name and empty arguments.
                assert!(tc["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{tc}");
                assert_eq!(tc["type"], "function", "{tc}");
                assert_eq!(tc["function"]["arguments"], "", "{tc}");
                calls.push((tc["function"]["name"].as_str().unwrap().to_string(), String::new()));
            } else {
                assert!(tc["id"].is_null() && tc["function"]["name"].is_null(), "later deltas carry arguments only: {tc}");
                calls[i].1.push_str(tc["function"]["arguments"].as_str().unwrap());
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (reasoning, content, calls, finish)
}

/// How many argument deltas each call of a streamed answer came in.
fn argument_fragments(r: &crate::common::Resp) -> Vec<usize> {
    let mut n = Vec::new();
    for (_, data) in r.sse() {
        let Ok(v) = serde_json::from_str::<Value>(&data) else { continue };
        for tc in v["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default() {
            let i = tc["index"].as_u64().unwrap() as usize;
            n.resize(n.len().max(i + 1), 0);
            if tc["id"].is_null() {
                n[i] += 1;
            }
        }
    }
    n
}

#[test]
fn streamed_deltas_reassemble_to_the_whole_answer() {
    for (what, addr) in servers() {
        for choice in [json!("required"), json!("auto")] {
            let extra = json!({"tools": tools(), "tool_choice": choice, "max_tokens": 80, "temperature": 0});
            let whole = chat(addr, &user("What is 2 plus 3?"), extra.clone());
            assert_eq!(whole.status, 200, "{}", whole.body);
            let c = &whole.json()["choices"][0];
            let mut stream = extra;
            stream["stream"] = json!(true);
            let r = chat(addr, &user("What is 2 plus 3?"), stream);
            assert_eq!(r.status, 200, "{}", r.body);
            let (reasoning, content, calls, finish) = reassemble(&r);
            let m = &c["message"];
            assert_eq!(reasoning, m["reasoning_content"].as_str().unwrap_or(""), "{what} {choice}");
            assert_eq!(content, m["content"].as_str().unwrap_or(""), "{what} {choice}");
            let want: Vec<(String, String)> = m["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|t| (t["function"]["name"].as_str().unwrap().into(), t["function"]["arguments"].as_str().unwrap().into()))
                .collect();
            assert_eq!(calls, want, "{what} {choice}");
            assert_eq!(finish, c["finish_reason"].as_str().unwrap(), "{what} {choice}");
            // The template family's calls stream their arguments as they are written (one
            // delta per token), not whole.
            if what.contains("hermes") {
                for (n, (_, args)) in argument_fragments(&r).iter().zip(&calls) {
                    assert!(*n > 1, "{what} {choice}: {args} came in {n} delta(s)");
                }
            }
        }
    }
}

/// Two calls and an answer, each turn sending the whole history back under one session: the
/// calls' arguments are valid, and each turn reuses the cache of the last (never prefilled again).
#[test]
fn a_tool_loop_extends_the_session_cache_each_turn() {
    for (what, addr) in servers() {
        let session = format!("loop-{}", what.split(' ').next().unwrap());
        let messages =
            vec![json!({"role": "system", "content": "You call tools."}), json!({"role": "user", "content": "Weather in Oslo, then 2+3?"})];
        tool_loop_extends_the_session_cache(addr, what, &session, messages, json!({"parallel_tool_calls": false}));
    }
}

#[test]
fn qwen3_reasoning_is_apart_from_the_answer() {
    // With thinking off the template closes an empty block in the prompt: no reasoning
    // comes back.
    let addr = qwen3();
    let r = chat(addr, &user("Hi"), json!({"max_tokens": 12, "chat_template_kwargs": {"enable_thinking": false}}));
    assert_eq!(r.status, 200, "{}", r.body);
    let m = &r.json()["choices"][0]["message"];
    assert!(m["reasoning_content"].is_null(), "{m}");
    assert!(!m["content"].as_str().unwrap().contains("</think>"), "{m}");
    // An answer that opens with a reasoning section (forced here with the `regex` field:
    // random weights never write one) comes back apart, whole and streamed.
    let forced = json!({"regex": "<think>\n[a-z]{3}\n</think>\n\n[a-z]{4}", "max_tokens": 40, "temperature": 1.0, "seed": 3});
    let r = chat(addr, &user("Hi"), forced.clone());
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json()["choices"][0]["message"].clone();
    let (reasoning, content) = (m["reasoning_content"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string());
    assert!(reasoning.len() == 3 && content.len() == 4, "{m}");
    let mut stream = forced;
    stream["stream"] = json!(true);
    let (r2, c2, calls, _) = reassemble(&chat(addr, &user("Hi"), stream));
    assert_eq!((r2, c2, calls.len()), (reasoning, content, 0));
    // A reasoning section given back in the history reaches the template (Qwen3 shows the
    // last turn's): the prompt grows by it.
    let base = json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]);
    let with = json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "say hello back"}]);
    let n = |m: &Value| chat(addr, m, json!({"max_tokens": 1})).json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n(&with) > n(&base), "the template shows the given reasoning");
}

#[test]
fn bad_tools_are_a_400_naming_the_field() {
    // A server of its own: its counters move only for this test's requests.
    let addr = crate::common::start(64 << 20, ServerConfig::new("tiny"));
    let t = |name: &str, params: Value| json!({"type": "function", "function": {"name": name, "parameters": params}});
    let cases = [
        (json!({"tools": {"a": 1}}), "tools"),
        (json!({"tools": [t("a", json!({"type": "object"})), t("b", json!({"type": "nonsense"}))]}), "tools[1].function.parameters"),
        (json!({"tools": [t("a", json!({"type": "object"})), t("a", json!({"type": "object"}))]}), "tools[1].function.name"),
        (
            json!({"tools": [t("a", json!({"type": "object"}))], "tool_choice": {"type": "function", "function": {"name": "zz"}}}),
            "tool_choice.function.name",
        ),
        (json!({"tools": [t("a", json!({"type": "object"}))], "tool_choice": "sometimes"}), "tool_choice"),
        (json!({"functions": [{"name": "a"}]}), "functions"),
        (json!({"tools": [t("a", json!({"type": "object"}))], "response_format": {"type": "json_object"}}), "response_format"),
    ];
    let before = crate::common::metric(addr, "engram_prompt_tokens_computed_total ");
    for (extra, field) in cases {
        let r = chat(addr, &user("x"), extra.clone());
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], field, "{extra}: {}", r.body);
    }
    // Tool turns that answer no call.
    let orphan = json!([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_1", "content": "r"}]);
    let bare = json!([{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}]);
    for (m, field) in [(orphan, "messages[1].tool_call_id"), (bare, "messages[1].tool_call_id")] {
        let r = chat(addr, &m, json!({}));
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], field, "{}", r.body);
    }
    // A grammar over the size limit.
    let many: Vec<Value> = (0..100)
        .map(|i| t(&format!("f{i}"), json!({"type": "object", "description": "x".repeat(4000), "properties": {"a": {"type": "string"}}})))
        .collect();
    let r = chat(addr, &user("x"), json!({"tools": many}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "tools", "{}", r.body);
    assert_eq!(crate::common::metric(addr, "engram_prompt_tokens_computed_total "), before, "nothing was queued");
    // /v1/completions takes no tools.
    let r = post(addr, "/v1/completions", &json!({"prompt": "x", "tools": [t("a", json!({"type": "object"}))]}));
    assert_eq!(r.status, 400, "{}", r.body);
}

fn anthropic_tools() -> Value {
    json!([
        {"name": "weather", "description": "The weather in a city", "input_schema": weather_schema()},
        {"name": "add", "description": "Adds two numbers", "input_schema": add_schema()},
    ])
}

fn messages_api(addr: SocketAddr, body: Value) -> crate::common::Resp {
    let mut b = json!({"model": "tiny", "max_tokens": 80, "temperature": 0});
    for (k, v) in body.as_object().unwrap() {
        b[k] = v.clone();
    }
    post(addr, "/v1/messages", &b)
}

/// Anthropic's Messages API: `tool_choice` `any` answers `tool_use` blocks whose input fits
/// the schema, streamed as `input_json_delta` that reassembles to the same input; the
/// `tool_use` / `tool_result` history extends the session's cache.
#[test]
fn anthropic_tool_use_whole_streamed_and_in_the_history() {
    for (what, addr) in servers() {
        let session = format!("anth-{}", what.split(' ').next().unwrap());
        let mut messages = vec![json!({"role": "user", "content": "Weather in Oslo?"})];
        let body = |messages: &Vec<Value>, choice: Value| json!({"messages": messages, "tools": anthropic_tools(), "tool_choice": choice, "session_id": session});
        let r = messages_api(addr, body(&messages, json!({"type": "any", "disable_parallel_tool_use": true})));
        assert_eq!(r.status, 200, "{what}: {}", r.body);
        let v = r.json();
        assert_eq!(v["stop_reason"], "tool_use", "{what}: {v}");
        let blocks = v["content"].as_array().unwrap().clone();
        let uses: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "tool_use").collect();
        assert_eq!(uses.len(), 1, "{what}: {v}");
        let u = uses[0].clone();
        assert!(u["id"].as_str().unwrap().starts_with("toolu_"), "{u}");
        assert!(valid_args(u["name"].as_str().unwrap(), &u["input"]), "{what}: {u}");
        // Streamed: the same blocks.
        let mut sb = body(&messages, json!({"type": "any", "disable_parallel_tool_use": true}));
        sb["stream"] = json!(true);
        let s = messages_api(addr, sb);
        assert_eq!(s.status, 200, "{}", s.body);
        let (mut name, mut partial, mut stop, mut num_partial) = (String::new(), String::new(), String::new(), 0);
        for (event, data) in s.sse() {
            let d: Value = serde_json::from_str(&data).unwrap();
            match event.as_deref() {
                Some("content_block_start") if d["content_block"]["type"] == "tool_use" => {
                    name = d["content_block"]["name"].as_str().unwrap().into();
                }
                Some("content_block_delta") if d["delta"]["type"] == "input_json_delta" => {
                    partial.push_str(d["delta"]["partial_json"].as_str().unwrap());
                    num_partial += 1;
                }
                Some("message_delta") => stop = d["delta"]["stop_reason"].as_str().unwrap().into(),
                _ => {}
            }
        }
        assert_eq!((name.as_str(), stop.as_str()), (u["name"].as_str().unwrap(), "tool_use"), "{what}");
        assert_eq!(serde_json::from_str::<Value>(&partial).unwrap(), u["input"], "{what}");
        if what.contains("hermes") {
            assert!(num_partial > 1, "{what}: the input streams in pieces, got {num_partial}");
        }
        let first_prompt = v["usage"]["input_tokens"].as_u64().unwrap() + v["usage"]["cache_read_input_tokens"].as_u64().unwrap();
        // The call and its result in the history; the next turn reuses the cache.
        messages.push(json!({"role": "assistant", "content": blocks}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"], "content": "12 C"}]}));
        // One call at most, with room to end (the generic family streams its calls: one cut
        // short would come back as far as it went).
        let mut next = body(&messages, json!({"type": "auto", "disable_parallel_tool_use": true}));
        next["max_tokens"] = json!(300);
        let r = messages_api(addr, next);
        assert_eq!(r.status, 200, "{what}: {}", r.body);
        let v = r.json();
        assert!(v["usage"]["cache_read_input_tokens"].as_u64().unwrap() >= first_prompt, "{what}: {v}");
        for b in v["content"].as_array().unwrap() {
            if b["type"] == "tool_use" {
                assert!(valid_args(b["name"].as_str().unwrap(), &b["input"]), "{what}: {b}");
            }
        }
        // A tool_result answering no call is a 400 naming it.
        let orphan = vec![json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]})];
        let r = messages_api(addr, json!({"messages": orphan, "tools": anthropic_tools()}));
        assert_eq!(r.status, 400, "{}", r.body);
        let r = messages_api(
            addr,
            json!({"messages": [{"role": "user", "content": "x"}], "tools": anthropic_tools(), "tool_choice": {"type": "tool", "name": "nope"}}),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("tool_choice.name"), "{}", r.body);
    }
}

/// Ollama's `/api/chat`: the answer is text or calls with `arguments` objects that fit the
/// schema; an assistant's `tool_calls` and a `tool` message in the history are taken.
#[test]
fn ollama_chat_takes_tools_and_tool_turns() {
    for (what, addr) in servers() {
        let ollama_tools = tools();
        for seed in 0..3 {
            let body = json!({"model": "tiny", "stream": false, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                              "tools": ollama_tools, "options": {"temperature": 1.0, "seed": seed, "num_predict": 80}});
            let r = post(addr, "/api/chat", &body);
            assert_eq!(r.status, 200, "{what}: {}", r.body);
            let m = &r.json()["message"];
            for c in m["tool_calls"].as_array().cloned().unwrap_or_default() {
                assert!(c["function"]["arguments"].is_object(), "{what}: {c}");
                assert!(valid_args(c["function"]["name"].as_str().unwrap(), &c["function"]["arguments"]), "{what}: {c}");
            }
        }
        let history = json!([
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo", "unit": "c"}}}]},
            {"role": "tool", "tool_name": "weather", "content": "12 C"},
        ]);
        let r = post(
            addr,
            "/api/chat",
            &json!({"model": "tiny", "stream": false, "messages": history, "tools": ollama_tools, "options": {"num_predict": 8}}),
        );
        assert_eq!(r.status, 200, "{what}: {}", r.body);
        // A tool message with no call before it.
        let orphan = json!([{"role": "user", "content": "x"}, {"role": "tool", "content": "12 C"}]);
        let r = post(addr, "/api/chat", &json!({"model": "tiny", "stream": false, "messages": orphan}));
        assert_eq!(r.status, 400, "{what}: {}", r.body);
        assert!(r.body.contains("messages[1]"), "{}", r.body);
        let r = post(addr, "/api/generate", &json!({"model": "tiny", "prompt": "x", "tools": ollama_tools}));
        assert_eq!(r.status, 400, "{}", r.body);
    }
}

/// An agent's tool loop: each step's prompt extends the agent's session (cached tokens at
/// least the last prompt), and every call is valid.
#[test]
fn an_agent_tool_loop_extends_its_cache() {
    for (what, addr) in servers() {
        let id = format!("toolbot-{}", what.split(' ').next().unwrap());
        let r = post(addr, "/v1/agents", &json!({"id": id, "system": "You call tools."}));
        assert_eq!(r.status, 201, "{}", r.body);
        let mut messages = vec![json!({"role": "user", "content": "Weather in Oslo, then 2+3?"})];
        let mut last_prompt = 0;
        for turn in 0..3 {
            let choice = if turn < 2 { "required" } else { "none" };
            let body = json!({"messages": messages, "tools": tools(), "tool_choice": choice, "parallel_tool_calls": false,
                              "max_tokens": 80, "temperature": 0});
            let r = post(addr, &format!("/v1/agents/{id}/generate"), &body);
            assert_eq!(r.status, 200, "{what}: {}", r.body);
            let v = r.json();
            let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
            assert!(turn == 0 || cached >= last_prompt, "{what} turn {turn}: {cached} cached, the last prompt was {last_prompt}");
            last_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
            if turn == 2 {
                assert!(v["message"]["tool_calls"].is_null(), "{v}");
                break;
            }
            assert_eq!(v["finish_reason"], "tool_calls", "{what}: {v}");
            assert_eq!(check_calls(what, &v["message"]).len(), 1, "{v}");
            let call = v["message"]["tool_calls"][0].clone();
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call.clone()]}));
            messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "{\"ok\": true}"}));
        }
    }
}

/// GPT-OSS's harmony format on `tiny-gpt-oss`: with `required` or a named tool the answer
/// is a call on the commentary channel to `functions.NAME` whose arguments fit the schema,
/// streamed argument by argument to the same whole; with `auto`, text or such calls; the
/// `analysis` channel comes back as reasoning (forced with a `regex`: random weights never
/// write harmony).
#[test]
fn gpt_oss_harmony_calls_and_reasoning() {
    let (what, addr) = ("tiny-gpt-oss (harmony)", gpt_oss());
    for seed in 0..3 {
        for (choice, only) in [(json!("required"), None), (json!({"type": "function", "function": {"name": "add"}}), Some("add"))] {
            let extra = json!({"tools": tools(), "tool_choice": choice, "max_tokens": 120, "temperature": 1.0, "seed": seed});
            let r = chat(addr, &user("What is 2 plus 3?"), extra.clone());
            assert_eq!(r.status, 200, "{what}: {}", r.body);
            let c = &r.json()["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "{what} seed {seed} {choice}: {c}");
            let names = check_calls(what, &c["message"]);
            assert_eq!(names.len(), 1, "{what}: {c}");
            if let Some(n) = only {
                assert_eq!(names[0], n, "{what}: {c}");
            }
            let mut stream = extra;
            stream["stream"] = json!(true);
            let sr = chat(addr, &user("What is 2 plus 3?"), stream);
            let (reasoning, content, calls, finish) = reassemble(&sr);
            let want = (
                c["message"]["tool_calls"][0]["function"]["name"].as_str().unwrap().to_string(),
                c["message"]["tool_calls"][0]["function"]["arguments"].as_str().unwrap().to_string(),
            );
            assert_eq!((reasoning.as_str(), content.as_str(), finish.as_str()), ("", "", "tool_calls"), "{what}");
            assert_eq!(calls, vec![want], "{what} seed {seed}");
            assert!(argument_fragments(&sr)[0] > 1, "{what}: the arguments stream");
        }
        let extra = json!({"tools": tools(), "tool_choice": "auto", "max_tokens": 60, "temperature": 1.0, "seed": seed});
        let r = chat(addr, &user("Weather in Oslo?"), extra);
        assert_eq!(r.status, 200, "{what}: {}", r.body);
        let c = &r.json()["choices"][0];
        if check_calls(what, &c["message"]).is_empty() {
            assert_ne!(c["finish_reason"], "tool_calls", "{what}: {c}");
        }
    }
    let forced = json!({"regex": "<\\|channel\\|>analysis<\\|message\\|>[a-z]{3}<\\|end\\|><\\|start\\|>assistant<\\|channel\\|>final<\\|message\\|>[a-z]{4}",
                        "max_tokens": 200, "temperature": 1.0, "seed": 3});
    let r = chat(addr, &user("Hi"), forced.clone());
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json()["choices"][0]["message"].clone();
    let (reasoning, content) = (m["reasoning_content"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string());
    assert!(reasoning.len() == 3 && content.len() == 4, "{m}");
    let mut stream = forced;
    stream["stream"] = json!(true);
    let (r2, c2, calls, _) = reassemble(&chat(addr, &user("Hi"), stream));
    assert_eq!((r2, c2, calls.len()), (reasoning, content, 0));
}

/// A harmony tool loop: the call and its result in the history (the template renders the
/// call as the grammar wrote it), each turn reusing the last one's cache.
#[test]
fn gpt_oss_tool_loop_extends_the_session_cache() {
    tool_loop_extends_the_session_cache(
        gpt_oss(),
        "harmony",
        "harmony-loop",
        vec![json!({"role": "user", "content": "Weather in Oslo, then 2+3?"})],
        json!({}),
    );
}

/// Three turns of `session` on `addr` from `messages` (two `required` calls, each answered with
/// a tool message, then `none`), `more` request fields added: every call valid for `family`,
/// each turn's cached tokens at least the last prompt's.
fn tool_loop_extends_the_session_cache(addr: SocketAddr, family: &str, session: &str, mut messages: Vec<Value>, more: Value) {
    let mut last_prompt = 0;
    for turn in 0..3 {
        let choice = if turn < 2 { json!("required") } else { json!("none") };
        let mut extra = json!({"tools": tools(), "tool_choice": choice, "max_tokens": 80, "temperature": 0, "session_id": session});
        for (k, v) in more.as_object().into_iter().flatten() {
            extra[k] = v.clone();
        }
        let r = chat(addr, &Value::Array(messages.clone()), extra);
        assert_eq!(r.status, 200, "{family} turn {turn}: {}", r.body);
        let v = r.json();
        let (prompt, cached) =
            (v["usage"]["prompt_tokens"].as_u64().unwrap(), v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap());
        if turn > 0 {
            assert!(cached >= last_prompt, "{family} turn {turn}: {cached} cached of {prompt}, the last prompt was {last_prompt}");
        }
        last_prompt = prompt;
        let m = v["choices"][0]["message"].clone();
        if turn == 2 {
            assert!(m["tool_calls"].is_null(), "{family}: {m}");
            break;
        }
        assert_eq!(check_named_calls(family, &m, family == "mistral").len(), 1, "{family}: {m}");
        let call = m["tool_calls"][0].clone();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call.clone()]}));
        messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "{\"ok\": true}"}));
    }
}

/// A server on the `tiny` fixture with chat template `template` and its special token
/// `<|im_start|>` (which these templates do not use) renamed `marker`: a random-weight model
/// whose vocabulary has the family's call marker as a special token, as Llama 3.x's
/// (`<|python_tag|>`) and Mistral's (`[TOOL_CALLS]`) have.
fn tiny_with(template: &str, marker: &str) -> (tempfile::TempDir, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[], &mut |_| {}).unwrap();
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        let path = files.hf_dir.join(name);
        if let Ok(text) = std::fs::read_to_string(&path) {
            std::fs::write(&path, text.replace("<|im_start|>", marker)).unwrap();
        }
    }
    std::fs::write(files.hf_dir.join("chat_template.jinja"), template).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    let id = model.tokenizer.token_to_id(marker).unwrap();
    assert!(model.tokenizer.is_special_id(id), "{marker} is a special token");
    let addr = start_model(model, 256 << 20, ServerConfig::new("tiny"));
    (dir, addr)
}

fn llama31() -> SocketAddr {
    static A: OnceLock<(tempfile::TempDir, SocketAddr)> = OnceLock::new();
    A.get_or_init(|| tiny_with(include_str!("templates/llama-3.1.jinja"), "<|python_tag|>")).1
}

fn mistral() -> SocketAddr {
    static A: OnceLock<(tempfile::TempDir, SocketAddr)> = OnceLock::new();
    A.get_or_init(|| tiny_with(include_str!("templates/mistral-nemo.jinja"), "[TOOL_CALLS]")).1
}

/// Llama 3.1's and Mistral Nemo's templates (llama.cpp's copies) end to end: `required` and
/// named choices answer valid calls (Mistral's opening `[TOOL_CALLS]`, a special token here,
/// written by the grammar as that token and shown to the parser), streamed argument by
/// argument to the same whole answer; `auto` answers text or valid calls, its lazy grammar
/// armed by the special token's id.
#[test]
fn llama3_and_mistral_formats_end_to_end() {
    for (what, addr, parallel) in [("llama-3.1", llama31(), false), ("mistral-nemo", mistral(), true)] {
        for seed in 0..3 {
            for (choice, only) in [(json!("required"), None), (json!({"type": "function", "function": {"name": "add"}}), Some("add"))] {
                let extra = json!({"tools": tools(), "tool_choice": choice, "parallel_tool_calls": parallel,
                                   "max_tokens": 600, "temperature": 1.0, "seed": seed});
                let r = chat(addr, &user("What is 2 plus 3?"), extra.clone());
                assert_eq!(r.status, 200, "{what}: {}", r.body);
                let c = &r.json()["choices"][0];
                let m = &c["message"];
                assert_eq!(c["finish_reason"], "tool_calls", "{what} seed {seed} {choice}: {c}");
                let names = check_named_calls(what, m, what == "mistral-nemo");
                assert!(!names.is_empty() && (parallel || names.len() == 1), "{what}: {c}");
                assert!(m["content"].is_null(), "{what}: calls only: {c}");
                if let Some(n) = only {
                    assert!(names.iter().all(|x| x == n), "{what}: {c}");
                }
                let mut stream = extra;
                stream["stream"] = json!(true);
                let sr = chat(addr, &user("What is 2 plus 3?"), stream);
                assert_eq!(sr.status, 200, "{}", sr.body);
                let mut calls = Vec::new();
                let mut finish = String::new();
                for (_, data) in sr.sse() {
                    let Ok(v) = serde_json::from_str::<Value>(&data) else { continue };
                    let Some(ch) = v["choices"].get(0) else { continue };
                    assert!(ch["delta"]["content"].as_str().unwrap_or("").is_empty(), "{what}: no content: {v}");
                    for tc in ch["delta"]["tool_calls"].as_array().cloned().unwrap_or_default() {
                        let i = tc["index"].as_u64().unwrap() as usize;
                        if i == calls.len() {
                            calls.push((tc["function"]["name"].as_str().unwrap().to_string(), String::new()));
                        }
                        calls[i].1.push_str(tc["function"]["arguments"].as_str().unwrap());
                    }
                    if let Some(f) = ch["finish_reason"].as_str() {
                        finish = f.into();
                    }
                }
                let want: Vec<(String, String)> = m["tool_calls"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| (t["function"]["name"].as_str().unwrap().into(), t["function"]["arguments"].as_str().unwrap().into()))
                    .collect();
                assert_eq!((calls, finish.as_str()), (want, "tool_calls"), "{what} seed {seed}");
                assert!(argument_fragments(&sr).iter().all(|&n| n > 1), "{what}: the arguments stream");
            }
            let extra = json!({"tools": tools(), "tool_choice": "auto", "max_tokens": 60, "temperature": 1.0, "seed": seed});
            let r = chat(addr, &user("Weather in Oslo?"), extra);
            assert_eq!(r.status, 200, "{what}: {}", r.body);
            let c = &r.json()["choices"][0];
            if check_named_calls(what, &c["message"], what == "mistral-nemo").is_empty() {
                assert_ne!(c["finish_reason"], "tool_calls", "{what}: {c}");
            }
        }
    }
}

/// [`check_calls`], with Mistral's call ids (9 alphanumerics, as its templates require)
/// when `mistral_ids`.
fn check_named_calls(what: &str, message: &Value, mistral_ids: bool) -> Vec<String> {
    if !mistral_ids {
        return check_calls(what, message);
    }
    let mut m = message.clone();
    for c in m["tool_calls"].as_array_mut().into_iter().flatten() {
        let id = c["id"].as_str().unwrap().to_string();
        assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{what}: {id}");
        c["id"] = Value::from(format!("call_{id}"));
    }
    check_calls(what, &m)
}

/// A Llama 3.1 tool loop: the template renders the call as the grammar wrote it and the
/// result as an `ipython` turn; each turn reuses the last one's cache.
#[test]
fn llama3_tool_loop_extends_the_session_cache() {
    tool_loop_extends_the_session_cache(
        llama31(),
        "llama",
        "llama-loop",
        vec![json!({"role": "user", "content": "Weather in Oslo, then 2+3?"})],
        json!({}),
    );
}

/// A Mistral Nemo tool loop: the template writes each call back with its id after the
/// arguments (and refuses an id that is not 9 alphanumerics), as the grammar wrote it, the
/// id chosen before decoding; each turn reuses the last one's cache.
#[test]
fn mistral_tool_loop_extends_the_session_cache() {
    tool_loop_extends_the_session_cache(
        mistral(),
        "mistral",
        "mistral-loop",
        vec![json!({"role": "user", "content": "Weather in Oslo, then 2+3?"})],
        json!({"parallel_tool_calls": false}),
    );
}

/// Llama 3.1's built-in `brave_search`: after `<|python_tag|>` the grammar also allows its
/// `brave_search.call(query="..")` form; whichever form the model takes, the answer is one
/// valid call.
#[test]
fn llama3_built_in_tools_are_called_in_either_form() {
    let addr = llama31();
    let schema = json!({"type": "object", "properties": {"query": {"type": "string", "maxLength": 8}}, "required": ["query"],
                        "additionalProperties": false});
    let tools = json!([{"type": "function", "function": {"name": "brave_search", "description": "Web search", "parameters": schema}}]);
    // Over these seeds the random model takes both forms.
    for seed in 0..60 {
        let extra = json!({"tools": tools, "tool_choice": "required", "max_tokens": 80, "temperature": 1.0, "seed": seed});
        let r = chat(addr, &user("Search the weather"), extra);
        assert_eq!(r.status, 200, "{}", r.body);
        let c = &r.json()["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "seed {seed}: {c}");
        let call = &c["message"]["tool_calls"][0]["function"];
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(call["name"], "brave_search", "{c}");
        assert!(args["query"].as_str().is_some_and(|q| q.chars().count() <= 8) && args.as_object().unwrap().len() == 1, "{args}");
    }
}
