//! Seed 000's fuzz harness at the engine level (issue 15 item 8): random conversations driven
//! through the real [`DualStream`] policy and the model's forward pass, checked after every
//! step against a plain reference of the policy.
//!
//! A conversation has one user with 1–3 threads over a random capacity, persistent cap and
//! relevance threshold, and mixes, at random: turns opened on threads (up to one open per
//! thread, several open at once), turn prompts of random lengths, decode steps, trees of drafts
//! verified in one step with some branches accepted and the rest rejected, turns closed with
//! or without an unfed last token, facts appended, superseded and removed (tombstones,
//! compaction past the cap) — also while turns run —, the system prompt changed, and
//! RESTARTS: the policy is dropped and rebuilt from what the server persists (the user's base
//! anchors and live facts, as `FactStore` keeps them); the rings, the running turns and the
//! carried tokens are lost, and the reference loses them too.
//!
//! The reference ([`Reference`]) keeps its own copy of every token's key and value rows as
//! computed when the token was fed (what a ring keeps: moved, never recomputed) and a plain
//! model of the policy's rules (append-only stream with tombstones and compaction, whole-turn
//! eviction, relevance masks, packed positions). It never reads the policy's caches. At every
//! checked step:
//! - **view**: at admission, the policy's view (its spans, read through `KvView`, every
//!   layer) attends exactly the reference's window: the same number of keys, at the same
//!   positions, each key equal to the reference's key rotated to that position and each value
//!   equal to the reference's (`TOL`);
//! - **logits**: the policy's step on its view gives the logits the reference computes with a
//!   fresh cache holding exactly the window's rows at their positions, then the turn (`TOL`,
//!   the tolerance of `tests/facts.rs`); for a tree, every node's row equals the reference's
//!   chain of the node's ancestors and itself (accepted path and rejected branches alike).
//! While nothing a kept token attended has been forgotten or moved, that reference cache is
//! bitwise a cold prefill of the window's tokens at their positions; after evictions, masks
//! and moves it holds what the seed's design keeps (rows moved, not recomputed).
//!
//! A case is one checked step: a turn's prompt prefill, a decode step or a tree verification.
//! The harness runs conversations until at least 10,000 cases have been checked.

use std::collections::HashMap;
use std::sync::Arc;

use engram_context::SegmentId;
use engram_embed::{cosine, Embeddings, TextEncoder};
use engram_engine::{ContextPolicy, DraftTree, DualStats, DualStream, FactSegment, Relevance, Retired};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, KvView, SeqKv};
use engram_model::{KvCache, Logits, Model, RopeConfig, SeqStep};

const TOL: f32 = 1e-4;
const CASES: usize = 10_000;
const USER: &str = "u";

/// xorshift64*: a seeded stream, so a failing conversation replays from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn tokens(&mut self, vocab: usize, n: usize) -> Vec<u32> {
        // Ids 0..16 hold the fixture's special tokens; ordinary pieces decode to text.
        (0..n).map(|_| 16 + self.below(vocab - 16) as u32).collect()
    }
}

/// A deterministic sentence encoder for relevance masks: each word hashes (FNV-1a) to a
/// point in [-0.5, 0.5)⁴ and a text is the sum of its words. Similar prompts share words, so
/// thresholds split turns both ways; the reference calls the same function.
#[derive(Debug)]
struct WordHash;

fn word_hash(text: &str) -> Vec<f32> {
    let mut v = vec![0f32; 4];
    for w in text.split_whitespace() {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in w.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        for (i, x) in v.iter_mut().enumerate() {
            *x += ((h >> (i * 16)) & 0xffff) as f32 / 65536.0 - 0.5;
        }
    }
    v
}

impl TextEncoder for WordHash {
    fn id(&self) -> &str {
        "word-hash"
    }
    fn dim(&self) -> usize {
        4
    }
    fn describe(&self) -> String {
        "word-hash (the fuzz harness's encoder)".into()
    }
    fn encode(&self, texts: &[String]) -> engram_embed::Result<Embeddings> {
        Ok(Embeddings {
            vectors: texts.iter().map(|t| word_hash(t)).collect(),
            num_tokens: texts.iter().map(|t| t.split_whitespace().count()).collect(),
        })
    }
}

/// A token as the reference keeps it: its id, the position its key was computed at, and its
/// key and value rows for every layer (`[layer][kv_width]`).
#[derive(Clone)]
struct Row {
    token: u32,
    pos: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The model, the pool and the shapes the harness needs.
struct Env {
    m: Arc<Model>,
    pool: KvPool,
    layers: usize,
    width: usize,
    head_dim: usize,
    rope: RopeConfig,
}

impl Env {
    /// `row`'s key moved to `pos` (re-rotated by the difference, as a move does).
    fn key_at(&self, row: &Row, pos: usize) -> Vec<f32> {
        let mut k = row.k.clone();
        if pos != row.pos {
            let (c, s) = engram_model::rope::shift(&self.rope, pos as i64 - row.pos as i64);
            for head in k.chunks_exact_mut(self.head_dim) {
                engram_model::rope::rotate_head(self.rope.style, head, &c, &s);
            }
        }
        k
    }

    /// A fresh cache holding exactly `window`'s rows at their positions (keys rotated there).
    fn cache_of(&self, window: &[(Row, usize)]) -> SeqKv {
        let mut kv = SeqKv::new(&self.pool);
        if window.is_empty() {
            return kv;
        }
        let n = window.len();
        kv.reserve(n).unwrap();
        let positions: Vec<u32> = window.iter().map(|(_, p)| *p as u32).collect();
        kv.place(0, &positions).unwrap();
        for layer in 0..self.layers {
            let (mut k, mut v) = (Vec::with_capacity(n * self.width), Vec::with_capacity(n * self.width));
            for (row, pos) in window {
                k.extend_from_slice(&self.key_at(row, *pos)[layer * self.width..(layer + 1) * self.width]);
                v.extend_from_slice(&row.v[layer * self.width..(layer + 1) * self.width]);
            }
            kv.write(layer, 0, &k, &v, n);
        }
        kv
    }

    /// The rows of `kv`'s slots `first..first + tokens.len()`, computed at `positions`.
    fn rows(&self, kv: &SeqKv, first: usize, tokens: &[u32], positions: &[u32]) -> Vec<Row> {
        let per_layer: Vec<(Vec<f32>, Vec<f32>)> = (0..self.layers).map(|l| kv.read_rows(l, first..first + tokens.len())).collect();
        let w = self.width;
        (0..tokens.len())
            .map(|i| {
                let (mut k, mut v) = (Vec::new(), Vec::new());
                for (lk, lv) in &per_layer {
                    k.extend_from_slice(&lk[i * w..(i + 1) * w]);
                    v.extend_from_slice(&lv[i * w..(i + 1) * w]);
                }
                Row { token: tokens[i], pos: positions[i] as usize, k, v }
            })
            .collect()
    }

    /// Runs `tokens` at `positions` into `kv` (from its slot `kv_len`), its logits as asked.
    fn run(
        &self,
        kv: &mut dyn KvCache,
        first_slot: usize,
        tokens: &[u32],
        positions: &[u32],
        mask: Option<&engram_model::KeyMask>,
        logits: Logits,
    ) -> Vec<f32> {
        let step = SeqStep { positions: Some(positions), key_mask: mask, ..SeqStep::new(tokens, first_slot, kv, logits) };
        self.m.forward(&mut [step]).unwrap().remove(0)
    }
}

fn assert_close(a: &[f32], b: &[f32], what: &dyn Fn() -> String) {
    assert_eq!(a.len(), b.len(), "{}: lengths", what());
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst <= TOL, "{}: differs by {worst}", what());
}

/// The reference's persistent stream: segments as the policy's rules lay them out, and the
/// rows computed so far (slot order; masked segments' rows kept, as the KV keeps them).
#[derive(Clone, Default)]
struct RefStream {
    segs: Vec<(SegmentId, Vec<u32>, bool)>,
    rows: Vec<Row>,
}

impl RefStream {
    fn tokens(&self) -> Vec<u32> {
        self.segs.iter().flat_map(|s| s.1.iter().copied()).collect()
    }
    fn len(&self) -> usize {
        self.segs.iter().map(|s| s.1.len()).sum()
    }
    fn masked(&self) -> Vec<bool> {
        self.segs.iter().flat_map(|s| std::iter::repeat(s.2).take(s.1.len())).collect()
    }
    /// Lays the segments out again (rebuild): rows kept only up to the first differing token.
    fn relayout(&mut self, segs: Vec<(SegmentId, Vec<u32>, bool)>) {
        let old = self.tokens();
        self.segs = segs;
        let common = old.iter().zip(self.tokens()).take_while(|(a, b)| **a == *b).count();
        self.rows.truncate(common);
    }
    /// Live facts only changed: dropped ones masked, new ones appended (append-only).
    fn set_facts(&mut self, live: &[FactSegment]) {
        for s in self.segs.iter_mut() {
            if let SegmentId::Fact(id) = s.0 {
                if !live.iter().any(|f| f.id == id) {
                    s.2 = true;
                }
            }
        }
        for f in live {
            if !self.segs.iter().any(|s| s.0 == SegmentId::Fact(f.id)) {
                self.segs.push((SegmentId::Fact(f.id), f.tokens.clone(), false));
            }
        }
    }
    /// Past the cap, tombstoned segments are dropped (compaction).
    fn enforce_cap(&mut self, cap: usize) {
        if self.len() > cap && self.segs.iter().any(|s| s.2) {
            let live: Vec<_> = self.segs.iter().filter(|s| !s.2).cloned().collect();
            self.relayout(live);
        }
    }
    /// Computes the rows not computed yet, each attending only the live rows before it.
    fn prefill(&mut self, env: &Env) {
        let tokens = self.tokens();
        let have = self.rows.len();
        if have == tokens.len() {
            return;
        }
        let masked = self.masked();
        let window: Vec<(Row, usize)> = self.rows.iter().enumerate().filter(|(s, _)| !masked[*s]).map(|(s, r)| (r.clone(), s)).collect();
        let mut kv = env.cache_of(&window);
        let todo = &tokens[have..];
        kv.reserve(todo.len()).unwrap();
        let positions: Vec<u32> = (have..tokens.len()).map(|p| p as u32).collect();
        let at = window.len();
        env.run(&mut kv, at, todo, &positions, None, Logits::None);
        self.rows.extend(env.rows(&kv, at, todo, &positions));
    }
    /// The attended rows (live slots) at their positions.
    fn window(&self) -> Vec<(Row, usize)> {
        let masked = self.masked();
        self.rows.iter().enumerate().filter(|(s, _)| !masked[*s]).map(|(s, r)| (r.clone(), s)).collect()
    }
}

/// A turn in a reference ring: its rows as computed, its embedding.
struct RefTurn {
    rows: Vec<Row>,
    embedding: Option<Vec<f32>>,
}

#[derive(Default)]
struct RefThread {
    turns: Vec<RefTurn>,
    carry: Option<u32>,
}

/// A turn running on both sides.
struct Open {
    thread: String,
    /// The policy's side: its view and the turn's own KV.
    view: KvView,
    /// The reference's side: the window's rows, then the turn's.
    reference: SeqKv,
    window_len: usize,
    /// The turn's tokens fed so far and the position of its first.
    tokens: Vec<u32>,
    first_pos: usize,
    /// The sampled token not fed yet.
    next: u32,
    embedding: Option<Vec<f32>>,
}

/// The plain model of the policy: rules and rows, nothing of the policy's caches.
struct Reference {
    base: Vec<u32>,
    facts: Vec<FactSegment>,
    stream: RefStream,
    threads: HashMap<String, RefThread>,
    capacity: usize,
    cap: usize,
    threshold: f32,
    keep_last: usize,
}

impl Reference {
    fn refresh_cap(&mut self) {
        self.stream.enforce_cap(self.cap);
    }

    /// Everything a new policy starts from after a restart: the base and the live facts.
    fn restart(&mut self) {
        self.threads.clear();
        let mut segs = vec![(SegmentId::Base, self.base.clone(), false)];
        segs.extend(self.facts.iter().map(|f| (SegmentId::Fact(f.id), f.tokens.clone(), false)));
        self.stream = RefStream { segs, rows: Vec::new() };
        self.refresh_cap();
    }

    /// Which of `thread`'s turns a prompt embedded as `query` attends.
    fn kept(&self, thread: &str, query: &[f32]) -> Vec<bool> {
        let turns = self.threads.get(thread).map_or(&[][..], |t| &t.turns[..]);
        let n = turns.len();
        turns
            .iter()
            .enumerate()
            .map(|(i, t)| i + self.keep_last >= n || t.embedding.as_ref().map_or(true, |e| cosine(e, query) >= self.threshold))
            .collect()
    }

    /// The window a new turn on `thread` attends (rows at positions) and where the turn starts.
    fn window(&mut self, env: &Env, thread: &str, query: &[f32]) -> (Vec<(Row, usize)>, usize) {
        self.stream.prefill(env);
        let mut window = self.stream.window();
        let mut at = self.stream.len();
        let kept = self.kept(thread, query);
        if let Some(t) = self.threads.get(thread) {
            for (turn, keep) in t.turns.iter().zip(kept) {
                for (j, r) in turn.rows.iter().enumerate() {
                    if keep {
                        window.push((r.clone(), at + j));
                    }
                }
                at += turn.rows.len();
            }
        }
        (window, at)
    }

    /// A finished turn joins its thread's ring: the oldest whole turns evicted past the capacity.
    fn push(&mut self, thread: &str, turn: RefTurn, carry: Option<u32>) {
        let t = self.threads.entry(thread.to_string()).or_default();
        t.turns.push(turn);
        while t.turns.iter().map(|t| t.rows.len()).sum::<usize>() > self.capacity && t.turns.len() > 1 {
            t.turns.remove(0);
        }
        t.carry = carry;
    }
}

struct Harness<'a> {
    env: &'a Env,
    rng: Rng,
    seed: u64,
    policy: DualStream,
    reference: Reference,
    open: Vec<Open>,
    next_fact: u64,
    cases: usize,
    accepted: usize,
    rejected: usize,
    restarts: usize,
    /// The policy's counts, summed over its restarts.
    stats: DualStats,
}

impl Harness<'_> {
    fn policy(env: &Env, r: &Reference) -> DualStream {
        let encoder: Arc<dyn TextEncoder> = Arc::new(WordHash);
        let mut p = DualStream::new(env.m.clone(), env.pool.clone(), r.capacity)
            .with_relevance(Relevance { encoder, threshold: r.threshold, keep_last: r.keep_last })
            .with_persistent_cap(r.cap, None);
        p.set_anchors(USER, r.base.clone());
        p.set_facts(USER, r.facts.clone());
        p
    }

    fn add_stats(&mut self) {
        let s = self.policy.dual_stats();
        self.stats.turns_evicted += s.turns_evicted;
        self.stats.turns_masked += s.turns_masked;
        self.stats.rebases += s.rebases;
        self.stats.compactions += s.compactions;
    }

    fn check_stream(&self, what: &str) {
        let s = self.policy.persistent(USER).unwrap();
        let got: Vec<(SegmentId, Vec<u32>, bool)> = s.segments().iter().map(|g| (g.id, g.tokens.clone(), g.masked)).collect();
        assert_eq!(got, self.reference.stream.segs, "seed {}: the persistent stream after {what}", self.seed);
    }

    fn fact_op(&mut self) {
        let vocab = self.env.m.config.vocab;
        let live = self.reference.facts.len();
        let drop = (live > 0 && self.rng.chance(50)).then(|| self.rng.below(live));
        let add = drop.is_none() || self.rng.chance(70);
        if let Some(i) = drop {
            self.reference.facts.remove(i);
        }
        if add {
            self.next_fact += 1;
            let n = 1 + self.rng.below(10);
            let tokens = self.rng.tokens(vocab, n);
            self.reference.facts.push(FactSegment { id: self.next_fact, text: format!("fact {}", self.next_fact), tokens });
        }
        self.policy.set_facts(USER, self.reference.facts.clone());
        let facts = self.reference.facts.clone();
        self.reference.stream.set_facts(&facts);
        self.reference.refresh_cap();
        self.check_stream("a fact change");
    }

    fn anchors_op(&mut self) {
        let n = 1 + self.rng.below(16);
        let base = self.rng.tokens(self.env.m.config.vocab, n);
        self.reference.base = base.clone();
        self.policy.set_anchors(USER, base.clone());
        let mut segs = vec![(SegmentId::Base, base, false)];
        segs.extend(self.reference.facts.iter().map(|f| (SegmentId::Fact(f.id), f.tokens.clone(), false)));
        self.reference.stream.relayout(segs);
        self.reference.refresh_cap();
        self.check_stream("a new system prompt");
    }

    fn restart(&mut self) {
        self.open.clear();
        self.add_stats();
        self.reference.restart();
        self.policy = Harness::policy(self.env, &self.reference);
        self.restarts += 1;
        self.check_stream("a restart");
    }

    /// Picks the next token: the model's choice or, as a sampler may, another one.
    fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.rng.chance(50) {
            engram_engine::argmax(logits)
        } else {
            self.rng.tokens(self.env.m.config.vocab, 1)[0]
        }
    }

    fn open_turn(&mut self, thread: String) {
        let env = self.env;
        let n = 1 + self.rng.below(20);
        let prompt = self.rng.tokens(env.m.config.vocab, n);
        let c = self.policy.admit(USER, Some(&thread), None, false, &prompt, &env.m.tokenizer).unwrap();
        let text = env.m.tokenizer.decode(&prompt, true).unwrap();
        let query = word_hash(&text);
        let carry = self.reference.threads.get(&thread).and_then(|t| t.carry);
        if let Some(t) = self.reference.threads.get_mut(&thread) {
            t.carry = None;
        }
        let tokens: Vec<u32> = carry.into_iter().chain(prompt.iter().copied()).collect();
        let seed = self.seed;
        assert_eq!(c.tokens, tokens, "seed {seed}: the turn's tokens (carried token, then the prompt)");
        let (window, first_pos) = self.reference.window(env, &thread, &query);

        // The view: exactly the window's rows at their positions, every layer.
        let mut view = KvView::new(c.spans, SeqKv::new(&env.pool)).starting_at(c.own_first);
        assert_eq!(view.own_first_position(), first_pos, "seed {seed}: where the turn starts");
        for layer in 0..env.layers {
            let mut got = Vec::new();
            view.for_each_chunk(layer, &mut |ch| {
                let (hd, w) = (env.head_dim, env.width);
                let rb = ch.keys.elem.row_bytes(hd);
                for t in 0..ch.len {
                    if ch.mask.is_some_and(|m| !m[t]) {
                        continue;
                    }
                    let (mut k, mut v) = (vec![0f32; w], vec![0f32; w]);
                    for h in 0..w / hd {
                        let off = (h * ch.capacity + t) * rb;
                        ch.keys.elem.decode_row(&ch.keys.bytes[off..off + rb], &mut k[h * hd..(h + 1) * hd]);
                        ch.values.elem.decode_row(&ch.values.bytes[off..off + rb], &mut v[h * hd..(h + 1) * hd]);
                    }
                    got.push((ch.positions.map_or(ch.first_pos + t, |p| p[t] as usize), k, v));
                }
            });
            assert_eq!(got.len(), window.len(), "seed {seed}: keys attended at layer {layer}");
            for (i, ((pos, k, v), (row, want_pos))) in got.iter().zip(&window).enumerate() {
                assert_eq!(pos, want_pos, "seed {seed}: key {i}'s position (token {})", row.token);
                let w = env.width;
                assert_close(k, &env.key_at(row, *want_pos)[layer * w..(layer + 1) * w], &|| {
                    format!("seed {seed}: key {i} at layer {layer}")
                });
                assert_close(v, &row.v[layer * w..(layer + 1) * w], &|| format!("seed {seed}: value {i} at layer {layer}"));
            }
        }

        // The prompt's prefill on both sides.
        let positions: Vec<u32> = (first_pos..first_pos + tokens.len()).map(|p| p as u32).collect();
        view.own_mut().reserve(tokens.len()).unwrap();
        let got = env.run(&mut view, 0, &tokens, &positions, None, Logits::Last);
        let mut reference = env.cache_of(&window);
        reference.reserve(tokens.len()).unwrap();
        let want = env.run(&mut reference, window.len(), &tokens, &positions, None, Logits::Last);
        assert_close(&got, &want, &|| format!("seed {seed}: the prompt's logits on the view"));
        self.cases += 1;
        let next = self.pick(&got);
        let window_len = window.len();
        self.open.push(Open { thread, view, reference, window_len, tokens, first_pos, next, embedding: Some(query) });
    }

    fn decode(&mut self, i: usize) {
        let env = self.env;
        let seed = self.seed;
        let o = &mut self.open[i];
        let pos = [(o.first_pos + o.tokens.len()) as u32];
        let slot = o.tokens.len();
        o.view.own_mut().reserve(1).unwrap();
        let got = env.run(&mut o.view, slot, &[o.next], &pos, None, Logits::Last);
        o.reference.reserve(1).unwrap();
        let want = env.run(&mut o.reference, o.window_len + slot, &[o.next], &pos, None, Logits::Last);
        assert_close(&got, &want, &|| format!("seed {seed}: a decode step's logits"));
        o.tokens.push(o.next);
        self.cases += 1;
        let next = self.pick(&got);
        self.open[i].next = next;
    }

    /// A tree of drafts after the next token, verified in one step; a random walk accepts
    /// some path (the sampler's choice), every other branch is dropped.
    fn speculate(&mut self, i: usize) {
        let env = self.env;
        let seed = self.seed;
        let vocab = env.m.config.vocab;
        let mut tree = DraftTree::root(self.open[i].next);
        for _ in 0..1 + self.rng.below(3) {
            let depth = 1 + self.rng.below(4);
            // Branches share prefixes now and then.
            let mut branch = if self.rng.chance(30) && tree.len() > 1 { vec![tree.tokens()[1]] } else { Vec::new() };
            branch.extend(self.rng.tokens(vocab, depth));
            tree.insert(&branch, 12);
        }
        let o = &mut self.open[i];
        let base = o.tokens.len();
        let root_pos = (o.first_pos + base) as u32;
        let positions: Vec<u32> = tree.depths().iter().map(|d| root_pos + d).collect();
        let mask = tree.key_mask(o.view.num_keys());
        o.view.own_mut().reserve(tree.len()).unwrap();
        let rows = env.run(&mut o.view, base, tree.tokens(), &positions, Some(&mask), Logits::All);
        let n = tree.len();
        assert_eq!(rows.len(), n * vocab);

        // The walk: at each node the "sampler" takes a child's token (accept) or another.
        let (mut node, mut path) = (0, vec![0usize]);
        let next = loop {
            let children: Vec<usize> = (node + 1..n).filter(|&c| tree.child(node, tree.tokens()[c]) == Some(c)).collect();
            if !children.is_empty() && self.rng.chance(60) {
                node = children[self.rng.below(children.len())];
                path.push(node);
                continue;
            }
            let t = loop {
                let t = self.rng.tokens(vocab, 1)[0];
                if tree.child(node, t).is_none() {
                    break t;
                }
            };
            break t;
        };
        self.accepted += path.len() - 1;
        self.rejected += n - path.len();

        // Every node's row = the reference's chain of its ancestors and itself.
        let chain = |mut c: usize| {
            let mut nodes = vec![c];
            while c != 0 {
                c = (0..c).rev().find(|&p| tree.child(p, tree.tokens()[c]) == Some(c)).unwrap();
                nodes.push(c);
            }
            nodes.reverse();
            nodes
        };
        let o = &mut self.open[i];
        for c in 0..n {
            if path.contains(&c) && c != *path.last().unwrap() {
                continue; // checked as a prefix of the accepted path's chain
            }
            let nodes = chain(c);
            if c == *path.last().unwrap() || !path.contains(&c) {
                let toks: Vec<u32> = nodes.iter().map(|&x| tree.tokens()[x]).collect();
                let pos: Vec<u32> = nodes.iter().map(|&x| positions[x]).collect();
                let mut fork = o.reference.fork(o.reference.len());
                fork.reserve(toks.len()).unwrap();
                let want = env.run(&mut fork, o.window_len + base, &toks, &pos, None, Logits::All);
                for (j, &x) in nodes.iter().enumerate() {
                    assert_close(&rows[x * vocab..(x + 1) * vocab], &want[j * vocab..(j + 1) * vocab], &|| {
                        format!("seed {seed}: the tree's row {x} (depth {j}, accepted path {path:?})")
                    });
                }
            }
        }

        // Keep the accepted path on both sides (the reference recomputes it as a chain).
        let kept: Vec<usize> = path.iter().map(|&x| base + x).collect();
        o.view.own_mut().keep_slots(base, &kept);
        let toks: Vec<u32> = path.iter().map(|&x| tree.tokens()[x]).collect();
        let pos: Vec<u32> = path.iter().map(|&x| positions[x]).collect();
        o.reference.reserve(toks.len()).unwrap();
        env.run(&mut o.reference, o.window_len + base, &toks, &pos, None, Logits::None);
        o.tokens.extend_from_slice(&toks);
        o.next = next;
        self.cases += 1;
    }

    fn close(&mut self, i: usize) {
        let env = self.env;
        let o = self.open.remove(i);
        let unfed = self.rng.chance(50).then_some(o.next);
        let positions: Vec<u32> = (o.first_pos..o.first_pos + o.tokens.len()).map(|p| p as u32).collect();
        let rows = env.rows(&o.reference, o.window_len, &o.tokens, &positions);
        let n = o.tokens.len();
        self.policy.retire(Retired {
            owner: USER.into(),
            session_id: o.thread.clone(),
            text: String::new(),
            tokens: o.tokens,
            token_ends: vec![0; n],
            kv: o.view.into_own(),
            unfed,
        });
        self.reference.push(&o.thread, RefTurn { rows, embedding: o.embedding }, unfed);
    }

    fn conversation(&mut self, steps: usize, threads: usize) {
        for _ in 0..steps {
            let roll = self.rng.below(100);
            let idle: Vec<String> = (0..threads).map(|t| format!("t{t}")).filter(|t| !self.open.iter().any(|o| &o.thread == t)).collect();
            if roll < 2 {
                self.restart();
            } else if roll < 4 {
                self.anchors_op();
            } else if roll < 12 {
                self.fact_op();
            } else if !idle.is_empty() && (self.open.is_empty() || roll < 25) {
                let t = idle[self.rng.below(idle.len())].clone();
                self.open_turn(t);
            } else {
                let i = self.rng.below(self.open.len());
                match self.rng.below(100) {
                    0..=54 => self.decode(i),
                    55..=79 => self.speculate(i),
                    _ => self.close(i),
                }
            }
        }
        while !self.open.is_empty() {
            self.close(0);
        }
    }
}

#[test]
fn random_conversations_attend_the_expected_window_and_answer_as_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let m = Arc::new(Model::load(&files.hf_dir).unwrap());
    let layout = KvLayout::of(&m.config);
    let env = Env {
        pool: KvPool::new(layout, KvFormat::F32, 256 << 20),
        layers: layout.num_layers,
        width: layout.num_kv_heads * layout.head_dim,
        head_dim: layout.head_dim,
        rope: m.config.rope.clone(),
        m,
    };
    let (mut cases, mut conversations, mut accepted, mut rejected, mut restarts) = (0, 0, 0, 0, 0);
    let (mut evicted, mut masked, mut rebases, mut compactions) = (0, 0, 0, 0);
    let mut seed = 0u64;
    while cases < CASES {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let vocab = env.m.config.vocab;
        let base_len = 1 + rng.below(16);
        let reference = Reference {
            base: rng.tokens(vocab, base_len),
            facts: Vec::new(),
            stream: RefStream::default(),
            threads: HashMap::new(),
            capacity: 16 + rng.below(96),
            cap: 24 + rng.below(48),
            threshold: rng.below(100) as f32 / 100.0 * 1.4 - 0.4,
            keep_last: 1 + rng.below(3),
        };
        let threads = 1 + rng.below(3);
        let policy = Harness::policy(&env, &reference);
        let mut h = Harness {
            env: &env,
            rng,
            seed,
            policy,
            reference,
            open: Vec::new(),
            next_fact: 0,
            cases: 0,
            accepted: 0,
            rejected: 0,
            restarts: 0,
            stats: DualStats::default(),
        };
        h.reference.restart();
        h.check_stream("the start");
        h.conversation(80, threads);
        h.add_stats();
        evicted += h.stats.turns_evicted;
        masked += h.stats.turns_masked;
        rebases += h.stats.rebases;
        compactions += h.stats.compactions;
        cases += h.cases;
        accepted += h.accepted;
        rejected += h.rejected;
        restarts += h.restarts;
        conversations += 1;
        drop(h);
        assert_eq!(env.pool.used(), 0, "seed {seed}: every block is released with the policy");
        seed += 1;
    }
    eprintln!(
        "{cases} cases in {conversations} conversations: {accepted} drafts accepted, {rejected} rejected, {restarts} restarts, \
         {evicted} turns evicted, {masked} turn views masked, {rebases} rings moved onto a new stream, {compactions} compactions"
    );
    assert!(
        accepted > 0 && rejected > 0 && restarts > 0 && evicted > 0 && masked > 0 && rebases > 0 && compactions > 0,
        "every kind of step ran"
    );
}
