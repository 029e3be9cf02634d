//! The dual-stream hybrid mode (the dual-stream design's fitness-app case): a thread's
//! state entry is pinned first in its ring, right after the anchors; replaced in place on each
//! update (only its tokens prefilled, the turns after it moved); never evicted however many
//! turns pass; never masked by relevance, however dissimilar. Its logits against a reference
//! are checked step by step by `tests/dual_fuzz.rs`; here, its place in the view.

use std::sync::Arc;

use engram_dual::{DualStream, Relevance};
use engram_embed::{Embeddings, TextEncoder};
use engram_engine::{ContextPolicy, Retired};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, KvView, SeqKv};
use engram_model::{KvCache, Logits, Model, SeqStep};

/// Every text the same direction but the query's opposite: with threshold 0.5 every turn
/// with an embedding is masked but the last.
#[derive(Debug)]
struct Opposed;
impl TextEncoder for Opposed {
    fn id(&self) -> &str {
        "opposed"
    }
    fn dim(&self) -> usize {
        2
    }
    fn describe(&self) -> String {
        "test encoder".into()
    }
    fn encode(&self, texts: &[String]) -> engram_embed::Result<Embeddings> {
        Ok(Embeddings {
            vectors: texts.iter().map(|t| vec![if t.len() % 2 == 0 { 1.0 } else { -1.0 }, 0.0]).collect(),
            num_tokens: vec![1; texts.len()],
        })
    }
}

/// The positions a checkout's view attends, in order.
fn positions(pool: &KvPool, c: &engram_policy::Checkout) -> Vec<usize> {
    let view = KvView::new(c.spans.clone(), SeqKv::new(pool));
    let mut out = Vec::new();
    view.for_each_chunk(0, &mut |ch| {
        for t in 0..ch.len {
            if ch.mask.is_none_or(|m| m[t]) {
                out.push(ch.positions.map_or(ch.first_pos + t, |p| p[t] as usize));
            }
        }
    });
    out
}

#[test]
fn the_state_entry_is_first_replaced_in_place_never_evicted_never_masked() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let m = Arc::new(Model::load(&files.hf_dir).unwrap());
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let encoder: Arc<dyn TextEncoder> = Arc::new(Opposed);
    let mut p = DualStream::new(m.clone(), pool.clone(), 40).with_relevance(Relevance { encoder, threshold: 0.5, keep_last: 1 });
    let anchors: Vec<u32> = (20..26).collect();
    p.set_anchors("u", anchors.clone());
    let a = anchors.len();
    p.set_state("u", "t", (100..105).collect()).unwrap();
    assert_eq!(p.dual_stats().state_tokens_prefilled, 0, "prefilled by the engine, not by the call");
    // The user's stream first (the entry is computed over it), then the entry.
    assert_eq!(engram_engine::drain_background(&m, pool.clone(), &mut p), 2);
    assert_eq!(p.dual_stats().state_tokens_prefilled, 5);

    let mut state_len = 5;
    for turn in 0..12usize {
        // Prompts alternate in parity of their text's length, so earlier turns are masked.
        let prompt: Vec<u32> = (200 + turn as u32 * 10..200 + turn as u32 * 10 + 4 + (turn as u32 % 3)).collect();
        let c = p.admit_tokens("u", Some("t"), &prompt, &m.tokenizer).unwrap();
        let seen = positions(&pool, &c);
        let want_prefix: Vec<usize> = (0..a + state_len).collect();
        assert_eq!(&seen[..a + state_len], &want_prefix[..], "turn {turn}: anchors then the state entry, always attended");
        let mut view = KvView::new(c.spans, SeqKv::new(&pool)).starting_at(c.own_first);
        let first = view.own_first_position();
        view.own_mut().reserve(c.tokens.len()).unwrap();
        let pos: Vec<u32> = (first..first + c.tokens.len()).map(|x| x as u32).collect();
        let step = SeqStep { positions: Some(&pos), ..SeqStep::new(&c.tokens, 0, &mut view, Logits::None) };
        m.forward(&mut [step]).unwrap();
        let n = c.tokens.len();
        p.retire(Retired {
            owner: "u".into(),
            session_id: "t".into(),
            text: String::new(),
            tokens: c.tokens,
            token_ends: vec![0; n],
            kv: view.into_own(),
            cache: None,
            unfed: None,
        });
        if turn == 5 {
            // Replaced in place by a longer one: only its 9 tokens prefilled.
            let before = p.dual_stats().state_tokens_prefilled;
            p.set_state("u", "t", (300..309).collect()).unwrap();
            engram_engine::drain_background(&m, pool.clone(), &mut p);
            assert_eq!(p.dual_stats().state_tokens_prefilled - before, 9);
            state_len = 9;
        }
    }
    let s = p.dual_stats();
    assert!(s.turns_evicted > 0, "turns were evicted past the capacity: {s:?}");
    assert!(s.turns_masked > 0, "turns were masked: {s:?}");
    assert_eq!(s.states_set, 2);

    // Removed: the turns move up behind the anchors (the next turn starts state_len earlier).
    let before = p.admit_tokens("u", Some("t"), &[7, 8, 9], &m.tokenizer).unwrap().own_first.unwrap();
    p.set_state("u", "t", Vec::new()).unwrap();
    let after = p.admit_tokens("u", Some("t"), &[7, 8, 9], &m.tokenizer).unwrap().own_first.unwrap();
    assert_eq!(before - after, state_len);
}
