//! The session store on a model with sliding layers (`tiny-gemma3`: five layers over a
//! 16-position window, one global), where caches release those layers outside their window:
//! restores and admission ask the pool for what such a cache holds, not for full history, and a
//! checkout whose reuse a resume point cut back says so. Every turn is checked against a cold
//! run on a pool of its own.

use engram_context::{MatchKind, PersistedSessions, SessionStore};
use engram_engine::{LoneSequence, SamplingParams};
use engram_fixture::Shape;
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv, SlidingLayers, BLOCK_TOKENS};
use engram_model::Model;

fn gemma3() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::TinyGemma3, engram_fixture::DEFAULT_SEED, dir.path(), &[], &mut |_| {}).unwrap();
    let m = Model::load(&files.hf_dir).unwrap();
    (dir, m)
}

fn layout(m: &Model) -> KvLayout {
    KvLayout::of(&m.config)
}

/// The store over `pool` with a disk tier in `dir` (what a (re)started process opens).
fn open(m: &Model, pool: &KvPool, dir: &std::path::Path) -> SessionStore {
    let fp = engram_kv::cache_fingerprint(m.fingerprint, pool.format());
    let disk = PersistedSessions::open(dir, 256 << 20, engram_kv::EvictionPolicy::Lru, fp).unwrap();
    SessionStore::new(pool.clone(), m.fingerprint).with_disk(disk, m.config.vocab).with_sliding(SlidingLayers::of(&m.config))
}

/// The last token's logits of a scored run.
fn last_row(m: &Model, mut logits: Vec<f32>) -> Vec<f32> {
    logits.split_off(logits.len() - m.config.vocab)
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams { max_tokens: n, ignore_eos: true, ..Default::default() }
}

/// A long text: `n` sentences that differ.
fn text(n: usize) -> String {
    (0..n).map(|i| format!("Note {i}: the cache keeps block {} of layer {}. ", i * 7 % 13, i % 5)).collect()
}

/// One turn through `store`, checked against a cold run on `cold_pool` (logits of the last prompt
/// token, greedy tokens); checked in. Returns (kind, reused, the answer).
fn turn(m: &Model, store: &mut SessionStore, owner: &str, text: &str, n: usize, cold_pool: &KvPool) -> (MatchKind, usize, String) {
    let mut co = store.checkout(owner, None, text, true, &m.tokenizer).unwrap();
    if let Some(p) = co.restore.take() {
        assert!(store.verify_restore(p), "a sound session file failed its checksum");
    }
    let (kind, reused, sid) = (co.kind, co.reused, co.session_id.clone());
    assert_eq!(co.kv.len(), reused, "the checkout's cache holds what it reuses");
    let mut hot = LoneSequence::from_parts(m, co.kv, co.tokens[..reused].to_vec());
    let keep = reused.min(co.tokens.len() - 1);
    hot.truncate(keep);
    let hot_logits = last_row(m, hot.score(&co.tokens[keep..]).unwrap());
    let cold_logits = last_row(m, LoneSequence::new(m, cold_pool).score(&co.tokens).unwrap());
    let scale = cold_logits.iter().fold(0f32, |a, x| a.max(x.abs()));
    let err = hot_logits.iter().zip(&cold_logits).fold(0f32, |a, (x, y)| a.max((x - y).abs())) / scale;
    assert!(err < 1e-5, "{owner} {kind:?} reused {reused}: logits differ from cold by {err}");
    hot.truncate(keep);
    let g = hot.generate(&co.tokens, &greedy(n), &mut |_| true).unwrap();
    let c = LoneSequence::new(m, cold_pool).generate(&co.tokens, &greedy(n), &mut |_| true).unwrap();
    assert_eq!(g.tokens, c.tokens, "{owner} {kind:?}: hot and cold greedy tokens differ");
    let (kv, _) = hot.into_parts();
    let mut tokens = co.tokens.clone();
    tokens.extend(&g.tokens);
    let mut ends = co.token_ends.clone();
    ends.extend(g.token_ends.iter().map(|e| e + text.len()));
    store.checkin(owner, &sid, format!("{text}{}", g.text), tokens, ends, kv);
    (kind, reused, g.text)
}

/// A restart's restore asks the pool for what the entry holds (released blocks count their
/// global layer only), not for the session's full history: under a budget that fits the
/// released entry beside another session but not the full history, the restore succeeds
/// without evicting that session, and the turn equals a cold run.
#[test]
fn a_restore_asks_for_the_released_size_not_full_history() {
    let (_files, m) = gemma3();
    let big = KvPool::new(layout(&m), KvFormat::F32, 256 << 20);
    let cold_pool = KvPool::new(layout(&m), KvFormat::F32, 256 << 20);
    let disk = tempfile::tempdir().unwrap();
    let first = text(60);
    let (held, tokens, answer) = {
        let mut store = open(&m, &big, disk.path());
        let (_, _, answer) = turn(&m, &mut store, "alice", &first, 6, &cold_pool);
        let s = store.sessions_of("alice").next().unwrap();
        (s.kv.num_bytes(), s.kv.len(), answer)
        // Dropped: the session is flushed to disk.
    };
    let full = big.bytes_for(tokens);
    let bob_text = "Bob asks one short question about the cache.";
    let bob_tokens = m.tokenizer.encode(bob_text, true).unwrap().ids.len() + 6;
    let bob = big.bytes_for(bob_tokens);
    // Room for the restored entry, bob's session, and the new turn's blocks.
    let turn_room = 8 * big.block_bytes();
    let budget = held + bob + turn_room;
    eprintln!("{tokens} tokens: entry holds {held} bytes, full history {full}; bob {bob}; budget {budget}");
    assert!(bob + full > budget, "the budget must not fit the full history beside bob's session");
    let pool = KvPool::new(layout(&m), KvFormat::F32, budget);
    let mut store = open(&m, &pool, disk.path());
    turn(&m, &mut store, "bob", bob_text, 6, &cold_pool);
    let bob_held = store.sessions_of("bob").next().unwrap().kv.num_bytes();
    assert!(bob_held + full > budget, "asking for full history would evict bob's session");
    let next = format!("{first}{answer} And one more question about block 3?");
    let (kind, reused, _) = turn(&m, &mut store, "alice", &next, 6, &cold_pool);
    assert_eq!(store.restored_count(), 1, "alice's session came back from disk");
    assert_eq!(kind, MatchKind::Extend);
    assert!(reused + 2 >= tokens, "the restored session is reused: {reused} of {tokens}");
    assert_eq!(store.sessions_of("bob").count(), 1, "bob's session was not evicted to make room for full history");
    assert!(pool.used() <= pool.budget());
}

/// Admission asks for what a sliding model's prompt holds while the engine prefills it in steps
/// (`SessionStore::admission_bytes`): at least what the pool is charged at its peak, far less than
/// every layer of every token.
#[test]
fn admission_bytes_bound_a_prefill_in_steps() {
    let (_files, m) = gemma3();
    let step = 64;
    for format in [KvFormat::F32, KvFormat::Q8] {
        let pool = KvPool::new(layout(&m), format, 256 << 20);
        let mut store = SessionStore::new(pool.clone(), m.fingerprint).with_sliding(SlidingLayers::of(&m.config)).with_prefill_step(step);
        let prompt = text(120);
        let co = store.checkout("carol", None, &prompt, true, &m.tokenizer).unwrap();
        let n = co.tokens.len();
        let need = store.admission_bytes(n).expect("a sliding model sizes its prompts");
        let mut gen = LoneSequence::from_parts(&m, co.kv, Vec::new()).with_prefill_chunk(step);
        let mut peak = 0;
        for c in co.tokens.chunks(step) {
            gen.score(c).unwrap();
            peak = peak.max(pool.used());
        }
        eprintln!("{format:?}: {n} prompt tokens charged at most {peak} bytes; admission asks {need}, full history {}", pool.bytes_for(n));
        assert!(peak <= need, "{format:?}: charged {peak} > admission's {need}");
        assert!(need < pool.bytes_for(n) / 2, "{format:?}: admission asks {need} of {} full history", pool.bytes_for(n));
        // Every layer global: the pool's count.
        let plain = SessionStore::new(pool.clone(), m.fingerprint);
        assert_eq!(plain.admission_bytes(n), None);
    }
}

/// A session whose stored tokens are not the text's own tokenization past some point is matched
/// up to that point only; when the sliding layers' window before it was released, the checkout
/// resumes earlier, and its kind says it reuses part of the session (not EXACT).
#[test]
fn a_checkout_cut_back_by_a_resume_point_reports_the_reuse_it_keeps() {
    let (_files, m) = gemma3();
    let g = SlidingLayers::of(&m.config).unwrap();
    let pool = KvPool::new(layout(&m), KvFormat::F32, 256 << 20);
    let cold_pool = KvPool::new(layout(&m), KvFormat::F32, 256 << 20);
    let tok = &m.tokenizer;
    let full = text(40);
    // Tokenized in two pieces split inside a word: the tokens past the split differ from the
    // whole text's own.
    let split = full[..full.len() / 3].rfind("cache").unwrap() + 2;
    let a = tok.encode(&full[..split], true).unwrap();
    let b = tok.encode(&full[split..], false).unwrap();
    let mut tokens = a.ids.clone();
    tokens.extend(&b.ids);
    let mut ends: Vec<usize> = a.offsets.iter().map(|o| o.1).collect();
    ends.extend(b.offsets.iter().map(|o| o.1 + split));
    let mut e = 0;
    for x in ends.iter_mut() {
        e = (*x).max(e);
        *x = e;
    }
    let own = tok.encode(&full, true).unwrap().ids;
    let matched = tokens.iter().zip(&own).take_while(|(x, y)| x == y).count();
    assert!(matched < tokens.len() && matched + 3 * BLOCK_TOKENS < tokens.len(), "the split changes the tokenization early");
    // The session's cache, its sliding layers released (no turn point near the split; with
    // spaced windows, a spaced point before it).
    for spaced in [false, true] {
        let mut kv = SeqKv::new(&pool);
        kv.release_sliding(g.clone());
        if spaced {
            kv.keep_spaced_windows();
        }
        let mut gen = LoneSequence::from_parts(&m, kv, Vec::new());
        gen.prefill(&tokens).unwrap();
        let (kv, _) = gen.into_parts();
        let mut store =
            SessionStore::new(pool.clone(), m.fingerprint).with_sliding(SlidingLayers::of(&m.config)).with_spaced_windows(spaced);
        store.checkin("dave", "s1", full.clone(), tokens.clone(), ends.clone(), kv);
        let (kind, reused, _) = turn(&m, &mut store, "dave", &full, 4, &cold_pool);
        eprintln!("spaced windows {spaced}: matched {matched} tokens, resumed at {reused}: {kind:?}");
        assert!(reused < matched, "the window before the match's end was released: resumed at {reused} of {matched}");
        assert!(!spaced || 2 * reused > matched, "a spaced point after half of the match: resumed at {reused}");
        assert_eq!(kind, if reused == 0 { MatchKind::Miss } else { MatchKind::Diverge }, "reused {reused} of the session's tokens");
        assert!(store.sessions_of("dave").any(|s| s.id == "s1"), "the request continued the session it matched");
    }
}

/// `SessionsConfig::spaced_windows` (`engram serve --sliding-resume-windows`) reaches the
/// store `from_config` builds: its checkouts keep spaced windows or not, and admission sizes a
/// long prompt by what they will hold (turn windows only: less).
#[test]
fn the_sessions_config_chooses_spaced_windows() {
    let (_d, m) = gemma3();
    let pool = KvPool::new(layout(&m), KvFormat::F32, 256 << 20);
    let prompt = text(200);
    let mut asked = Vec::new();
    for spaced in [true, false] {
        let config = engram_context::SessionsConfig { spaced_windows: spaced, ..Default::default() };
        let mut store = SessionStore::from_config(&m, &pool, &config);
        let co = store.checkout("erin", None, &prompt, true, &m.tokenizer).unwrap();
        assert_eq!(co.kv.keeps_spaced_windows(), spaced, "the checkout follows the config");
        asked.push(store.admission_bytes(co.tokens.len()).expect("a sliding model sizes its prompts"));
    }
    assert!(asked[1] < asked[0], "turn windows only hold less than with spaced windows: {asked:?}");
}
