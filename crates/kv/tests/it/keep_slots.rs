//! `SeqKv::keep_slots`: the accepted path of a tree of drafts becomes the sequence's next
//! tokens. Kept rows are byte copies (every format, the recent window too), positions go with
//! them, and the result reads exactly as if only the kept tokens had been written, in order.

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv, BLOCK_TOKENS};
use engram_model::KvCache;

const LAYOUT: KvLayout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 32 };
const W: usize = LAYOUT.num_kv_heads * LAYOUT.head_dim;

/// Token `tag`'s keys and values for `layer`: distinct per tag, layer and element.
fn rows(tag: usize, layer: usize) -> (Vec<f32>, Vec<f32>) {
    let k: Vec<f32> = (0..W).map(|i| ((tag * 131 + layer * 17 + i * 7) % 101) as f32 * 0.021 - 1.0).collect();
    let v = k.iter().map(|x| 0.5 - x).collect();
    (k, v)
}

/// Writes the tokens `tags` at slots `first..` in one reservation, as one step does.
fn write(kv: &mut SeqKv, first: usize, tags: &[usize]) {
    kv.reserve(tags.len()).unwrap();
    for layer in 0..LAYOUT.num_layers {
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for &t in tags {
            let (a, b) = rows(t, layer);
            k.extend(a);
            v.extend(b);
        }
        kv.write(layer, first, &k, &v, tags.len());
    }
}

/// Everything attention would read: per layer, every chunk's positions, element, key and
/// value bytes of the tokens it holds.
fn attended(kv: &SeqKv) -> Vec<(Vec<usize>, Vec<u8>)> {
    let mut out = Vec::new();
    for layer in 0..LAYOUT.num_layers {
        kv.for_each_chunk(layer, &mut |c| {
            let rb = c.keys.elem.row_bytes(LAYOUT.head_dim);
            let positions: Vec<usize> = (0..c.len).map(|t| c.positions.map_or(c.first_pos + t, |p| p[t] as usize)).collect();
            let mut bytes = Vec::new();
            for h in 0..LAYOUT.num_kv_heads {
                for t in 0..c.len {
                    let off = (h * c.capacity + t) * rb;
                    bytes.extend_from_slice(&c.keys.bytes[off..off + rb]);
                    bytes.extend_from_slice(&c.values.bytes[off..off + rb]);
                }
            }
            out.push((positions, bytes));
        });
    }
    out
}

#[test]
fn kept_slots_read_as_if_only_they_had_been_written() {
    for format in [KvFormat::F32, KvFormat::F16, KvFormat::Q8, KvFormat::Q4] {
        // A context of 40 tokens (one full block, a partial one), then a step of 9 drafts
        // staying inside the partial block, of which slots 0, 2, 3 and 7 of the step are kept.
        let pool = KvPool::new(LAYOUT, format, 1 << 24);
        let context: Vec<usize> = (0..40).collect();
        let step: Vec<usize> = (100..109).collect();
        let keep = [0, 2, 3, 7];
        let mut tree = SeqKv::new(&pool);
        for (i, &t) in context.iter().enumerate() {
            write(&mut tree, i, &[t]);
        }
        write(&mut tree, 40, &step);
        tree.keep_slots(40, &keep.map(|k| 40 + k));

        let mut plain = SeqKv::new(&pool);
        for (i, &t) in context.iter().enumerate() {
            write(&mut plain, i, &[t]);
        }
        for (i, k) in keep.iter().enumerate() {
            write(&mut plain, 40 + i, &[step[*k]]);
        }
        assert_eq!(tree.len(), 44, "{format}");
        assert!(!tree.has_moved_positions(), "{format}");
        // A quantized partial block is attended from its recent window, so this covers it too.
        assert!(attended(&tree) == attended(&plain), "{format}: kept rows and positions equal a plain write");
        assert_eq!(tree.num_bytes(), plain.num_bytes(), "{format}: the dropped branches' room is released");
        assert_eq!(pool.used(), tree.num_bytes() + plain.num_bytes(), "{format}: and uncharged");
    }
}

#[test]
fn kept_slots_carry_their_positions() {
    let pool = KvPool::new(LAYOUT, KvFormat::F16, 1 << 24);
    let mut kv = SeqKv::new(&pool);
    write(&mut kv, 0, &[1, 2, 3]);
    // A tree: root at position 3, two siblings at 4, a child of the second at 5.
    write(&mut kv, 3, &[10, 11, 12, 13]);
    kv.place(3, &[3, 4, 4, 5]).unwrap();
    kv.keep_slots(3, &[3, 5, 6]);
    assert_eq!((0..kv.len()).map(|s| kv.position(s)).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
    assert!(!kv.has_moved_positions());
}

#[test]
fn keeping_across_a_block_boundary_copies_between_blocks() {
    let pool = KvPool::new(LAYOUT, KvFormat::F16, 1 << 24);
    let mut tree = SeqKv::new(&pool);
    let first = BLOCK_TOKENS - 3;
    write(&mut tree, 0, &vec![7; first]);
    write(&mut tree, first, &[50, 51, 52, 53, 54, 55, 56]);
    tree.keep_slots(first, &[first, first + 4, first + 5, first + 6]);
    let mut plain = SeqKv::new(&pool);
    write(&mut plain, 0, &vec![7; first]);
    write(&mut plain, first, &[50, 54, 55, 56]);
    assert!(attended(&tree) == attended(&plain));
}
