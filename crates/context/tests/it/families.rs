//! Each model family's chat through the session store: a six-turn conversation rendered by the
//! family's own chat template, long enough to cross the sliding-window layers' windows many
//! times, every turn reusing the previous turn's cache and answering as a cold run does —
//! including the turn right after a restart from disk. With sliding layers the sessions keep
//! those layers' window only (plus the window before each turn's start), in RAM and on disk.

use engram_context::{PersistedSessions, SessionStore};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, SlidingLayers, BLOCK_TOKENS};
use engram_model::Model;
use engram_tokenizer::ChatMessage;

use crate::sessions::turn_on;

const QUESTIONS: [&str; 6] = [
    "Which blocks of the cache does a new turn reuse when the text extends the last one?",
    "And when a user edits an earlier message, what happens to the blocks after the edit?",
    "How are the sliding layers handled when the conversation is longer than their window?",
    "After a restart, where does the first request find the conversation it continues?",
    "What does the store do when the disk budget is full and a new session must be written?",
    "Summarize the answers so far in one sentence, please.",
];

/// The store over `pool` with a disk tier in `dir`: what a (re)started process opens.
fn open(m: &Model, pool: &KvPool, dir: &std::path::Path) -> SessionStore {
    let fp = engram_kv::cache_fingerprint(m.fingerprint, pool.format());
    let disk = PersistedSessions::open(dir, 256 << 20, engram_kv::EvictionPolicy::Lru, fp).unwrap();
    SessionStore::new(pool.clone(), m.fingerprint).with_disk(disk, m.config.vocab).with_sliding(SlidingLayers::of(&m.config))
}

fn six_turns_reuse_the_last_turn_and_equal_cold(shape: Shape) {
    let files_dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(shape, engram_fixture::DEFAULT_SEED, files_dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let m = Model::load(&files.hf_dir).unwrap();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 256 << 20);
    let disk = tempfile::tempdir().unwrap();
    let mut store = open(&m, &pool, disk.path());
    let tok = &m.tokenizer;
    let tpl = tok.chat_template().expect("every fixture carries its family's chat template");
    let mut messages = vec![ChatMessage::new("system", "You answer questions about a KV cache for language models, briefly.")];
    let mut last_prompt_tokens = 0;
    for (i, q) in QUESTIONS.iter().enumerate() {
        if i == 3 {
            // A restart: the store is dropped (its sessions flushed to disk) and opened again.
            drop(store);
            store = open(&m, &pool, disk.path());
        }
        messages.push(ChatMessage::new("user", *q));
        let text = tpl.render(&messages, true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or("")).unwrap();
        // `turn_on` checks the turn against a cold run (logits and greedy tokens).
        let (kind, reused, answer) = turn_on(&m, &mut store, "alice", &text, 6);
        let prompt_tokens = tok.encode(&text, true).unwrap().ids.len();
        let name = shape.name();
        if i > 0 {
            // The previous turn's prompt is all common text: at most a token at its end
            // (a merge across the boundary) is computed again.
            assert!(
                reused + 2 >= last_prompt_tokens,
                "{name} turn {i}: {kind:?} reused {reused} of the last prompt's {last_prompt_tokens}"
            );
        }
        if i == 3 {
            assert_eq!(store.restored_count(), 1, "{name}: the turn after the restart continues the session from disk");
        }
        last_prompt_tokens = prompt_tokens;
        messages.push(ChatMessage::new("assistant", answer));
        // What the session holds: every layer's rows of the window (and of the window before
        // each turn's start, where a later request may resume), global layers' of every token.
        let s = store.sessions_of("alice").next().expect("the session is kept");
        let (n, held) = (s.kv.len(), s.kv.num_bytes());
        let full = pool.bytes_for(n);
        eprintln!(
            "{name} turn {i}: {n} tokens of history hold {held} KV bytes ({:.0} per token; full history {} per token), {} blocks released",
            held as f64 / n as f64,
            full / n.max(1),
            s.kv.num_released_blocks()
        );
        match SlidingLayers::of(&m.config) {
            None => assert_eq!(held, full, "{name}: every layer global keeps every token"),
            Some(g) => {
                // Exactly what the release rule leaves: the live window, the windows before the
                // last turns' points and before the spaced points (`SeqKv::keep_spaced_windows`).
                assert_eq!(held, g.bytes_held(&pool, n, 0, s.kv.resume_points(), true), "{name} turn {i}: held bytes");
                let per_turn = (g.window().div_ceil(BLOCK_TOKENS) + 1) * pool.block_bytes();
                let points = engram_kv::MAX_RESUME_POINTS + g.spaced_points(n).len();
                let bound = g.bytes_for(&pool, n, 0) + points * per_turn;
                assert!(held <= bound.min(full), "{name} turn {i}: {held} bytes held, at most {bound} (full history {full})");
                assert!(i < 2 || s.kv.num_released_blocks() > 0, "{name} turn {i}: history past the window is released");
            }
        }
    }
    // An edited last question: the request diverges inside the last turn. It resumes where the
    // sliding layers' window is whole (the last turn's start is kept) and answers as a cold run.
    let kept_turn_start = messages.len() - 2;
    let mut edited = messages[..kept_turn_start].to_vec();
    edited.push(ChatMessage::new("user", "Instead: what does a restart cost?"));
    let text = tpl.render(&edited, true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or("")).unwrap();
    let before = tpl.render(&messages[..kept_turn_start], false, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or("")).unwrap();
    let (kind, reused, _) = turn_on(&m, &mut store, "alice", &text, 6);
    let turn_start = tok.encode(&before, true).unwrap().ids.len();
    eprintln!("{} edited last question: {kind:?}, reused {reused} (the last turn starts at {turn_start})", shape.name());
    // (A template that renders history otherwise than it rendered the live turn, Qwen3 dropping
    // the reasoning of earlier answers, diverges earlier by text: only the sliding families'
    // resume point is checked here.)
    if SlidingLayers::of(&m.config).is_some() {
        assert!(reused + 2 >= turn_start, "{}: the edit resumes at the last turn's start or later ({reused} < {turn_start})", shape.name());
    }
    let widest = (0..m.config.num_layers).filter_map(|l| m.config.layer_attention(l).window()).max();
    assert!(widest.is_none_or(|w| last_prompt_tokens > 4 * w), "{}: the chat crosses the window several times", shape.name());
}

#[test]
fn gemma3_sliding_layers() {
    six_turns_reuse_the_last_turn_and_equal_cold(Shape::TinyGemma3);
}

#[test]
fn gemma2_sliding_layers_and_softcaps() {
    six_turns_reuse_the_last_turn_and_equal_cold(Shape::TinyGemma2);
}

#[test]
fn qwen3_template_and_qk_norms() {
    six_turns_reuse_the_last_turn_and_equal_cold(Shape::TinyQwen3);
}

#[test]
fn qwen3_moe_template_and_experts() {
    six_turns_reuse_the_last_turn_and_equal_cold(Shape::TinyQwen3Moe);
}

#[test]
fn phi3_template_and_fused_weights() {
    six_turns_reuse_the_last_turn_and_equal_cold(Shape::TinyPhi3);
}

/// Edits of each turn of the six-turn chat: the request diverges inside turn `k`; it resumes
/// where the sliding layers' window is whole and answers as a cold run. With spaced windows
/// (the store's default) it resumes after half of the divergence point and less than
/// `max(2·spacing, 3·(tokens after it))` before it; with the last turns' windows only, an edit
/// before them recomputes from further back. Prints the tokens recomputed for each `k` both ways.
fn an_edit_of_each_turn_resumes_near_it(shape: Shape) {
    let files_dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(shape, engram_fixture::DEFAULT_SEED, files_dir.path(), &[], &mut |_| {}).unwrap();
    let m = Model::load(&files.hf_dir).unwrap();
    let g = SlidingLayers::of(&m.config).expect("a sliding family");
    let s = g.spacing();
    let tok = &m.tokenizer;
    let tpl = tok.chat_template().unwrap();
    let render =
        |msgs: &[ChatMessage], gen: bool| tpl.render(msgs, gen, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or("")).unwrap();
    let mut recomputed = Vec::new();
    for spaced in [false, true] {
        let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 256 << 20);
        let mut store = SessionStore::new(pool.clone(), m.fingerprint).with_sliding(Some(g.clone())).with_spaced_windows(spaced);
        let mut messages = vec![ChatMessage::new("system", "You answer questions about a KV cache for language models, briefly.")];
        for q in QUESTIONS {
            messages.push(ChatMessage::new("user", q));
            let (_, _, answer) = turn_on(&m, &mut store, "alice", &render(&messages, true), 6);
            messages.push(ChatMessage::new("assistant", answer));
        }
        let mut row = Vec::new();
        for k in 0..QUESTIONS.len() {
            let mut edited = messages[..1 + 2 * k].to_vec();
            edited.push(ChatMessage::new("user", "Instead: what does a restart cost?"));
            let text = render(&edited, true);
            // Where the request diverges from the whole chat's session, as the store matches it.
            let (n, d) = {
                let s = store.sessions_of("alice").max_by_key(|s| s.kv.len()).unwrap();
                let c = s.text.bytes().zip(text.bytes()).take_while(|(a, b)| a == b).count();
                let by_text = s.token_ends.iter().take_while(|&&e| e <= c).count();
                let ids = tok.encode(&text, true).unwrap().ids;
                (s.kv.len(), s.tokens[..by_text].iter().zip(&ids).take_while(|(a, b)| a == b).count())
            };
            let (_, reused, _) = turn_on(&m, &mut store, "alice", &text, 4);
            let prompt = tok.encode(&text, true).unwrap().ids.len();
            assert!(reused <= d, "{} turn {k}: reused {reused} past the divergence {d}", shape.name());
            if spaced {
                assert!(d < s || 2 * reused > d, "{} turn {k}: diverging at {d}, resumed at {reused}", shape.name());
                assert!(d - reused < (2 * s).max(3 * (n - d)), "{} turn {k}: diverging at {d} of {n}, resumed at {reused}", shape.name());
            }
            row.push((d, reused, prompt - reused, prompt - d));
        }
        recomputed.push(row);
    }
    eprintln!("{}: edit of turn k of 6 (divergence token, resumed at, tokens recomputed, of which the edit itself needs)", shape.name());
    for k in 0..QUESTIONS.len() {
        let ((d, r0, c0, need), (_, r1, c1, _)) = (recomputed[0][k], recomputed[1][k]);
        eprintln!("  turn {k}: diverges at {d}; last turns' windows only: resumes at {r0}, recomputes {c0}; spaced: resumes at {r1}, recomputes {c1}; needed {need}");
        assert!(c1 <= c0, "{} turn {k}: spaced windows recompute no more", shape.name());
    }
}

#[test]
fn gemma3_an_edit_of_each_turn_resumes_near_it() {
    an_edit_of_each_turn_resumes_near_it(Shape::TinyGemma3);
}

#[test]
fn gemma2_an_edit_of_each_turn_resumes_near_it() {
    an_edit_of_each_turn_resumes_near_it(Shape::TinyGemma2);
}
