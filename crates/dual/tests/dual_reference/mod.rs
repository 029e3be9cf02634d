//! The fuzz harness's reference (`tests/dual_fuzz.rs`): a plain model of the dual-stream
//! policy's rules (append-only persistent stream with tombstones and compaction, whole-turn
//! eviction, pinned state entries, relevance masks, packed positions) that keeps its own copy
//! of every token's key and value rows as computed when the token was fed, and never reads
//! the policy's caches; plus the seeded RNG and the word-hash encoder both sides use.

use std::collections::HashMap;
use std::sync::Arc;

use engram_dual::FactSegment;
use engram_dual::SegmentId;
use engram_embed::{cosine, Embeddings, TextEncoder};
use engram_kv::{KvPool, SeqKv};
use engram_model::{KvCache, Logits, Model, RopeConfig, SeqStep};

pub const TOL: f32 = 1e-4;

/// xorshift64*: a seeded stream, so a failing conversation replays from its seed.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    pub fn tokens(&mut self, vocab: usize, n: usize) -> Vec<u32> {
        // Ids 0..16 hold the fixture's special tokens; ordinary pieces decode to text.
        (0..n).map(|_| 16 + self.below(vocab - 16) as u32).collect()
    }
}

/// A deterministic sentence encoder for relevance masks: each word hashes (FNV-1a) to a
/// point in [-0.5, 0.5)⁴ and a text is the sum of its words. Similar prompts share words, so
/// thresholds split turns both ways; the reference calls the same function.
#[derive(Debug)]
pub struct WordHash;

pub fn word_hash(text: &str) -> Vec<f32> {
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
pub struct Row {
    pub token: u32,
    pub pos: usize,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// The model, the pool and the shapes the harness needs.
pub struct Env {
    pub m: Arc<Model>,
    pub pool: KvPool,
    pub layers: usize,
    pub width: usize,
    pub head_dim: usize,
    pub rope: RopeConfig,
}

impl Env {
    /// `row`'s key moved to `pos` (re-rotated by the difference, as a move does).
    pub fn key_at(&self, row: &Row, pos: usize) -> Vec<f32> {
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
    pub fn cache_of(&self, window: &[(Row, usize)]) -> SeqKv {
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
    pub fn rows(&self, kv: &SeqKv, first: usize, tokens: &[u32], positions: &[u32]) -> Vec<Row> {
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
    pub fn run(
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

pub fn assert_close(a: &[f32], b: &[f32], what: &dyn Fn() -> String) {
    assert_eq!(a.len(), b.len(), "{}: lengths", what());
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst <= TOL, "{}: differs by {worst}", what());
}

/// The reference's persistent stream: segments as the policy's rules lay them out, and the
/// rows computed so far (slot order; masked segments' rows kept, as the KV keeps them).
#[derive(Clone, Default)]
pub struct RefStream {
    pub segs: Vec<(SegmentId, Vec<u32>, bool)>,
    pub rows: Vec<Row>,
}

impl RefStream {
    pub fn tokens(&self) -> Vec<u32> {
        self.segs.iter().flat_map(|s| s.1.iter().copied()).collect()
    }
    pub fn len(&self) -> usize {
        self.segs.iter().map(|s| s.1.len()).sum()
    }
    pub fn masked(&self) -> Vec<bool> {
        self.segs.iter().flat_map(|s| std::iter::repeat(s.2).take(s.1.len())).collect()
    }
    /// Lays the segments out again (rebuild): rows kept only up to the first differing token.
    pub fn relayout(&mut self, segs: Vec<(SegmentId, Vec<u32>, bool)>) {
        let old = self.tokens();
        self.segs = segs;
        let common = old.iter().zip(self.tokens()).take_while(|(a, b)| **a == *b).count();
        self.rows.truncate(common);
    }
    /// Live facts only changed: dropped ones masked, new ones appended (append-only).
    pub fn set_facts(&mut self, live: &[FactSegment]) {
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
    pub fn enforce_cap(&mut self, cap: usize) {
        if self.len() > cap && self.segs.iter().any(|s| s.2) {
            let live: Vec<_> = self.segs.iter().filter(|s| !s.2).cloned().collect();
            self.relayout(live);
        }
    }
    /// Computes the rows not computed yet, each attending only the live rows before it.
    pub fn prefill(&mut self, env: &Env) {
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
        // Tombstoned slots among the new ones are left out for the others (a tombstoned token
        // sees its own segment): every live token attends exactly the live tokens before it.
        let segment: Vec<usize> = self.segs.iter().enumerate().flat_map(|(i, s)| std::iter::repeat(i).take(s.1.len())).collect();
        let mut mask = engram_model::KeyMask::all(todo.len(), at + todo.len());
        for row in 0..todo.len() {
            for s in have..tokens.len() {
                if masked[s] && segment[s] != segment[have + row] {
                    mask.set(row, at + s - have, false);
                }
            }
        }
        env.run(&mut kv, at, todo, &positions, Some(&mask), Logits::None);
        self.rows.extend(env.rows(&kv, at, todo, &positions));
    }
    /// The attended rows (live slots) at their positions.
    pub fn window(&self) -> Vec<(Row, usize)> {
        let masked = self.masked();
        self.rows.iter().enumerate().filter(|(s, _)| !masked[*s]).map(|(s, r)| (r.clone(), s)).collect()
    }
}

/// A turn in a reference ring: its rows as computed, its embedding, whether it is the
/// thread's state entry (pinned first, never evicted, never masked).
pub struct RefTurn {
    pub rows: Vec<Row>,
    pub embedding: Option<Vec<f32>>,
    pub pinned: bool,
}

#[derive(Default)]
pub struct RefThread {
    pub turns: Vec<RefTurn>,
    pub carry: Option<u32>,
    /// The carry as of the thread's last save (a turn joining the ring, a state entry set or
    /// removed): what a restart gives back.
    pub saved_carry: Option<u32>,
}

/// The plain model of the policy: rules and rows, nothing of the policy's caches.
pub struct Reference {
    pub base: Vec<u32>,
    pub facts: Vec<FactSegment>,
    pub stream: RefStream,
    pub threads: HashMap<String, RefThread>,
    pub capacity: usize,
    pub cap: usize,
    pub threshold: f32,
    pub keep_last: usize,
}

impl Reference {
    pub fn refresh_cap(&mut self) {
        self.stream.enforce_cap(self.cap);
    }

    /// Everything a new policy starts from after a restart: the base and the live facts, and
    /// each thread's ring as last saved (turns whole, moved to follow the new stream) with its
    /// carry as of that save; running turns are lost.
    pub fn restart(&mut self) {
        for t in self.threads.values_mut() {
            t.carry = t.saved_carry;
        }
        let mut segs = vec![(SegmentId::Base, self.base.clone(), false)];
        segs.extend(self.facts.iter().map(|f| (SegmentId::Fact(f.id), f.tokens.clone(), false)));
        self.stream = RefStream { segs, rows: Vec::new() };
        self.refresh_cap();
    }

    /// Which of `thread`'s turns a prompt embedded as `query` attends.
    pub fn kept(&self, thread: &str, query: &[f32]) -> Vec<bool> {
        let turns = self.threads.get(thread).map_or(&[][..], |t| &t.turns[..]);
        let n = turns.len();
        turns
            .iter()
            .enumerate()
            .map(|(i, t)| i + self.keep_last >= n || t.embedding.as_ref().map_or(true, |e| cosine(e, query) >= self.threshold))
            .collect()
    }

    /// The window a new turn on `thread` attends (rows at positions) and where the turn starts.
    pub fn window(&mut self, env: &Env, thread: &str, query: &[f32]) -> (Vec<(Row, usize)>, usize) {
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
    pub fn push(&mut self, thread: &str, turn: RefTurn, carry: Option<u32>) {
        let t = self.threads.entry(thread.to_string()).or_default();
        t.turns.push(turn);
        Self::evict(t, self.capacity);
        t.carry = carry;
        t.saved_carry = carry;
    }

    /// Past the capacity the oldest unpinned turn goes, never the newest.
    pub fn evict(t: &mut RefThread, capacity: usize) {
        while t.turns.iter().map(|t| t.rows.len()).sum::<usize>() > capacity {
            let newest = t.turns.len() - 1;
            match (0..newest).find(|&i| !t.turns[i].pinned) {
                Some(i) => {
                    t.turns.remove(i);
                }
                None => break,
            }
        }
    }

    /// The hybrid mode's state entry: computed on the anchors alone right after them, first
    /// in the ring, replaced in place (or removed when empty).
    pub fn set_state(&mut self, env: &Env, thread: &str, tokens: &[u32]) {
        self.stream.prefill(env);
        let capacity = self.capacity;
        let t = self.threads.entry(thread.to_string()).or_default();
        let has = t.turns.first().is_some_and(|s| s.pinned);
        if tokens.is_empty() {
            if has {
                t.turns.remove(0);
                t.saved_carry = t.carry;
            }
            return;
        }
        let window = self.stream.window();
        let at = self.stream.len();
        let mut kv = env.cache_of(&window);
        kv.reserve(tokens.len()).unwrap();
        let positions: Vec<u32> = (at..at + tokens.len()).map(|p| p as u32).collect();
        env.run(&mut kv, window.len(), tokens, &positions, None, Logits::None);
        let state = RefTurn { rows: env.rows(&kv, window.len(), tokens, &positions), embedding: None, pinned: true };
        if has {
            t.turns[0] = state;
        } else {
            t.turns.insert(0, state);
        }
        Self::evict(t, capacity);
        t.saved_carry = t.carry;
    }
}
