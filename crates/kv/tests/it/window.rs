//! The recent window of the quantized formats: a sequence's partial last
//! block is attended from an f16 copy, full blocks from their quantized rows;
//! the copy is charged, shared by forks until written, and dropped when it
//! no longer covers the last block.

use std::sync::Arc;

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv, BLOCK_TOKENS};
use engram_model::{KvCache, KvElem};

const LAYOUT: KvLayout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 32 };
const W: usize = LAYOUT.num_kv_heads * LAYOUT.head_dim;

fn value(pos: usize, i: usize, tag: f32) -> f32 {
    tag + ((pos * 31 + i * 7) % 97) as f32 * 0.0123 - 0.6
}

fn write(kv: &mut SeqKv, first: usize, n: usize, tag: f32) {
    kv.reserve(n).unwrap();
    for layer in 0..LAYOUT.num_layers {
        let k: Vec<f32> = (0..n * W).map(|j| value(first + j / W, j % W, tag + layer as f32)).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        kv.write(layer, first, &k, &v, n);
    }
}

/// Per chunk of `layer`: (first position, element format, keys token-major).
fn chunks(kv: &SeqKv, layer: usize) -> Vec<(usize, KvElem, Vec<f32>)> {
    let mut out = Vec::new();
    kv.for_each_chunk(layer, &mut |c| {
        let rb = c.keys.elem.row_bytes(LAYOUT.head_dim);
        let mut keys = vec![0f32; c.len * W];
        for t in 0..c.len {
            for h in 0..LAYOUT.num_kv_heads {
                let off = (h * c.capacity + t) * rb;
                let dst = &mut keys[t * W + h * LAYOUT.head_dim..t * W + (h + 1) * LAYOUT.head_dim];
                c.keys.elem.decode_row(&c.keys.bytes[off..off + rb], dst);
            }
        }
        out.push((c.first_pos, c.keys.elem, keys));
    });
    out
}

fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

#[test]
fn the_partial_last_block_is_read_in_f16_and_full_blocks_quantized() {
    for format in [KvFormat::Q8, KvFormat::Q4] {
        let pool = KvPool::new(LAYOUT, format, 1 << 24);
        let mut kv = SeqKv::new(&pool);
        // Token by token, as decoding writes.
        for pos in 0..BLOCK_TOKENS + 7 {
            write(&mut kv, pos, 1, 0.0);
        }
        let c = chunks(&kv, 1);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].1, format.elem(LAYOUT.head_dim), "{format}: a full block is read quantized");
        assert_eq!(c[1].1, KvElem::F16, "{format}: the partial block is read from the window");
        for (j, &x) in c[1].2.iter().enumerate() {
            assert_eq!(x, f16_round(value(BLOCK_TOKENS + j / W, j % W, 1.0)), "{format}: window row {}", j / W);
        }
        let quantized_err = c[0].2.iter().enumerate().map(|(j, &x)| (x - value(j / W, j % W, 1.0)).abs()).fold(0f32, f32::max);
        assert!(quantized_err > 1e-4, "{format}: full block should carry quantization error");
        // Budget: blocks plus one window; all returned on drop.
        assert_eq!(pool.used(), 2 * pool.block_bytes() + pool.window_bytes());
        assert_eq!(kv.num_bytes(), pool.used());
        // Filling the block exactly drops the window and reads it quantized.
        write(&mut kv, BLOCK_TOKENS + 7, BLOCK_TOKENS - 7, 0.0);
        assert!(chunks(&kv, 0).iter().all(|c| c.1 == format.elem(LAYOUT.head_dim)));
        assert_eq!(pool.used(), 2 * pool.block_bytes());
        drop(kv);
        assert_eq!(pool.used(), 0);
    }
}

#[test]
fn one_shot_and_token_by_token_windows_agree() {
    let pool = KvPool::new(LAYOUT, KvFormat::Q4, 1 << 24);
    let (mut a, mut b) = (SeqKv::new(&pool), SeqKv::new(&pool));
    write(&mut a, 0, 2 * BLOCK_TOKENS + 5, 0.0);
    for pos in 0..2 * BLOCK_TOKENS + 5 {
        write(&mut b, pos, 1, 0.0);
    }
    assert_eq!(chunks(&a, 0), chunks(&b, 0));
}

#[test]
fn forks_share_the_window_until_one_writes() {
    let pool = KvPool::new(LAYOUT, KvFormat::Q4, 1 << 24);
    let mut a = SeqKv::new(&pool);
    write(&mut a, 0, BLOCK_TOKENS + 5, 0.0);
    let before = chunks(&a, 0);
    let used = pool.used();
    let mut b = a.fork(a.len());
    assert_eq!(pool.used(), used, "a fork shares blocks and window");
    assert_eq!(chunks(&b, 0), before);
    write(&mut b, BLOCK_TOKENS + 5, 2, 9.0);
    assert_eq!(pool.used(), used + pool.block_bytes() + pool.window_bytes(), "the writer copies block and window");
    assert_eq!(chunks(&a, 0), before, "the original is untouched");
    let after = chunks(&b, 0);
    assert_eq!(after[1].1, KvElem::F16);
    assert_eq!(after[1].2[..5 * W], before[1].2[..], "the copy keeps the shared rows at f16");
    // A fork that ends in an earlier block has no window there.
    let c = a.fork(10);
    assert_eq!(chunks(&c, 0)[0].1, KvFormat::Q4.elem(LAYOUT.head_dim));
}

#[test]
fn truncating_out_of_the_window_releases_it_and_a_new_window_starts_from_the_quantized_rows() {
    let pool = KvPool::new(LAYOUT, KvFormat::Q4, 1 << 24);
    let mut a = SeqKv::new(&pool);
    write(&mut a, 0, BLOCK_TOKENS + 5, 0.0);
    let quantized = chunks(&a, 0)[0].clone();
    a.truncate(20);
    assert_eq!(pool.used(), pool.block_bytes(), "window and the block past the cut released");
    assert_eq!(chunks(&a, 0)[0].1, KvFormat::Q4.elem(LAYOUT.head_dim), "no window for block 0 now");
    // Writing into block 0 again: its first 20 rows come from the quantized block, new rows exact.
    write(&mut a, 20, 3, 5.0);
    let c = chunks(&a, 0);
    assert_eq!(c[0].1, KvElem::F16);
    let q16: Vec<f32> = quantized.2[..20 * W].iter().map(|&x| f16_round(x)).collect();
    assert_eq!(c[0].2[..20 * W], q16[..]);
    assert_eq!(c[0].2[20 * W], f16_round(value(20, 0, 5.0)));
}

#[test]
fn restored_blocks_have_no_window_until_written() {
    let pool = KvPool::new(LAYOUT, KvFormat::Q8, 1 << 24);
    let mut a = SeqKv::new(&pool);
    write(&mut a, 0, 40, 0.0);
    let blocks: Vec<Arc<_>> = a.blocks().to_vec();
    let r = SeqKv::from_blocks(&pool, blocks, 40);
    assert_eq!(chunks(&r, 1)[1].1, KvFormat::Q8.elem(LAYOUT.head_dim));
}

#[test]
fn exact_formats_keep_no_window() {
    for format in [KvFormat::F32, KvFormat::F16] {
        let pool = KvPool::new(LAYOUT, format, 1 << 24);
        let mut a = SeqKv::new(&pool);
        write(&mut a, 0, 5, 0.0);
        assert_eq!(pool.used(), pool.block_bytes());
        assert!(!pool.has_window());
    }
}
