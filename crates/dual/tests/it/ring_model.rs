//! The ring on a real forward pass: turns computed on the ring's view (anchors and earlier
//! turns as spans, the new turn at the ring's next position) and kept in the ring give the
//! same logits as one cold sequence over anchors + every turn, while nothing is evicted or
//! masked; after an eviction the moved turns are attended at their packed positions, and a
//! turn whose KV does not sit at the ring's next position is refused.

use crate::common;
use engram_dual::{TurnMask, TurnRing};
use engram_kv::{KvFormat, KvLayout, KvPool, KvView, SeqKv};
use engram_model::{Logits, Model, SeqStep};

/// Computes `tokens` as the next turn on `ring`'s view; returns its logits and its KV.
fn turn(m: &Model, pool: &KvPool, ring: &TurnRing, tokens: &[u32]) -> (Vec<f32>, SeqKv) {
    let view = ring.view(&TurnMask::All);
    let first = view.next_position as u32;
    let mut kv = KvView::new(view.spans, SeqKv::new(pool));
    kv.own_mut().reserve(tokens.len()).unwrap();
    let positions: Vec<u32> = (first..first + tokens.len() as u32).collect();
    let step = SeqStep { tokens, first_pos: 0, positions: Some(&positions), key_mask: None, kv: &mut kv, logits: Logits::All };
    let logits = m.forward(&mut [step]).unwrap().remove(0);
    (logits, kv.into_own())
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn turns_on_the_ring_equal_one_cold_sequence_until_something_is_forgotten() {
    let m = common::model();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let ids = |t: &str, special: bool| m.tokenizer.encode(t, special).unwrap().ids;
    let anchors = ids("System: answer briefly. The user likes Rust.", true);
    let turns = [
        ids(" User: what is a KV cache? Assistant: keys and values of past tokens.", false),
        ids(" User: and eviction? Assistant: dropping whole turns.", false),
        ids(" User: why whole turns? Assistant: so no question loses its answer.", false),
    ];
    let mut persistent = SeqKv::new(&pool);
    persistent.reserve(anchors.len()).unwrap();
    m.forward(&mut [SeqStep::new(&anchors, 0, &mut persistent, Logits::None)]).unwrap();

    // Cold: everything in one sequence.
    let all: Vec<u32> = anchors.iter().chain(turns.iter().flatten()).copied().collect();
    let mut cold = SeqKv::new(&pool);
    cold.reserve(all.len()).unwrap();
    let cold_logits = m.forward(&mut [SeqStep::new(&all, 0, &mut cold, Logits::All)]).unwrap().remove(0);
    let vocab = m.config.vocab;

    let capacity: usize = turns.iter().map(Vec::len).sum();
    let mut ring = TurnRing::new(persistent, capacity, m.config.rope.clone());
    let mut at = anchors.len();
    for (i, t) in turns.iter().enumerate() {
        let (logits, kv) = turn(m, &pool, &ring, t);
        let want = &cold_logits[at * vocab..(at + t.len()) * vocab];
        let err = max_diff(&logits, want);
        assert!(err < 1e-4, "turn {i}: ring vs cold logits differ by {err}");
        assert!(ring.push(t.clone(), kv, None, false).unwrap().is_empty(), "turn {i}: nothing evicted within capacity");
        at += t.len();
    }

    // One more turn passes the capacity: the oldest turn goes, whole, and the others move
    // down to sit right after the anchors.
    let fourth = ids(" User: thanks! Assistant: you are welcome.", false);
    let (_, kv) = turn(m, &pool, &ring, &fourth);
    let evicted = ring.push(fourth.clone(), kv, None, false).unwrap();
    assert_eq!(evicted, [1], "the oldest turn is evicted whole");
    let firsts: Vec<usize> = ring.turns().map(|t| t.first_position()).collect();
    assert_eq!(firsts, [anchors.len(), anchors.len() + turns[1].len(), anchors.len() + turns[1].len() + turns[2].len()]);
    assert_eq!(ring.next_position(), anchors.len() + turns[1].len() + turns[2].len() + fourth.len());

    // A turn computed elsewhere (not at the ring's next position) is refused.
    let mut stray = SeqKv::new(&pool);
    stray.reserve(fourth.len()).unwrap();
    m.forward(&mut [SeqStep::new(&fourth, 0, &mut stray, Logits::None)]).unwrap();
    assert!(ring.push(fourth, stray, None, false).is_err());
}
