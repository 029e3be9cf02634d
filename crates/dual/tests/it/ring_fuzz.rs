//! The dual-stream fuzz harness for the ephemeral ring (`TurnRing`): random conversations — turn
//! lengths, pinned turns, removals, evictions, relevance masks with random embeddings,
//! thresholds and kept-last counts — checked after every step against a plain model of the
//! policy (a list of turns and the eviction rule, nothing else): the ring holds the turns the
//! model says, and the view attends exactly the expected window — the anchors at `0..P`, then
//! the kept turns in order at packed positions — with every token's key equal to its key
//! computed at that position and its value unchanged. 10,000 conversations.

use engram_dual::{TurnMask, TurnRing};
use engram_embed::cosine;
use engram_kv::{KvFormat, KvLayout, KvPool, KvView, SeqKv};
use engram_model::{KvCache, RopeConfig, RopeStyle};

const LAYOUT: KvLayout = KvLayout { num_layers: 1, num_kv_heads: 2, head_dim: 8 };
const W: usize = LAYOUT.num_kv_heads * LAYOUT.head_dim;

fn rope() -> RopeConfig {
    let half = LAYOUT.head_dim / 2;
    let inv_freq = (0..half).map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / LAYOUT.head_dim as f32)).collect();
    RopeConfig { theta: 10000.0, style: RopeStyle::Neox, inv_freq, scaling: String::new() }
}

/// xorshift64*: a seeded stream, so a failing conversation can be replayed from its seed.
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
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Token `t`'s key at `pos` (every head), and its value (position-free: it names the token).
fn key(rope: &RopeConfig, t: u32, pos: usize) -> Vec<f32> {
    let mut k: Vec<f32> = (0..W).map(|i| ((t as usize * 37 + i * 11) % 23) as f32 / 23.0 - 0.5).collect();
    let (cos, sin) = engram_model::rope::shift(rope, pos as i64);
    for head in k.chunks_exact_mut(LAYOUT.head_dim) {
        engram_model::rope::rotate_head(rope.style, head, &cos, &sin);
    }
    k
}
fn value(t: u32) -> Vec<f32> {
    (0..W).map(|i| t as f32 + i as f32 / 64.0).collect()
}

/// A sequence holding `tokens` at positions `first..`, as a step on a view writes it.
fn kv_at(pool: &KvPool, rope: &RopeConfig, tokens: &[u32], first: usize) -> SeqKv {
    let mut kv = SeqKv::new(pool);
    kv.reserve(tokens.len()).unwrap();
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for (i, &t) in tokens.iter().enumerate() {
        k.extend(key(rope, t, first + i));
        v.extend(value(t));
    }
    kv.write(0, 0, &k, &v, tokens.len());
    if first > 0 {
        let positions: Vec<u32> = (first..first + tokens.len()).map(|p| p as u32).collect();
        kv.place(0, &positions).unwrap();
    }
    kv
}

/// The plain model: turns (id, tokens, pinned, embedding) in order, and the eviction rule.
#[derive(Clone)]
struct PlainTurn {
    id: u64,
    tokens: Vec<u32>,
    pinned: bool,
    embedding: Option<Vec<f32>>,
}

fn evict(turns: &mut Vec<PlainTurn>, capacity: usize) {
    while turns.iter().map(|t| t.tokens.len()).sum::<usize>() > capacity {
        let newest = turns.len() - 1;
        match (0..newest).find(|&i| !turns[i].pinned) {
            Some(i) => {
                turns.remove(i);
            }
            None => break,
        }
    }
}

/// Every attended token of the view, in order: (position, key, value).
fn attended(view: Vec<engram_kv::Span>, pool: &KvPool) -> Vec<(usize, Vec<f32>, Vec<f32>)> {
    let view = KvView::new(view, SeqKv::new(pool));
    let mut out = Vec::new();
    view.for_each_chunk(0, &mut |c| {
        let hd = LAYOUT.head_dim;
        let rb = c.keys.elem.row_bytes(hd);
        for t in 0..c.len {
            if c.mask.is_some_and(|m| !m[t]) {
                continue;
            }
            let (mut k, mut v) = (vec![0f32; W], vec![0f32; W]);
            for h in 0..LAYOUT.num_kv_heads {
                let off = (h * c.capacity + t) * rb;
                c.keys.elem.decode_row(&c.keys.bytes[off..off + rb], &mut k[h * hd..(h + 1) * hd]);
                c.values.elem.decode_row(&c.values.bytes[off..off + rb], &mut v[h * hd..(h + 1) * hd]);
            }
            let pos = c.positions.map_or(c.first_pos + t, |p| p[t] as usize);
            out.push((pos, k, v));
        }
    });
    out
}

fn conversation(seed: u64, pool: &KvPool, rope: &RopeConfig) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut next_token = 1u32;
    let mut fresh = |n: usize| -> Vec<u32> {
        let v: Vec<u32> = (next_token..next_token + n as u32).collect();
        next_token += n as u32;
        v
    };
    let anchors = fresh(rng.below(24));
    let capacity = 8 + rng.below(160);
    let mut ring = TurnRing::new(kv_at(pool, rope, &anchors, 0), capacity, rope.clone());
    let mut plain: Vec<PlainTurn> = Vec::new();
    let mut ids = 0u64;
    for step in 0..4 + rng.below(24) {
        if !plain.is_empty() && rng.below(8) == 0 {
            // Remove a turn (a deleted message).
            let i = rng.below(plain.len());
            let id = plain.remove(i).id;
            assert!(ring.remove(id).unwrap(), "seed {seed} step {step}: turn {id} was there");
        } else {
            let longest = if rng.below(6) == 0 { 2 * capacity } else { 40 };
            let tokens = fresh(1 + rng.below(longest));
            let pinned = rng.below(10) == 0;
            let embedding = (rng.below(5) != 0).then(|| (0..4).map(|_| rng.unit() - 0.5).collect::<Vec<f32>>());
            let kv = kv_at(pool, rope, &tokens, ring.next_position());
            ids += 1;
            plain.push(PlainTurn { id: ids, tokens: tokens.clone(), pinned, embedding: embedding.clone() });
            let before: Vec<u64> = plain.iter().map(|t| t.id).collect();
            evict(&mut plain, capacity);
            let mut evicted = ring.push(tokens, kv, embedding, pinned).unwrap();
            let mut want: Vec<u64> = before.into_iter().filter(|id| !plain.iter().any(|t| t.id == *id)).collect();
            evicted.sort_unstable();
            want.sort_unstable();
            assert_eq!(evicted, want, "seed {seed} step {step}: evicted turns");
        }
        let held: Vec<u64> = ring.turns().map(|t| t.id).collect();
        assert_eq!(held, plain.iter().map(|t| t.id).collect::<Vec<_>>(), "seed {seed} step {step}: turns held");

        // A random mask; the expected window from the plain model.
        let mask = match rng.below(3) {
            0 => TurnMask::All,
            _ => TurnMask::Relevant {
                query: (0..4).map(|_| rng.unit() - 0.5).collect(),
                threshold: rng.unit() * 1.2 - 0.2,
                keep_last: rng.below(3),
            },
        };
        let mut window: Vec<(usize, u32)> = anchors.iter().enumerate().map(|(p, &t)| (p, t)).collect();
        let mut at = anchors.len();
        let (mut want_kept, mut want_masked) = (Vec::new(), Vec::new());
        for (i, t) in plain.iter().enumerate() {
            let keep = match &mask {
                TurnMask::All => true,
                TurnMask::Relevant { query, threshold, keep_last } => {
                    i + keep_last >= plain.len() || t.embedding.as_ref().map_or(true, |e| cosine(e, query) >= *threshold)
                }
            };
            if keep {
                window.extend(t.tokens.iter().enumerate().map(|(j, &tok)| (at + j, tok)));
                want_kept.push(t.id);
            } else {
                want_masked.push(t.id);
            }
            at += t.tokens.len();
        }
        let view = ring.view(&mask);
        assert_eq!((view.attended, view.masked), (want_kept, want_masked), "seed {seed} step {step}: attended and masked turns");
        assert_eq!(view.next_position, at, "seed {seed} step {step}: next position");
        let got = attended(view.spans, pool);
        assert_eq!(got.len(), window.len(), "seed {seed} step {step}: attended tokens");
        for ((pos, k, v), &(want_pos, tok)) in got.iter().zip(&window) {
            assert_eq!((*pos, v.clone()), (want_pos, value(tok)), "seed {seed} step {step}: token {tok}");
            let want_k = key(rope, tok, want_pos);
            let err = k.iter().zip(&want_k).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-4, "seed {seed} step {step}: token {tok}'s key at {want_pos} off by {err}");
        }
    }
}

#[test]
fn ten_thousand_random_conversations_attend_the_expected_window() {
    let pool = KvPool::new(LAYOUT, KvFormat::F32, 1 << 30);
    let rope = rope();
    for seed in 0..10_000 {
        conversation(seed, &pool, &rope);
    }
    assert_eq!(pool.used(), 0, "every turn's blocks are released");
}
