//! The block pool's budget and copy-on-write sharing, without a model.

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv, BLOCK_TOKENS};
use engram_model::{KvCache, KvElem};

const LAYOUT: KvLayout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 4 };

fn write_tokens(kv: &mut SeqKv, first: usize, n: usize, tag: f32) {
    let w = LAYOUT.num_kv_heads * LAYOUT.head_dim;
    for layer in 0..LAYOUT.num_layers {
        let k: Vec<f32> = (0..n * w).map(|i| tag + (first * w + i) as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        kv.write(layer, first, &k, &v, n);
    }
}

fn read_keys(kv: &SeqKv, layer: usize) -> Vec<f32> {
    // Token-major [t][head][d], from head-major chunks.
    let mut out = Vec::new();
    kv.for_each_chunk(layer, &mut |c| {
        let rb = c.keys.elem.row_bytes(LAYOUT.head_dim);
        for t in 0..c.len {
            for h in 0..LAYOUT.num_kv_heads {
                let off = (h * c.capacity + t) * rb;
                let mut row = vec![0f32; LAYOUT.head_dim];
                c.keys.elem.decode_row(&c.keys.bytes[off..off + rb], &mut row);
                out.extend_from_slice(&row);
            }
        }
    });
    out
}

#[test]
fn budget_is_hard_and_released_on_drop() {
    let probe = KvPool::new(LAYOUT, KvFormat::F32, 0);
    let pool = KvPool::new(LAYOUT, KvFormat::F32, 3 * probe.block_bytes());
    let mut a = SeqKv::new(&pool);
    a.reserve(2 * BLOCK_TOKENS).unwrap();
    assert_eq!(pool.used(), 2 * pool.block_bytes());
    let mut b = SeqKv::new(&pool);
    let e = b.reserve(2 * BLOCK_TOKENS).unwrap_err();
    assert!(e.to_string().contains("budget"));
    assert_eq!(pool.used(), 2 * pool.block_bytes(), "a refused reservation charges nothing");
    b.reserve(BLOCK_TOKENS).unwrap();
    assert!(pool.used() <= pool.budget());
    drop(a);
    assert_eq!(pool.used(), pool.block_bytes());
    drop(b);
    assert_eq!(pool.used(), 0);
}

#[test]
fn forks_share_blocks_and_copy_on_write() {
    let pool = KvPool::new(LAYOUT, KvFormat::F32, 1 << 20);
    let mut a = SeqKv::new(&pool);
    let n = BLOCK_TOKENS + 5;
    a.reserve(n).unwrap();
    write_tokens(&mut a, 0, n, 0.0);
    let before = read_keys(&a, 1);
    let used = pool.used();
    let mut b = a.fork(n);
    assert_eq!(pool.used(), used, "a fork shares, it does not copy");
    // b writes into the shared partial block: it must get its own copy.
    b.reserve(3).unwrap();
    assert_eq!(pool.used(), used + pool.block_bytes());
    write_tokens(&mut b, n, 3, 1000.0);
    assert_eq!(read_keys(&a, 1), before, "the original is untouched");
    assert_eq!(&read_keys(&b, 1)[..before.len()], &before[..]);
    assert_eq!(b.len(), n + 3);
    // Truncate then overwrite: positions past the cut are replaced, not appended.
    b.truncate(BLOCK_TOKENS + 1);
    assert_eq!(b.len(), BLOCK_TOKENS + 1);
    assert_eq!(read_keys(&b, 0).len(), (BLOCK_TOKENS + 1) * LAYOUT.num_kv_heads * LAYOUT.head_dim);
}

#[test]
fn f16_format_rounds_once() {
    let pool = KvPool::new(LAYOUT, KvFormat::F16, 1 << 20);
    assert_eq!(pool.bytes_per_token() * 2, KvPool::new(LAYOUT, KvFormat::F32, 1).bytes_per_token());
    let mut a = SeqKv::new(&pool);
    a.reserve(3).unwrap();
    write_tokens(&mut a, 0, 3, 0.25);
    a.for_each_chunk(0, &mut |c| {
        assert_eq!(c.keys.elem, KvElem::F16);
        let mut row = vec![0f32; LAYOUT.head_dim];
        c.keys.elem.decode_row(&c.keys.bytes[..2 * LAYOUT.head_dim], &mut row);
        assert_eq!(row[0], 0.25);
        assert_eq!(c.len, 3);
    });
    assert!("q3".parse::<KvFormat>().is_err());
    for f in KvFormat::ALL {
        assert_eq!(f.name().parse::<KvFormat>().unwrap(), f);
    }
    let f16 = KvPool::new(LAYOUT, KvFormat::F16, 1).bytes_per_token() as f64;
    let q4 = KvPool::new(KvLayout { head_dim: 64, ..LAYOUT }, KvFormat::Q4, 1).bytes_per_token() as f64;
    let f16_64 = KvPool::new(KvLayout { head_dim: 64, ..LAYOUT }, KvFormat::F16, 1).bytes_per_token() as f64;
    assert!(q4 / f16_64 <= 0.3, "q4 is {} of f16", q4 / f16_64);
    assert!(f16 > 0.0);
}

/// The pool's sizing answer bounds what a fresh sequence's reservation charges, in every
/// format: exactly its whole blocks in the exact formats, plus at most one recent window in
/// the quantized ones.
#[test]
fn bytes_for_bounds_a_fresh_reservation() {
    for format in KvFormat::ALL {
        let layout = KvLayout { head_dim: 64, ..LAYOUT };
        for tokens in [1, 5, BLOCK_TOKENS - 1, BLOCK_TOKENS, BLOCK_TOKENS + 1, 3 * BLOCK_TOKENS + 7] {
            let pool = KvPool::new(layout, format, 1 << 24);
            let mut kv = SeqKv::new(&pool);
            kv.reserve(tokens).unwrap();
            let want = pool.bytes_for(tokens);
            assert!(pool.used() <= want, "{format:?} {tokens}: charged {} > bytes_for {want}", pool.used());
            if !pool.has_window() {
                assert_eq!(pool.used(), want, "{format:?} {tokens}: whole blocks exactly");
            }
        }
        assert_eq!(KvPool::new(layout, format, 0).bytes_for(0), 0);
    }
}

/// `unshare` while another thread drops its fork of the same blocks: whichever way the race
/// goes (the block still shared and copied, or already alone and kept), every byte charged
/// belongs to a live block, so the pool is empty once everything is dropped. Counting the
/// shared blocks and then copying those still shared, re-checked one by one, charged a
/// block that the other thread's drop had just made this sequence's own and never released
/// it.
#[test]
fn unshare_charges_exactly_the_blocks_it_copies_while_forks_drop_on_other_threads() {
    let pool = KvPool::new(LAYOUT, KvFormat::F32, 64 << 20);
    let blocks = 64;
    let n = blocks * BLOCK_TOKENS;
    for round in 0..400 {
        let mut kv = SeqKv::new(&pool);
        kv.reserve(n).unwrap();
        write_tokens(&mut kv, 0, n, round as f32);
        let fork = kv.fork(n);
        let start = std::sync::Arc::new(std::sync::Barrier::new(2));
        let dropper = {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                // Up to some microseconds of work, so the drop lands anywhere in `unshare`.
                let spin = (round % 23) * 200;
                let mut x = 0u64;
                for i in 0..spin {
                    x = x.wrapping_add(std::hint::black_box(i as u64));
                }
                std::hint::black_box(x);
                drop(fork);
            })
        };
        start.wait();
        kv.unshare(0..n).unwrap();
        dropper.join().unwrap();
        assert_eq!(pool.used(), blocks * pool.block_bytes(), "round {round}: the charge is the sequence's blocks");
        drop(kv);
        assert_eq!(pool.used(), 0, "round {round}: every charge released");
    }
}
