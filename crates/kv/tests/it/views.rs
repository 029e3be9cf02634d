//! Attention over views (`KvView`): random spans (out of order of creation, with gaps, at
//! moved positions, per-head selections) of sequences in every KV format, read by both
//! precisions, with per-row key masks (trees of drafts among them), equal a plain f64
//! reference that applies the same positions and masks to the rows the view yields.

use engram_kv::{KvFormat, KvLayout, KvPool, KvView, SeqKv, Span};
use engram_model::attention::{attend, AttnTask};
use engram_model::{AttentionPrecision, KeyMask, KvCache};
use proptest::prelude::*;

const HD: usize = 64;
const HEADS: usize = 2;
const GROUP: usize = 2;
const LAYOUT: KvLayout = KvLayout { num_layers: 1, num_kv_heads: HEADS, head_dim: HD };

fn rnd(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
}

/// A sequence of `n` random tokens (keys and values of every head).
fn random_seq(pool: &KvPool, n: usize, seed: &mut u64) -> SeqKv {
    let mut kv = SeqKv::new(pool);
    kv.reserve(n).unwrap();
    let w = HEADS * HD;
    let k: Vec<f32> = (0..n * w).map(|_| rnd(seed)).collect();
    let v: Vec<f32> = (0..n * w).map(|_| rnd(seed)).collect();
    kv.write(0, 0, &k, &v, n);
    kv
}

/// Every key the view yields for `head`: (key number, position, key, value), decoded.
fn keys_of(view: &KvView, head: usize) -> Vec<(usize, usize, Vec<f32>, Vec<f32>)> {
    let mut out = Vec::new();
    let read = engram_model::KvRead { layer: 0, kv_head: head, queries: &[], group: GROUP, positions: &[] };
    view.for_each_chunk_of(&read, &mut |c| {
        let rb = c.keys.elem.row_bytes(HD);
        for t in 0..c.len {
            let row = head * c.capacity + t;
            let (mut k, mut v) = (vec![0f32; HD], vec![0f32; HD]);
            c.keys.elem.decode_row(&c.keys.bytes[row * rb..(row + 1) * rb], &mut k);
            c.values.elem.decode_row(&c.values.bytes[row * rb..(row + 1) * rb], &mut v);
            let pos = c.positions.map_or(c.first_pos + t, |p| p[t] as usize);
            out.push((c.key_index + t, pos, k, v));
        }
    });
    out
}

/// Softmax attention in f64 over the keys each query row may see.
fn reference(view: &KvView, q: &[f32], positions: &[u32], mask: Option<&KeyMask>, head: usize) -> Vec<f32> {
    let keys = keys_of(view, head);
    let nq = positions.len();
    let scale = 1.0 / (HD as f64).sqrt();
    let mut out = vec![0f32; nq * GROUP * HD];
    for qi in 0..nq {
        for j in 0..GROUP {
            let h = head * GROUP + j;
            let qr = &q[qi * HEADS * GROUP * HD + h * HD..][..HD];
            let seen: Vec<_> =
                keys.iter().filter(|(idx, pos, _, _)| *pos <= positions[qi] as usize && mask.map_or(true, |m| m.sees(qi, *idx))).collect();
            let scores: Vec<f64> =
                seen.iter().map(|(_, _, k, _)| qr.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale).collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let ws: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let sum: f64 = ws.iter().sum();
            for (w, (_, _, _, v)) in ws.iter().zip(&seen) {
                for d in 0..HD {
                    out[(qi * GROUP + j) * HD + d] += (w / sum * v[d] as f64) as f32;
                }
            }
        }
    }
    out
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

/// One random case: sources, the spans taken (in a shuffled order, some moved, some for one
/// head only), an own sequence, queries at chosen positions and an optional mask.
fn check(format: KvFormat, precision: AttentionPrecision, seed: u64, tree: bool) {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    let pool = KvPool::new(LAYOUT, format, 64 << 20);
    let sources: Vec<SeqKv> = (0..3).map(|i| random_seq(&pool, 20 + 37 * i + (seed as usize % 29), &mut s)).collect();
    let mut spans: Vec<Span> = Vec::new();
    let mut pos = 0u32;
    // Spans from sources in an order other than creation, with gaps and relabelled positions.
    for (i, src) in sources.iter().enumerate().rev() {
        let a = (s as usize >> 3) % (src.len() / 2);
        let b = src.len() - (s as usize >> 7) % (src.len() / 3);
        rnd(&mut s);
        for sp in src.spans(a..b) {
            let n = sp.len() as u32;
            let gap = (s >> 11) as u32 % 5;
            let moved = sp.clone().at_positions(&(pos + gap..pos + gap + n).collect::<Vec<_>>());
            pos += gap + n;
            let heads = if (i + spans.len()) % 4 == 3 { 1 << ((s >> 5) as usize % HEADS) } else { u64::MAX };
            spans.push(moved.for_heads(heads));
        }
    }
    let own_n = 1 + (seed as usize % 40);
    let own = random_seq(&pool, own_n, &mut s);
    let mut view = KvView::new(spans, own);
    // The own tokens at positions after the spans (explicit, as a moved sequence holds them).
    let own_pos: Vec<u32> = (pos..pos + own_n as u32).collect();
    view.place(0, &own_pos).unwrap();
    // Queries: the last few own tokens (a prefill chunk) or a tree over them.
    let nq = own_n.min(1 + seed as usize % 9);
    let first_key = view.num_keys() - nq;
    let (positions, mask): (Vec<u32>, Option<KeyMask>) = if tree {
        // Drafts in two branches at repeated positions: draft i sees the keys before the
        // drafts, and the drafts of its own branch up to itself.
        let base = own_pos[own_n - nq];
        let branch = |i: usize| i % 2;
        let depth = |i: usize| (0..i).filter(|&x| branch(x) == branch(i)).count() as u32;
        let positions: Vec<u32> = (0..nq).map(|i| base + depth(i)).collect();
        let mut m = KeyMask::all(nq, view.num_keys());
        for i in 0..nq {
            for j in 0..nq {
                m.set(i, first_key + j, branch(j) == branch(i) && j <= i);
            }
        }
        view.place(own_n - nq, &positions).unwrap();
        (positions, Some(m))
    } else {
        let positions = own_pos[own_n - nq..].to_vec();
        let mask = (seed % 3 == 0).then(|| {
            let mut m = KeyMask::all(nq, view.num_keys());
            for i in 0..nq {
                for k in (0..view.num_keys()).filter(|k| (k * 7 + i) % 5 == 0) {
                    m.set(i, k, false);
                }
            }
            m
        });
        (positions, mask)
    };
    let q: Vec<f32> = (0..nq * HEADS * GROUP * HD).map(|_| rnd(&mut s)).collect();
    for head in 0..HEADS {
        let task = AttnTask {
            kv: &view,
            layer: 0,
            q: &q,
            num_queries: nq,
            positions: &positions,
            key_mask: mask.as_ref(),
            kv_head: head,
            group: GROUP,
            head_dim: HD,
            num_heads: HEADS * GROUP,
            precision,
        };
        let got = attend(&task);
        let want = reference(&view, &q, &positions, mask.as_ref(), head);
        let err = max_rel(&got, &want);
        let tol = if precision == AttentionPrecision::Exact { 1e-5 } else { 1e-2 };
        assert!(err < tol, "{format:?} {precision:?} seed {seed} tree {tree} head {head}: {err:e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn random_views_equal_the_reference(seed in 0u64..1_000_000, format in 0usize..4, bf16 in any::<bool>(), tree in any::<bool>()) {
        let format = [KvFormat::F32, KvFormat::F16, KvFormat::Q8, KvFormat::Q4][format];
        let precision = if bf16 { AttentionPrecision::Bf16 } else { AttentionPrecision::Exact };
        check(format, precision, seed, tree);
    }
}

#[test]
fn every_format_and_precision_reads_views() {
    for format in [KvFormat::F32, KvFormat::F16, KvFormat::Q8, KvFormat::Q4] {
        for precision in [AttentionPrecision::Exact, AttentionPrecision::Bf16] {
            for (seed, tree) in [(1, false), (2, true), (3, false), (7, true)] {
                check(format, precision, seed, tree);
            }
        }
    }
}

/// A span selected for one KV head is read by that head only, and keeps its key numbers for
/// every head (so a key mask means the same for each).
#[test]
fn a_span_for_one_head_is_read_by_that_head_only() {
    let mut s = 5;
    let pool = KvPool::new(LAYOUT, KvFormat::F16, 16 << 20);
    let a = random_seq(&pool, 40, &mut s);
    let mut spans = a.spans(0..10);
    spans.extend(a.spans(10..40).into_iter().map(|sp| sp.for_heads(1 << 1)));
    let own = random_seq(&pool, 3, &mut s);
    let view = KvView::new(spans, own);
    let numbers = |h| keys_of(&view, h).iter().map(|k| k.0).collect::<Vec<_>>();
    assert_eq!(numbers(0), (0..10).chain(40..43).collect::<Vec<_>>());
    assert_eq!(numbers(1), (0..43).collect::<Vec<_>>());
}

/// Rows not in RAM (`PendingRows`): the reader asks for its layer and waits; once they
/// arrive, attention equals the same rows read from RAM, bitwise. Their bytes are charged
/// from creation to drop.
#[test]
fn rows_that_arrive_later_equal_rows_in_ram() {
    use engram_kv::PendingRows;
    use std::sync::{mpsc, Mutex};
    use std::time::{Duration, Instant};

    let mut s = 11;
    let pool = KvPool::new(LAYOUT, KvFormat::F16, 16 << 20);
    let a = random_seq(&pool, 40, &mut s);
    let sec = pool.section_bytes();
    let block0 = a.blocks()[0].bytes().to_vec();
    let positions: Vec<u32> = (0..32).collect();

    let before = pool.used();
    let (ask, asked) = mpsc::channel::<usize>();
    let ask = Mutex::new(ask);
    let rows = PendingRows::new(&pool, move |layer| ask.lock().unwrap().send(layer).unwrap()).unwrap();
    assert_eq!(pool.used(), before + pool.block_bytes(), "charged before anything arrives");
    let fetcher = {
        let rows = rows.clone();
        std::thread::spawn(move || {
            let layer = asked.recv().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            rows.fill(layer, &block0[2 * layer * sec..(2 * layer + 2) * sec]);
            layer
        })
    };
    let own = |s: &mut u64| random_seq(&pool, 3, s);
    let (mut s1, mut s2) = (99, 99);
    let in_ram = KvView::new(a.spans(0..32), own(&mut s1));
    let later = KvView::new(vec![Span::pending(rows.clone(), 0..32, &positions)], own(&mut s2));
    let q: Vec<f32> = (0..HEADS * GROUP * HD).map(|_| rnd(&mut s)).collect();
    let pos = [40u32];
    for (precision, head) in [(AttentionPrecision::Exact, 0), (AttentionPrecision::Bf16, 1)] {
        let run = |kv: &KvView| -> Vec<f32> {
            attend(&AttnTask {
                kv,
                layer: 0,
                q: &q,
                num_queries: 1,
                positions: &pos,
                key_mask: None,
                kv_head: head,
                group: GROUP,
                head_dim: HD,
                num_heads: HEADS * GROUP,
                precision,
            })
        };
        let t = Instant::now();
        let got = run(&later);
        if head == 0 {
            assert!(t.elapsed() >= Duration::from_millis(15), "the first read waited for the rows");
        }
        assert_eq!(got, run(&in_ram), "{precision:?}: rows that arrived later differ");
    }
    assert_eq!(fetcher.join().unwrap(), 0, "the reader asked for layer 0");
    drop((later, rows));
    drop(in_ram);
    assert_eq!(pool.used(), before, "released with the last reader");
}
