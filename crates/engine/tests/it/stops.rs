//! A sequence ended by a stop token releases the text held back as a possible stop-string
//! prefix (it was not one): the streamed text and the result both end with it. A
//! `LoneSequence` and the server share the engine's step and `Decoding`, so both end sequences
//! this way (the server side: `crates/server/tests/it/server.rs`).

use engram_engine::{Decoding, FinishReason, LoneSequence, SamplingParams};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

#[test]
fn a_stop_token_releases_text_held_for_a_stop_string() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let m = Model::load(&files.hf_dir).unwrap();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let prompt = m.tokenizer.encode("The cache keeps", true).unwrap().ids;

    // A free run tells which token comes when, and the text before it.
    let free = SamplingParams { max_tokens: 24, ignore_eos: true, ..Default::default() };
    let run = LoneSequence::new(&m, &pool).generate(&prompt, &free, &mut |_| true).unwrap();
    // The first token whose id did not occur before, with text before it.
    let k = (4..run.tokens.len())
        .find(|&k| !run.tokens[..k].contains(&run.tokens[k]) && run.token_ends[k - 1] > 0 && run.token_ends[k - 1] < run.token_ends[k])
        .expect("a fresh token after some text");
    let before = &run.text[..run.token_ends[k - 1]];
    let last_char = before.chars().last().unwrap();
    // A stop string that starts with the text's last character (so it is held back), and
    // the token at `k` as a stop token.
    let params = SamplingParams {
        max_tokens: 24,
        ignore_eos: true,
        stop: vec![format!("{last_char}\u{1}never")],
        stop_token_ids: vec![run.tokens[k]],
        ..Default::default()
    };
    let mut streamed = String::new();
    let g = LoneSequence::new(&m, &pool)
        .generate(&prompt, &params, &mut |t| {
            streamed.push_str(t);
            true
        })
        .unwrap();
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.tokens.len(), k + 1, "stopped at the stop token");
    assert_eq!(g.text, before, "the held-back text is released, not dropped");
    assert_eq!(streamed, before);

    // `Decoding` directly: the same, token by token.
    let mut d = Decoding::new(&m.tokenizer, &prompt, &params, 0);
    let mut released = String::new();
    for &t in &run.tokens[..=k] {
        let a = d.accept(t, true).unwrap();
        released.push_str(&a.release);
        if a.done.is_some() {
            assert_eq!(a.done, Some(FinishReason::Stop));
            break;
        }
    }
    assert_eq!(released, before);
    assert_eq!(d.finished_token_ends().len(), k + 1);
}
