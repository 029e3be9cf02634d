//! Constrained decoding (`grammar.rs`) on the tiny random-weight fixture: its free output is
//! random text, so only the grammar makes it JSON. A lone sequence and the batched scheduler
//! (with prompt lookup on, whose drafts a grammar-bound sequence checks by masked draws) both end sequences
//! under a grammar with JSON of the schema's shape and finish reason `stop`; sequences without
//! a grammar decode as before.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use crate::common;
use engram_engine::{DraftBudget, FinishReason, GrammarCompiler, LoneSequence, PromptLookup, SamplingParams, SchedulerConfig};
use engram_kv::{KvFormat, KvLayout, KvPool};
use serde_json::{json, Value};

/// A schema whose every value is bounded (so a random model completes it well within the
/// token limit) and a check of an answer's shape.
fn schemas() -> Vec<(Value, fn(&Value) -> bool)> {
    vec![
        (
            json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "required": ["ok", "n"], "additionalProperties": false}),
            |v| v["ok"].is_boolean() && v["n"].as_i64().is_some_and(|n| (0..=99).contains(&n)),
        ),
        (
            json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3}},
                   "required": ["color", "tags"], "additionalProperties": false}),
            |v| ["red", "green", "blue"].contains(&v["color"].as_str().unwrap_or("")) && v["tags"].as_array().is_some_and(|a| a.len() <= 3),
        ),
        (json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4}), |v| {
            v.as_array().is_some_and(|a| !a.is_empty() && a.len() <= 4 && a.iter().all(|x| x.as_i64().is_some_and(|x| x.abs() <= 5)))
        }),
    ]
}

#[test]
fn a_lone_sequence_answers_in_the_schemas_language() {
    let (_dir, model) = common::tiny();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20);
    let compiler = GrammarCompiler::new(&model.tokenizer, model.config.vocab).unwrap();
    let prompt = model.tokenizer.encode("Answer in JSON:", true).unwrap().ids;
    for (schema, ok) in schemas() {
        for seed in 0..3 {
            let grammar = compiler.json_schema(schema.clone()).unwrap();
            let params = SamplingParams { max_tokens: 200, temperature: 1.0, seed, grammar: Some(grammar), ..Default::default() };
            let g = LoneSequence::new(&model, &pool).generate(&prompt, &params, &mut |_| true).unwrap();
            assert_eq!(g.finish, FinishReason::Stop, "{schema}, seed {seed}: {:?}", g.text);
            let v: Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{schema}, seed {seed}: {e}: {:?}", g.text));
            assert!(ok(&v), "{schema}, seed {seed}: {v}");
        }
    }
    // Without a grammar, the fixture's text is not JSON: the grammar did the work.
    let free = SamplingParams { max_tokens: 40, temperature: 1.0, ignore_eos: true, ..Default::default() };
    let g = LoneSequence::new(&model, &pool).generate(&prompt, &free, &mut |_| true).unwrap();
    assert!(serde_json::from_str::<Value>(&g.text).is_err(), "{:?}", g.text);
}

/// Grammar-bound sequences speculate with prompt lookup: a draft is checked by a masked draw,
/// so one the grammar rejects is never accepted, and the batch decodes exactly as without
/// speculation (each answer JSON of its schema). A sequence whose answer repeats its prompt
/// (an enum list after the same list) drafts and has drafts accepted.
#[test]
fn a_batch_under_grammars_with_prompt_lookup_drafts_and_decodes_the_same() {
    let (_dir, model) = common::tiny();
    let compiler = GrammarCompiler::new(&model.tokenizer, model.config.vocab).unwrap();
    let mut jobs = Vec::new();
    for (i, (schema, _)) in schemas().into_iter().enumerate() {
        let grammar = compiler.json_schema(schema).unwrap();
        let params = SamplingParams { max_tokens: 200, temperature: 0.8, seed: i as u64, grammar: Some(grammar), ..Default::default() };
        jobs.push(("a b a b a b a b a b a b".to_string(), params));
    }
    let list = json!({"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 24, "maxItems": 24});
    let repeat = SamplingParams { max_tokens: 300, grammar: Some(compiler.json_schema(list).unwrap()), ..Default::default() };
    let listed = serde_json::to_string(&vec!["red"; 24]).unwrap();
    jobs.push((format!("{listed}\n{listed}\n"), repeat));
    let config = |lookup: bool| SchedulerConfig {
        speculation: lookup.then(PromptLookup::default),
        draft_budget: DraftBudget::Acceptance,
        ..SchedulerConfig::default()
    };
    let (plain, _) = common::run_jobs(&model, KvFormat::F32, config(false), &jobs);
    let (out, metrics) = common::run_jobs(&model, KvFormat::F32, config(true), &jobs);
    assert!(metrics.draft_tokens.load(Relaxed) > 0, "grammar-bound sequences draft");
    assert!(metrics.draft_tokens_accepted.load(Relaxed) > 0, "and have drafts accepted");
    for (i, ((text, _, finish), (want, _, _))) in out.iter().zip(&plain).enumerate() {
        assert_eq!(text, want, "job {i}: speculation changed the answer");
        assert_eq!(*finish, Some(FinishReason::Stop), "job {i}: {text:?}");
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("job {i}: {e}: {text:?}"));
        if let Some((schema, ok)) = schemas().get(i) {
            assert!(ok(&v), "{schema}: {v}");
        } else {
            assert_eq!(v.as_array().map(Vec::len), Some(24), "{v}");
        }
    }
}

/// A lazy grammar leaves the text free until its trigger, then binds: greedy decoding
/// under it matches the free run up to the trigger (a whole token of the free run's text),
/// and from the trigger on the text is the grammar's (the trigger, then JSON of the schema).
#[test]
fn a_lazy_grammar_is_free_until_its_trigger_then_binds() {
    let (_dir, model) = common::tiny();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20);
    let compiler = GrammarCompiler::new(&model.tokenizer, model.config.vocab).unwrap();
    let prompt = model.tokenizer.encode("Answer in JSON:", true).unwrap().ids;
    let free = SamplingParams { max_tokens: 24, ignore_eos: true, ..Default::default() };
    let f = LoneSequence::new(&model, &pool).generate(&prompt, &free, &mut |_| true).unwrap();
    // The trigger: the text of a generated token that first occurs where that token starts.
    let (mut start, mut trigger) = (None, String::new());
    for i in 2..f.tokens.len() {
        let before = model.tokenizer.decode(&f.tokens[..i], true).unwrap();
        let piece = model.tokenizer.decode(&f.tokens[i..=i], true).unwrap();
        let piece = piece.trim().to_string();
        if piece.len() >= 2 && f.text.find(&piece).is_some_and(|at| at >= before.len()) {
            start = f.text[before.len()..].find(&piece).map(|d| before.len() + d);
            trigger = piece;
            break;
        }
    }
    let start = start.unwrap_or_else(|| panic!("no usable trigger in {:?}", f.text));
    // Compact JSON (random weights would pad flexible whitespace forever).
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false,
                        "x-guidance": {"whitespace_flexible": false}});
    let lark = format!("start: {} %json {}", serde_json::to_string(&trigger).unwrap(), schema);
    let grammar = compiler.lark(&lark).unwrap().lazy(&trigger);
    assert_eq!(grammar.trigger(), Some(trigger.as_str()));
    let params = SamplingParams { max_tokens: 200, grammar: Some(grammar.clone()), ..Default::default() };
    let g = LoneSequence::new(&model, &pool).generate(&prompt, &params, &mut |_| true).unwrap();
    assert_eq!(g.finish, FinishReason::Stop, "{:?}", g.text);
    assert_eq!(&g.text[..start], &f.text[..start], "free until the trigger");
    let rest = g.text[start..].strip_prefix(trigger.as_str()).unwrap_or_else(|| panic!("{trigger:?} then JSON: {:?}", g.text));
    let v: Value = serde_json::from_str(rest).unwrap_or_else(|e| panic!("{e}: {:?}", g.text));
    assert!(v["ok"].is_boolean(), "{v}");
    assert!(grammar.accepts(&model.tokenizer, &g.text[start..]), "the bound text is a sentence of the grammar");
    assert!(!grammar.accepts(&model.tokenizer, &format!("{trigger}{{\"ok\":1}}")), "a value off the schema is not");
}

/// A lazy grammar quiet in `<think>…</think>` ignores its trigger there (a model reasoning
/// about a call does not make one), also when the prompt opened the section; outside it,
/// and without a quiet section, the trigger binds.
#[test]
fn a_lazy_grammar_does_not_watch_inside_a_quiet_section() {
    let (_dir, model) = common::tiny();
    let tok = &model.tokenizer;
    let compiler = GrammarCompiler::new(tok, model.config.vocab).unwrap();
    let lark = "start: \"<tool_call>\" %json {\"type\": \"object\"}";
    let lazy = compiler.lark(lark).unwrap().lazy("<tool_call>");
    let quiet = lazy.quiet_between("<think>", "</think>");
    assert!(quiet.wants_prompt_tail() && !lazy.wants_prompt_tail());
    let feed = |st: &mut engram_engine::GrammarState, pieces: &[&str]| {
        for p in pieces {
            st.observe(tok, u32::MAX, p);
        }
        st.is_bound()
    };
    // Split across pieces, inside the section: not armed; after it: armed.
    let mut st = quiet.start();
    assert!(!feed(&mut st, &["<thi", "nk>I could use <tool_", "call> here", "</th"]));
    assert!(feed(&mut st, &["ink>\n<tool_call>"]));
    // The prompt left the section open: the answer starts inside it.
    let mut st = quiet.start_after("<|im_start|>assistant\n<think>\n");
    assert!(!feed(&mut st, &["<tool_call> maybe"]));
    assert!(feed(&mut st, &["</think>", "<tool_call>"]));
    // A closed section in the prompt: the answer starts outside.
    let mut st = quiet.start_after("<think>\n\n</think>\n\n");
    assert!(feed(&mut st, &["<tool_call>"]));
    // Without a quiet section the trigger binds anywhere.
    let mut st = lazy.start();
    assert!(feed(&mut st, &["<think>", "<tool_call>"]));
}

/// A bound grammar with starts chosen by how the prompt leaves a reasoning section: a
/// sequence whose prompt ends inside `<think>` decodes under the inside grammar (reasoning,
/// then the answer); one whose prompt ends with the section closed, under the answer's alone;
/// any other under the main one (an optional `<think>..</think>`, then the answer).
#[test]
fn a_bound_grammar_starts_as_the_prompt_left_a_section() {
    let (_dir, model) = common::tiny();
    let tok = &model.tokenizer;
    let compiler = GrammarCompiler::new(tok, model.config.vocab).unwrap();
    let rules = "reasoning: text /[ \\t\\n]*/\ntext[suffix=\"</think>\"]: /(?s:.*)/\n";
    let main = compiler.lark(&format!("start: (\"<think>\" reasoning)? \"ok\"\n{rules}")).unwrap();
    let inside = compiler.lark(&format!("start: reasoning \"ok\"\n{rules}")).unwrap();
    let closed = compiler.lark("start: \"ok\"").unwrap();
    let g = main.after_prompt("<think>", "</think>", &inside, &closed);
    assert!(g.wants_prompt_tail() && !main.wants_prompt_tail());
    // Feeds `text`'s tokens; whether every one was allowed and the grammar then complete.
    let run = |mut st: engram_engine::GrammarState, text: &str| {
        let ids = tok.encode(text, false).unwrap().ids;
        let mut done = false;
        for &t in &ids {
            let mut logits = vec![0.0f32; model.config.vocab];
            st.mask(&mut logits).unwrap();
            if !logits[t as usize].is_finite() {
                return false;
            }
            done = st.consume(t).unwrap();
        }
        done
    };
    let opened = "<|im_start|>assistant\n<think>\n";
    assert!(run(g.start_after(opened), "a plan</think>\n\nok"));
    assert!(!run(g.start_after(opened), "ok"), "inside, the section closes before the answer");
    assert!(run(g.start_after("<|im_start|>assistant\n"), "<think>a plan</think>\nok"));
    assert!(run(g.start_after("<|im_start|>assistant\n"), "ok"));
    assert!(!run(g.start_after("<|im_start|>assistant\n"), "a plan</think>ok"));
    assert!(run(g.start_after("<think>\n\n</think>\n\n"), "ok"), "a closed section: the answer's start");
    assert!(!run(g.start_after("<think>\n\n</think>\n\n"), "<think>a plan</think>ok"), "no second section");
}

/// A special token arms a lazy grammar by its id (the decoder hides its text), the grammar
/// (`<[id]>` in Lark) consuming it as its first token; not inside a quiet section.
#[test]
fn a_special_token_trigger_is_matched_on_its_id() {
    let (_dir, model) = common::tiny();
    let tok = &model.tokenizer;
    let compiler = GrammarCompiler::new(tok, model.config.vocab).unwrap();
    let id = tok.token_to_id("<|im_start|>").unwrap();
    assert!(tok.is_special_id(id));
    let g = compiler.lark(&format!("start: <[{id}]> \"ok\"")).unwrap().lazy_on_tokens(&[id]).quiet_between("<think>", "</think>");
    let mut st = g.start();
    assert!(!st.observe(tok, 5, "<|im_start|>"), "its text alone does not arm it");
    assert!(!st.is_bound());
    st.observe(tok, 5, "<think>");
    st.observe(tok, id, "");
    assert!(!st.is_bound(), "not inside the quiet section");
    st.observe(tok, 5, "</think>");
    assert!(!st.observe(tok, id, ""));
    assert!(st.is_bound());
    let mut logits = vec![0.0f32; model.config.vocab];
    st.mask(&mut logits).unwrap();
    let allowed: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize].is_finite()).collect();
    let texts: Vec<String> = allowed.iter().map(|&i| tok.decode(&[i], false).unwrap()).collect();
    assert!(!allowed.is_empty() && texts.iter().all(|t| "ok".starts_with(t.as_str())), "{texts:?}");
}

#[test]
fn a_schema_llguidance_cannot_compile_is_an_error_with_its_message() {
    let (_dir, model) = common::tiny();
    let compiler = GrammarCompiler::new(&model.tokenizer, model.config.vocab).unwrap();
    let e = compiler.json_schema(json!({"type": "object", "properties": {"a": {"type": "nonsense"}}})).unwrap_err();
    assert!(!e.is_empty());
    assert!(compiler.json_schema(json!({"type": "integer", "minimum": 5, "maximum": 1})).is_err(), "unsatisfiable");
    assert!(compiler.json_schema(json!([1])).is_err());
    assert!(compiler.json_object().is_ok());
}

/// The mask's cost at one sequence: decode tokens per second under a grammar and free over
/// the same number of tokens, side by side, and the mask alone (replaying the bound run's
/// tokens through a fresh matcher: `compute_mask` + applying it + `consume`) per token.
/// `cargo test --release -p engram-engine --test it grammar::mask_cost -- --ignored --nocapture`
/// (tiny fixture); `ENGRAM_GRAMMAR_MODEL=path.gguf` measures that model instead.
#[test]
#[ignore]
fn mask_cost() {
    let (_dir, tiny) = common::tiny();
    let (model, rounds) = match std::env::var("ENGRAM_GRAMMAR_MODEL").ok().filter(|p| !p.is_empty()) {
        Some(path) => (Arc::new(engram_model::Model::load(std::path::Path::new(&path)).unwrap()), 1),
        None => (tiny, 3),
    };
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 512 << 20);
    let t = Instant::now();
    let compiler = GrammarCompiler::new(&model.tokenizer, model.config.vocab).unwrap();
    let trie_ms = t.elapsed().as_secs_f64() * 1e3;
    let prompt = model.tokenizer.encode("Answer in JSON:", true).unwrap().ids;
    // Long strings: many tokens under the grammar, every one masked.
    let schema = json!({"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 12, "maxItems": 12});
    let t = Instant::now();
    let grammar = compiler.json_schema(schema).unwrap();
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let (mut free_tps, mut bound_tps, mut mask_us) = (0.0f64, 0.0f64, f64::MAX);
    let mut n = 0;
    for round in 0..rounds {
        let bound = SamplingParams { max_tokens: 400, temperature: 1.0, seed: round, grammar: Some(grammar.clone()), ..Default::default() };
        let b = LoneSequence::new(&model, &pool).generate(&prompt, &bound, &mut |_| true).unwrap();
        n = b.tokens.len();
        let free = SamplingParams { max_tokens: n, temperature: 1.0, seed: round, ignore_eos: true, ..Default::default() };
        let f = LoneSequence::new(&model, &pool).generate(&prompt, &free, &mut |_| true).unwrap();
        assert_eq!(f.tokens.len(), n);
        bound_tps = bound_tps.max(b.timings.decode_tok_s());
        free_tps = free_tps.max(f.timings.decode_tok_s());
        // The mask alone, over the bound run's tokens.
        let mut st = grammar.start();
        let mut logits = vec![0.0f32; model.config.vocab];
        let t = Instant::now();
        for &tok in &b.tokens {
            st.mask(&mut logits).unwrap();
            if model.tokenizer.is_stop_token(tok) || st.consume(tok).unwrap() {
                break;
            }
        }
        mask_us = mask_us.min(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    eprintln!(
        "vocab {}, 1 sequence, {n} tokens: {free_tps:.0} tok/s free, {bound_tps:.0} tok/s under a JSON schema; \
         the mask alone {mask_us:.1} us/token ({:.2}% of a free token's {:.1} us); trie {trie_ms:.0} ms, schema {compile_ms:.1} ms",
        model.config.vocab,
        100.0 * mask_us / (1e6 / free_tps),
        1e6 / free_tps
    );
}
