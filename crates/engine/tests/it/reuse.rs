//! A generator that reuses its cached token prefix gives the same greedy
//! tokens and logits as a cold run over the same tokens (invariant 1), for
//! f32 and f16 KV and with the opt-in bf16 attention, and chunked prefill equals
//! one-shot prefill; for q8/q4 KV, reuse adds no more error than the format itself.

use engram_engine::{FinishReason, LoneSequence, SamplingParams};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::{AttentionPrecision, Model};

fn model() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let m = Model::load(&files.hf_dir).unwrap();
    (dir, m)
}

fn pool(m: &Model, f: KvFormat) -> KvPool {
    KvPool::new(KvLayout::of(&m.config), f, 64 << 20)
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams { max_tokens: n, ignore_eos: true, ..Default::default() }
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

#[test]
fn multi_turn_reuse_equals_cold() {
    let (_d, mut m) = model();
    for (format, attention) in
        [(KvFormat::F32, AttentionPrecision::Exact), (KvFormat::F16, AttentionPrecision::Exact), (KvFormat::F16, AttentionPrecision::Bf16)]
    {
        m.set_attention(attention);
        let m = &m;
        let pool = pool(m, format);
        let turn1 = m.tokenizer.encode("The ephemeral stream holds recent dialogue turns.", true).unwrap().ids;
        let mut hot = LoneSequence::new(m, &pool);
        let g1 = hot.generate(&turn1, &greedy(12), &mut |_| true).unwrap();
        // Turn 2 = turn 1 + what was generated + a new message (EXTEND by tokens).
        let mut turn2 = turn1.clone();
        turn2.extend(&g1.tokens);
        turn2.extend(m.tokenizer.encode(" And then the user asked again.", false).unwrap().ids);
        let g2 = hot.generate(&turn2, &greedy(12), &mut |_| true).unwrap();
        assert_eq!(
            g2.timings.cached_tokens,
            turn1.len() + g1.tokens.len() - 1,
            "{format:?} {attention:?}: reused all but the last generated token"
        );
        let mut cold = LoneSequence::new(m, &pool);
        let c2 = cold.generate(&turn2, &greedy(12), &mut |_| true).unwrap();
        assert_eq!(g2.tokens, c2.tokens, "{format:?} {attention:?}: hot vs cold greedy tokens");
        assert_eq!(g2.text, c2.text);

        // Diverge: an edit in the middle keeps only the common prefix.
        let mut turn3 = turn2[..turn1.len() / 2].to_vec();
        turn3.extend(m.tokenizer.encode(" something else entirely", false).unwrap().ids);
        let g3 = hot.generate(&turn3, &greedy(8), &mut |_| true).unwrap();
        assert_eq!(g3.timings.cached_tokens, turn1.len() / 2);
        let c3 = LoneSequence::new(m, &pool).generate(&turn3, &greedy(8), &mut |_| true).unwrap();
        assert_eq!(g3.tokens, c3.tokens, "{format:?} {attention:?}: diverged reuse vs cold");

        // Exact repeat: everything but the last token comes from the cache.
        let g4 = hot.generate(&turn3, &greedy(8), &mut |_| true).unwrap();
        assert_eq!(g4.timings.cached_tokens, turn3.len() - 1);
        assert_eq!(g4.tokens, c3.tokens);
    }
}

#[test]
fn chunked_prefill_logits_equal_one_shot() {
    let (_d, mut m) = model();
    let pool = pool(&m, KvFormat::F32);
    let ids = m.tokenizer.encode(&"Blocks of thirty-two tokens, shared and budgeted. ".repeat(8), true).unwrap().ids;
    assert!(ids.len() > 64);
    // Exact last: the f16 comparison below runs exact.
    for attention in [AttentionPrecision::Bf16, AttentionPrecision::Exact] {
        m.set_attention(attention);
        let whole = LoneSequence::new(&m, &pool).with_prefill_chunk(ids.len()).score(&ids).unwrap();
        for chunk in [1, 7, 32, 33] {
            let got = LoneSequence::new(&m, &pool).with_prefill_chunk(chunk).score(&ids).unwrap();
            let err = max_rel(&got, &whole);
            assert!(err < 1e-5, "{attention:?} chunk {chunk}: {err}");
        }
    }
    let whole = LoneSequence::new(&m, &pool).with_prefill_chunk(ids.len()).score(&ids).unwrap();
    // f16 KV stays close to f32 KV.
    let p16 = KvPool::new(KvLayout::of(&m.config), KvFormat::F16, 64 << 20);
    let got = LoneSequence::new(&m, &p16).score(&ids).unwrap();
    assert!(max_rel(&got, &whole) < 5e-3);
}

#[test]
fn stop_strings_tokens_and_limits() {
    let (_d, m) = model();
    let pool = pool(&m, KvFormat::F16);
    let ids = m.tokenizer.encode("The cache", true).unwrap().ids;
    let free = LoneSequence::new(&m, &pool).generate(&ids, &greedy(20), &mut |_| true).unwrap();
    assert_eq!(free.finish, FinishReason::Length);
    assert_eq!(free.tokens.len(), 20);
    // Stop at a string taken from the free-running output: the text ends right before it.
    let cut = free.text.char_indices().nth(free.text.chars().count() / 2).map(|(i, _)| i).unwrap();
    let stop: String = free.text[cut..].chars().take(3).collect();
    let params = SamplingParams { stop: vec![stop.clone()], ..greedy(20) };
    let mut streamed = String::new();
    let g = LoneSequence::new(&m, &pool)
        .generate(&ids, &params, &mut |s| {
            streamed.push_str(s);
            true
        })
        .unwrap();
    assert_eq!(g.finish, FinishReason::Stop);
    assert!(free.text.starts_with(&g.text) && !g.text.contains(&stop), "{:?} / {:?}", g.text, stop);
    assert_eq!(streamed, g.text, "streamed text equals the result");
    // A stop token ends generation.
    let params = SamplingParams { stop_token_ids: vec![free.tokens[3]], ..greedy(20) };
    let g = LoneSequence::new(&m, &pool).generate(&ids, &params, &mut |_| true).unwrap();
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.tokens.len(), 4);
    // Cancel from the callback.
    let g = LoneSequence::new(&m, &pool).generate(&ids, &greedy(20), &mut |_| false).unwrap();
    assert_eq!(g.finish, FinishReason::Cancelled);
    // Empty prompt and bad params are errors.
    assert!(LoneSequence::new(&m, &pool).generate(&[], &greedy(3), &mut |_| true).is_err());
    let bad = SamplingParams { top_p: 2.0, ..greedy(3) };
    assert!(LoneSequence::new(&m, &pool).generate(&ids, &bad, &mut |_| true).is_err());
}

#[test]
fn budget_exhaustion_is_a_clear_error() {
    let (_d, m) = model();
    let layout = KvLayout::of(&m.config);
    let one_block = KvPool::new(layout, KvFormat::F16, 1).block_bytes();
    let pool = KvPool::new(layout, KvFormat::F16, 2 * one_block);
    let ids: Vec<u32> = (0..100).map(|i| 10 + i % 50).collect();
    let e = LoneSequence::new(&m, &pool).generate(&ids, &greedy(2), &mut |_| true).unwrap_err();
    assert!(e.to_string().contains("budget"), "{e}");
    assert_eq!(pool.used(), 0, "nothing stays charged after the failure");
    let ok = LoneSequence::new(&m, &pool).generate(&ids[..40], &greedy(2), &mut |_| true);
    assert!(ok.is_ok());
}

/// Quantized KV (q8, q4 with their f16 recent window): reuse across turns adds no more error
/// than the format itself — the hot turn's logits are as close to the cold run's as the cold
/// run's are to f32 KV (within a factor), and the window keeps decoding's newest tokens at f16.
#[test]
fn quantized_reuse_stays_within_the_format_error() {
    let (_d, m) = model();
    let turn1 = m.tokenizer.encode("Quantized caches keep a recent window in full precision.", true).unwrap().ids;
    let reference = |format| {
        let pool = pool(&m, format);
        let mut hot = LoneSequence::new(&m, &pool);
        let g1 = hot.generate(&turn1, &greedy(20), &mut |_| true).unwrap();
        let mut turn2 = turn1.clone();
        turn2.extend(&g1.tokens);
        turn2.extend(m.tokenizer.encode(" Next question, please.", false).unwrap().ids);
        // Hot: everything up to the new message comes from the cache (fed token by token).
        let cached = turn1.len() + g1.tokens.len() - 1;
        let (mut kv, toks) = hot.into_parts();
        kv.truncate(cached);
        let mut hot = LoneSequence::from_parts(&m, kv, toks[..cached].to_vec());
        let hot_logits = hot.score(&turn2[cached..]).unwrap();
        let cold_logits = LoneSequence::new(&m, &pool).score(&turn2).unwrap();
        let tail = cold_logits.len() - hot_logits.len();
        (hot_logits, cold_logits[tail..].to_vec())
    };
    let (_, exact) = reference(KvFormat::F32);
    for format in [KvFormat::Q8, KvFormat::Q4] {
        let (hot, cold) = reference(format);
        let format_err = max_rel(&cold, &exact);
        let reuse_err = max_rel(&hot, &cold);
        eprintln!("{format:?}: cold vs f32 {format_err:.3e}, hot vs cold {reuse_err:.3e}");
        assert!(format_err > 0.0, "{format:?} should not be exact");
        assert!(reuse_err <= 2.0 * format_err + 1e-4, "{format:?}: reuse error {reuse_err} vs format error {format_err}");
    }
}

/// A sequence written to disk and restored (blocks mapped; for q8/q4 the
/// f16 recent window of the partial last block read back too) continues
/// exactly as the live one: the same logits, bitwise, in every format.
#[test]
fn a_restored_sequence_continues_as_the_live_one() {
    use engram_kv::persist::{cache_fingerprint, read_entry, write_entry, EntryKind, EntryMeta};
    let (_d, m) = model();
    let dir = tempfile::tempdir().unwrap();
    let history = m.tokenizer.encode("A restored cache must attend its newest tokens as the live one did.", true).unwrap().ids;
    assert!(history.len() % engram_kv::BLOCK_TOKENS != 0, "the history should end in a partial block");
    let next = m.tokenizer.encode(" And then?", false).unwrap().ids;
    for format in KvFormat::ALL {
        let pool = pool(&m, format);
        let mut g = LoneSequence::new(&m, &pool);
        g.prefill(&history).unwrap();
        let (kv, toks) = g.into_parts();
        let fp = cache_fingerprint(m.fingerprint, format);
        let meta = EntryMeta {
            fingerprint: fp.clone(),
            kind: EntryKind::Session,
            owner: "t".into(),
            tokens: toks.clone(),
            text: String::new(),
            offsets: Vec::new(),
            created_unix: 0,
        };
        let path = dir.path().join(format!("{format}.safetensors"));
        write_entry(&path, &meta, &kv).unwrap();
        let (_, restored) = read_entry(&path, &pool, &fp, m.config.vocab).unwrap();
        assert_eq!(restored.window().is_some(), pool.has_window(), "{format:?}");
        let live = LoneSequence::from_parts(&m, kv.fork(kv.len()), toks.clone()).score(&next).unwrap();
        let warm = LoneSequence::from_parts(&m, restored, toks).score(&next).unwrap();
        assert!(live == warm, "{format:?}: restored logits differ from the live sequence's by {}", max_rel(&warm, &live));
    }
}
