//! Cache entry files: round trips in every KV format, mapped restore with
//! copy-on-write, and rejection of every kind of bad file (invariant 3).

use std::path::{Path, PathBuf};

use engram_kv::persist::{self, MAX_HEADER_BYTES};
use engram_kv::{
    open_entry, read_entry, read_meta, write_entry, EntryKind, EntryMeta, KvFormat, KvLayout, KvPool, PersistError, SeqKv, BLOCK_TOKENS,
};
use engram_model::KvCache;
use proptest::prelude::*;

const LAYOUT: KvLayout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 64 };
const VOCAB: usize = 1000;
const FP: &str = "0123456789abcdef-f16";

fn pool(format: KvFormat) -> KvPool {
    KvPool::new(LAYOUT, format, 64 << 20)
}

/// Writes `n` tokens of deterministic pseudo-random keys and values.
fn fill(kv: &mut SeqKv, first: usize, n: usize, seed: u64) {
    let layout = kv.pool().layout();
    let w = layout.num_kv_heads * layout.head_dim;
    kv.reserve(n).unwrap();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    for layer in 0..layout.num_layers {
        let k: Vec<f32> = (0..n * w).map(|_| next()).collect();
        let v: Vec<f32> = (0..n * w).map(|_| next()).collect();
        kv.write(layer, first, &k, &v, n);
    }
}

fn make_kv(pool: &KvPool, n: usize, seed: u64) -> SeqKv {
    let mut kv = SeqKv::new(pool);
    fill(&mut kv, 0, n, seed);
    kv
}

/// Text "w0 w1 ... " with a multi-byte character in every word, and the byte
/// range of each word.
fn meta(n: usize, fingerprint: &str) -> EntryMeta {
    let mut text = String::new();
    let mut offsets = Vec::new();
    for i in 0..n {
        let s = text.len();
        text.push_str(&format!("wé{i}"));
        offsets.push((s, text.len()));
        text.push(if i % 7 == 6 { '\n' } else { ' ' });
    }
    EntryMeta {
        fingerprint: fingerprint.to_string(),
        kind: EntryKind::Session,
        owner: "agent-1".into(),
        tokens: (0..n as u32).map(|i| (i * 37 + 5) % VOCAB as u32).collect(),
        text,
        offsets,
        created_unix: 1_700_000_000,
    }
}

/// What attention sees: per layer, per chunk, the visible rows of keys and values.
fn visible(kv: &SeqKv) -> Vec<(usize, usize, Vec<u8>, Vec<u8>)> {
    let layout = kv.pool().layout();
    let mut out = Vec::new();
    for layer in 0..layout.num_layers {
        kv.for_each_chunk(layer, &mut |c| {
            let rb = c.keys.elem.row_bytes(layout.head_dim);
            let (mut k, mut v) = (Vec::new(), Vec::new());
            for h in 0..layout.num_kv_heads {
                let r = h * c.capacity * rb..(h * c.capacity + c.len) * rb;
                k.extend_from_slice(&c.keys.bytes[r.clone()]);
                v.extend_from_slice(&c.values.bytes[r]);
            }
            out.push((c.first_pos, c.len, k, v));
        });
    }
    out
}

fn entry_file(dir: &Path, n: usize, format: KvFormat) -> PathBuf {
    let p = pool(format);
    let kv = make_kv(&p, n, 7);
    let path = dir.join("e.safetensors");
    write_entry(&path, &meta(n, FP), &kv).unwrap();
    path
}

/// Reads `bytes` as an entry file; must not panic.
fn read_bytes(dir: &Path, bytes: &[u8]) -> Result<(EntryMeta, SeqKv), PersistError> {
    let path = dir.join("x.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let r = read_entry(&path, &pool(KvFormat::F16), FP, VOCAB);
    // The header-only reader must agree that the file is bad or not.
    let m = read_meta(&path);
    if r.is_ok() {
        assert!(m.is_ok(), "read_meta rejects what read_entry accepts: {:?}", m.err());
    }
    // So must the restore whose checksum runs beside the caller's work: a
    // file it opens is still read without panics, and its check decides.
    let deferred = open_entry(&path, &pool(KvFormat::F16), FP, VOCAB).and_then(|(_, kv, check)| {
        let _ = visible(&kv);
        check.wait()
    });
    assert_eq!(deferred.is_ok(), r.is_ok(), "open_entry + wait disagrees with read_entry: {:?}", deferred.err());
    // And the same bytes as a value rather than a file: the same verdict, the same entry.
    let value = persist::decode_entry("x.safetensors", bytes, &pool(KvFormat::F16), FP, VOCAB);
    match (&r, &value) {
        (Ok((m, kv)), Ok((m2, kv2))) => {
            assert_eq!(m, m2);
            assert_eq!(visible(kv), visible(kv2));
        }
        (Err(_), Err(e)) => assert!(e.to_string().contains("x.safetensors"), "{e} does not name the value"),
        _ => panic!("decode_entry disagrees with read_entry: {:?} vs {:?}", value.as_ref().err(), r.as_ref().err()),
    }
    r
}

fn expect_invalid(r: Result<(EntryMeta, SeqKv), PersistError>, needle: &str) {
    match r {
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(needle), "error {msg:?} does not mention {needle:?}");
            assert!(msg.contains(".safetensors"), "error {msg:?} does not name the file");
        }
        Ok(_) => panic!("accepted a bad file (expected an error about {needle:?})"),
    }
}

#[test]
fn round_trip_every_format() {
    let dir = tempfile::tempdir().unwrap();
    for format in KvFormat::ALL {
        for n in [1, BLOCK_TOKENS, 3 * BLOCK_TOKENS + 5] {
            let p = pool(format);
            let kv = make_kv(&p, n, n as u64);
            let path = dir.path().join(format!("{format}-{n}.safetensors"));
            let m = meta(n, FP);
            let written = write_entry(&path, &m, &kv).unwrap();
            assert_eq!(written, std::fs::metadata(&path).unwrap().len());
            assert_eq!(written, persist::encoded_len(&m, &kv).unwrap());

            let used = p.used();
            let (m2, kv2) = read_entry(&path, &p, FP, VOCAB).unwrap();
            assert_eq!(m2, m);
            assert_eq!(kv2.len(), n);
            // Attention sees what it saw before: the blocks, and for q8/q4 ending in a partial
            // block, the f16 recent window persisted beside them.
            assert_eq!(visible(&kv2), visible(&kv), "{format}, {n} tokens");
            assert_eq!(kv2.window(), kv.window(), "{format}, {n} tokens: the recent window");
            assert_eq!(kv2.window().is_some(), p.has_window() && n % BLOCK_TOKENS != 0);
            assert!(kv2.blocks().iter().all(|b| b.is_mapped()), "restored blocks are the file's pages");
            let window = kv2.window().map_or(0, <[u8]>::len);
            assert_eq!(p.used(), used + n.div_ceil(BLOCK_TOKENS) * p.block_bytes() + window, "mapped blocks and the window are charged");

            let info = read_meta(&path).unwrap();
            assert_eq!((info.meta, info.format, info.layout, info.num_tokens), (m, format, LAYOUT, n));
            assert_eq!(info.num_blocks, n.div_ceil(BLOCK_TOKENS));
            assert_eq!(persist::verify_entry(&path).unwrap().checksum, info.checksum);
        }
    }
}

/// An entry as a value: the bytes a file would hold, decoded into owned blocks (charged once),
/// in every format, with and without a recent window.
#[test]
fn entries_round_trip_as_values() {
    let dir = tempfile::tempdir().unwrap();
    for format in KvFormat::ALL {
        for n in [1, BLOCK_TOKENS, 3 * BLOCK_TOKENS + 5] {
            let p = pool(format);
            let kv = make_kv(&p, n, n as u64 + 3);
            let m = meta(n, FP);
            let value = persist::encode_entry(&m, &kv).unwrap();
            let path = dir.path().join(format!("{format}-{n}.safetensors"));
            write_entry(&path, &m, &kv).unwrap();
            // The same entry as the file (the header's key order is the map's, so compare decoded).
            assert_eq!(value.len(), std::fs::read(&path).unwrap().len(), "{format}, {n}: a value is a file's bytes");
            assert_eq!(persist::decode_entry("file", &std::fs::read(&path).unwrap(), &p, FP, VOCAB).unwrap().0, m);
            let used = p.used();
            let (m2, kv2) = persist::decode_entry("key", &value, &p, FP, VOCAB).unwrap();
            assert_eq!(m2, m);
            assert_eq!(visible(&kv2), visible(&kv), "{format}, {n} tokens");
            assert_eq!(kv2.window(), kv.window(), "{format}, {n} tokens: the recent window");
            assert!(kv2.blocks().iter().all(|b| !b.is_mapped() && b.is_in_ram()));
            let window = kv2.window().map_or(0, <[u8]>::len);
            assert_eq!(p.used(), used + n.div_ceil(BLOCK_TOKENS) * p.block_bytes() + window, "owned blocks and the window are charged");
            drop(kv2);
            assert_eq!(p.used(), used, "and released");
        }
    }
    // Another model's value is a miss naming the value, not a wrong sequence.
    let p = pool(KvFormat::F16);
    let value = persist::encode_entry(&meta(5, FP), &make_kv(&p, 5, 1)).unwrap();
    let e = persist::decode_entry("engram:k", &value, &p, "fedcba9876543210-f16", VOCAB).err().expect("another model");
    assert!(matches!(e, PersistError::Mismatch { .. }) && e.to_string().contains("engram:k"), "{e}");
    let e = persist::decode_entry("engram:k", &value, &pool(KvFormat::Q8), FP, VOCAB).err().expect("another format");
    assert!(matches!(e, PersistError::Mismatch { .. }), "{e}");
}

/// A sequence stored as runs of whole blocks (each its own entry value) and put back together
/// with `SeqKv::concat` is the sequence: rows, length and recent window, in every format.
#[test]
fn runs_of_blocks_put_back_together_are_the_sequence() {
    for format in KvFormat::ALL {
        for n in [BLOCK_TOKENS, 3 * BLOCK_TOKENS + 5, 4 * BLOCK_TOKENS] {
            let p = pool(format);
            let kv = make_kv(&p, n, n as u64 + 11);
            let m = meta(n, FP);
            let run = 2 * BLOCK_TOKENS;
            let mut parts = Vec::new();
            for start in (0..n).step_by(run) {
                let end = (start + run).min(n);
                let rm = EntryMeta { tokens: m.tokens[start..end].to_vec(), text: String::new(), offsets: vec![], ..m.clone() };
                let value = persist::encode_entry_range(&rm, &kv, start..end).unwrap();
                let (got, part) = persist::decode_entry("run", &value, &p, FP, VOCAB).unwrap();
                assert_eq!(got.tokens, rm.tokens);
                assert_eq!(part.window().is_some(), end == n && kv.window().is_some(), "only the last run has the window");
                parts.push(part);
            }
            let whole = SeqKv::concat(&p, parts).expect("runs of whole blocks");
            assert_eq!(whole.len(), n);
            assert_eq!(visible(&whole), visible(&kv), "{format}, {n} tokens");
            assert_eq!(whole.window(), kv.window(), "{format}, {n} tokens: the recent window");
        }
    }
    // A range that is not a run of whole blocks is refused, not written wrong.
    let p = pool(KvFormat::F16);
    let kv = make_kv(&p, 70, 1);
    let m = EntryMeta { tokens: vec![1; 10], text: String::new(), offsets: vec![], ..meta(0, FP) };
    assert!(persist::encode_entry_range(&m, &kv, 5..15).is_err());
    assert!(persist::encode_entry_range(&m, &kv, 32..42).is_err());
    // Parts that do not line up are not put together.
    let a = make_kv(&p, 5, 1);
    let b = make_kv(&p, 5, 2);
    assert!(SeqKv::concat(&p, vec![a, b]).is_none());
    assert!(SeqKv::concat(&pool(KvFormat::F16), vec![make_kv(&p, 5, 1)]).is_none(), "another pool");
}

/// Every head's rows start on a 64-byte line, in RAM and mapped from a file, in every format
/// (the attention kernels load 64 bytes at a time), including the recent window's.
fn assert_line_aligned(kv: &SeqKv, what: &str) {
    for layer in 0..LAYOUT.num_layers {
        kv.for_each_chunk(layer, &mut |c| {
            for (part, d) in [("keys", c.keys), ("values", c.values)] {
                let rb = d.elem.row_bytes(LAYOUT.head_dim);
                for h in 0..LAYOUT.num_kv_heads {
                    let at = d.bytes[h * c.capacity * rb..].as_ptr() as usize;
                    assert_eq!(at % 64, 0, "{what}: layer {layer}, {part} of head {h} at position {}", c.first_pos);
                }
            }
        });
    }
}

#[test]
fn data_starts_on_a_cache_line_in_files_and_in_ram() {
    let dir = tempfile::tempdir().unwrap();
    for format in KvFormat::ALL {
        let p = pool(format);
        let kv = make_kv(&p, 3 * BLOCK_TOKENS + 5, 9);
        assert_line_aligned(&kv, &format!("{format} in RAM"));
        let path = dir.path().join(format!("{format}.safetensors"));
        write_entry(&path, &meta(kv.len(), FP), &kv).unwrap();
        let (_, mapped) = read_entry(&path, &p, FP, VOCAB).unwrap();
        assert_line_aligned(&mapped, &format!("{format} mapped"));
    }
    let path = entry_file(dir.path(), 40, KvFormat::F16);
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!((8 + n) % 64, 0, "the tensor data starts on a line");
    // A plain safetensors reader sees one U8 tensor of [blocks, block_bytes].
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("kv").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::U8);
    assert_eq!(t.shape(), &[2, pool(KvFormat::F16).block_bytes()]);
    let (_, md) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let keys: std::collections::BTreeSet<&str> = md.metadata().as_ref().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, persist::KEYS.into_iter().collect());
}

/// A restored sequence is charged once however many forks share it (a user's persistent
/// stream attended by every thread), reads what was written, and a foreign fingerprint or a
/// flipped byte is refused.
#[test]
fn a_restored_sequence_is_charged_once_and_shared_by_forks() {
    let dir = tempfile::tempdir().unwrap();
    for format in KvFormat::ALL {
        let n = 3 * BLOCK_TOKENS + 7;
        let path = dir.path().join(format!("m-{format}.safetensors"));
        let p = pool(format);
        let original = make_kv(&p, n, 7);
        write_entry(&path, &meta(n, FP), &original).unwrap();
        let used = p.used();
        let (m, kv) = read_entry(&path, &p, FP, VOCAB).unwrap();
        assert_eq!(m, meta(n, FP));
        assert_eq!(visible(&kv), visible(&original), "{format}");
        assert!(kv.blocks().iter().all(|b| b.is_in_ram()), "{format}: verified blocks read their RAM copy");
        let window = kv.window().map_or(0, <[u8]>::len);
        assert_eq!(p.used(), used + n.div_ceil(BLOCK_TOKENS) * p.block_bytes() + window, "{format}: charged once");
        let forks: Vec<SeqKv> = (0..8).map(|_| kv.fork(n)).collect();
        assert_eq!(p.used(), used + n.div_ceil(BLOCK_TOKENS) * p.block_bytes() + window, "{format}: forks charge nothing");
        assert!(forks.iter().all(|f| visible(f) == visible(&original)));
        // Another fingerprint is a miss, a flipped byte in the KV a corrupt file.
        assert!(matches!(read_entry(&path, &p, "fedcba9876543210-f16", VOCAB), Err(PersistError::Mismatch { .. })));
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() - 3;
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(read_entry(&path, &p, FP, VOCAB).err().is_some_and(|e| e.is_corrupt()), "{format}");
    }
}

#[test]
fn a_verified_restore_survives_its_file_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let n = 3 * BLOCK_TOKENS + 7;
    for deferred in [false, true] {
        let path = entry_file(dir.path(), n, KvFormat::F16);
        let p = pool(KvFormat::F16);
        let original = make_kv(&p, n, 7);
        let kv = if deferred {
            let (_, kv, check) = open_entry(&path, &p, FP, VOCAB).unwrap();
            check.wait().unwrap();
            kv
        } else {
            read_entry(&path, &p, FP, VOCAB).unwrap().1
        };
        assert!(kv.blocks().iter().all(|b| b.is_mapped() && b.is_in_ram()), "verified blocks read their copy");
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        assert_eq!(visible(&kv), visible(&original), "deferred {deferred}");
    }
}

#[test]
fn writing_after_restore_copies_on_write() {
    let dir = tempfile::tempdir().unwrap();
    let n = 2 * BLOCK_TOKENS + 3;
    let path = entry_file(dir.path(), n, KvFormat::F16);
    let file_before = std::fs::read(&path).unwrap();
    let p = pool(KvFormat::F16);
    let (_, mut kv) = read_entry(&path, &p, FP, VOCAB).unwrap();
    let before = visible(&kv);
    let used = p.used();
    fill(&mut kv, n, 2, 99);
    // The partial mapped block was replaced by a charged copy, and released.
    assert_eq!(p.used(), used);
    assert!(kv.blocks()[0].is_mapped() && kv.blocks()[1].is_mapped() && !kv.blocks()[2].is_mapped());
    assert_eq!(kv.len(), n + 2);
    let after = visible(&kv);
    // Full blocks are unchanged; the partial one keeps its first 3 tokens.
    for (a, b) in before.iter().zip(&after) {
        if a.1 == BLOCK_TOKENS {
            assert_eq!(a, b);
        } else {
            assert_eq!(b.1, a.1 + 2);
        }
    }
    assert_eq!(std::fs::read(&path).unwrap(), file_before, "the file is never written through");
    let (_, again) = read_entry(&path, &p, FP, VOCAB).unwrap();
    assert_eq!(visible(&again), before);
}

#[test]
fn stale_slots_are_not_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(KvFormat::F32);
    let mut kv = make_kv(&p, BLOCK_TOKENS + 20, 3);
    kv.truncate(BLOCK_TOKENS + 4);
    let path = dir.path().join("t.safetensors");
    write_entry(&path, &meta(BLOCK_TOKENS + 4, FP), &kv).unwrap();
    let (_, r) = read_entry(&path, &p, FP, VOCAB).unwrap();
    assert_eq!(visible(&r), visible(&kv));
    let last = r.blocks()[1].bytes();
    let rb = p.elem().row_bytes(LAYOUT.head_dim);
    let sec = p.section_bytes();
    for s in 0..2 * LAYOUT.num_layers {
        for h in 0..LAYOUT.num_kv_heads {
            let stale = &last[s * sec + (h * BLOCK_TOKENS + 4) * rb..s * sec + (h + 1) * BLOCK_TOKENS * rb];
            assert!(stale.iter().all(|&b| b == 0), "trimmed tokens reached the disk");
        }
    }
}

#[test]
fn truncated_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = entry_file(dir.path(), 40, KvFormat::F16);
    let bytes = std::fs::read(&path).unwrap();
    let n = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut lens: Vec<usize> = (0..80).collect();
    lens.extend((80..n + 80).step_by(13));
    lens.extend((n..bytes.len()).step_by(997));
    lens.extend([n - 1, n, n + 1, bytes.len() - 1]);
    for len in lens {
        assert!(read_bytes(dir.path(), &bytes[..len]).is_err(), "accepted a file truncated to {len} of {} bytes", bytes.len());
    }
    assert!(read_bytes(dir.path(), &bytes).is_ok());
}

#[test]
fn oversized_header_length_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let path = entry_file(dir.path(), 5, KvFormat::F16);
    let mut bytes = std::fs::read(&path).unwrap();
    for n in [MAX_HEADER_BYTES + 8, u64::MAX, 1 << 40] {
        bytes[..8].copy_from_slice(&n.to_le_bytes());
        expect_invalid(read_bytes(dir.path(), &bytes), "exceeds");
    }
    // In range but past the end of the file.
    let past = (bytes.len() as u64 + 8) & !7;
    bytes[..8].copy_from_slice(&past.to_le_bytes());
    expect_invalid(read_bytes(dir.path(), &bytes), "past the end");
}

/// Rewrites one metadata value in place (same length, so offsets hold).
fn edit_header(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let n = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..n]).unwrap();
    assert_eq!(header.matches(from).count(), 1, "{from} not unique in header");
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(header.replace(from, to).as_bytes());
    out.extend_from_slice(&bytes[n..]);
    out
}

#[test]
fn wrong_magic_version_or_fields_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = entry_file(dir.path(), 40, KvFormat::F16);
    let bytes = std::fs::read(&path).unwrap();
    let cases = [
        (r#""magic":"engram-kv""#, r#""magic":"engram-kx""#, "magic"),
        (r#""version":"2""#, r#""version":"x""#, "version"),
        (r#""block_tokens":"32""#, r#""block_tokens":"16""#, "block_tokens"),
        (r#""num_tokens":"40""#, r#""num_tokens":"41""#, "token ids"),
        (r#""num_tokens":"40""#, r#""num_tokens":"99""#, "tensor"),
        (r#""num_tokens":"40""#, r#""num_tokens":"04""#, "num_tokens"),
        (r#""head_dim":"64""#, r#""head_dim":"63""#, "head"),
        (r#""kind":"session""#, r#""kind":"sessio_""#, "kind"),
        (r#""owner":"agent-1""#, r#""owner":"agent-2""#, "checksum"),
        (r#""created_unix":"1700000000""#, r#""created_unix":"1700000001""#, "checksum"),
        (r#""dtype":"U8""#, r#""dtype":"I8""#, "tensor"),
        (r#""owner":"#, r#""ownex":"#, "unknown metadata key"),
    ];
    for (from, to, needle) in cases {
        expect_invalid(read_bytes(dir.path(), &edit_header(&bytes, from, to)), needle);
    }
    // Another format version, older or newer, is a miss (kept for the version that wrote it), not damage.
    for v in ["1", "3"] {
        let Err(e) = read_bytes(dir.path(), &edit_header(&bytes, r#""version":"2""#, &format!(r#""version":"{v}""#))) else {
            panic!("version {v} was read");
        };
        assert!(matches!(e, PersistError::Mismatch { what: "format version", .. }) && !e.is_corrupt(), "{e}");
    }
}

/// The q8/q4 recent window is checked like the blocks: its shape, that the
/// format and length call for one, and the checksum.
#[test]
fn bad_recent_windows_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let n = BLOCK_TOKENS + 5;
    let p = pool(KvFormat::Q4);
    let path = dir.path().join("w.safetensors");
    write_entry(&path, &meta(n, FP), &make_kv(&p, n, 5)).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let wb = p.window_bytes();
    let q4 = |bytes: &[u8]| {
        let path = dir.path().join("x.safetensors");
        std::fs::write(&path, bytes).unwrap();
        read_entry(&path, &pool(KvFormat::Q4), FP, VOCAB)
    };
    assert!(q4(&bytes).is_ok());
    let shape = format!("[{wb}]");
    let cases = [
        (shape.clone(), format!("[{:0w$}]", wb - 2, w = shape.len() - 2), "tensor"),
        (r#""window":"#.to_string(), r#""windox":"#.to_string(), "tensor"),
        (r#""num_tokens":"37""#.to_string(), r#""num_tokens":"64""#.to_string(), "recent window"),
    ];
    for (from, to, needle) in cases {
        expect_invalid(q4(&edit_header(&bytes, &from, &to)), needle);
    }
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    expect_invalid(q4(&flipped), "checksum");
    // `read_meta` reports the window's size; exact formats keep none.
    assert_eq!(read_meta(&path).unwrap().window_bytes, wb);
    assert_eq!(read_meta(&entry_file(dir.path(), n, KvFormat::F16)).unwrap().window_bytes, 0);
}

#[test]
fn foreign_safetensors_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..64).map(|i| i as u8).collect();
    let w = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4, 4], &data).unwrap();
    let b = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![64], &data).unwrap();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let file = safetensors::serialize([("weight", w.clone()), ("bias", b)], Some(meta)).unwrap();
    expect_invalid(read_bytes(dir.path(), &file), "tensor");
    // A lone "kv" tensor without our metadata.
    let file = safetensors::serialize([("kv", w)], None).unwrap();
    expect_invalid(read_bytes(dir.path(), &file), "__metadata__");
    // Not safetensors at all.
    expect_invalid(read_bytes(dir.path(), b"GGUF\x03\0\0\0 this is not a cache entry"), "");
    expect_invalid(read_bytes(dir.path(), b""), "shorter");
}

#[test]
fn fingerprint_format_and_layout_mismatches_are_misses() {
    let dir = tempfile::tempdir().unwrap();
    let path = entry_file(dir.path(), 40, KvFormat::F16);
    let e = read_entry(&path, &pool(KvFormat::F16), "fedcba9876543210-f16", VOCAB).err().expect("an error");
    assert!(matches!(e, PersistError::Mismatch { what: "fingerprint", .. }), "{e}");
    assert!(!e.is_corrupt());
    let e = read_entry(&path, &pool(KvFormat::Q8), FP, VOCAB).err().expect("an error");
    assert!(matches!(e, PersistError::Mismatch { what: "KV format", .. }), "{e}");
    let other = KvPool::new(KvLayout { num_layers: 3, ..LAYOUT }, KvFormat::F16, 1 << 30);
    let e = read_entry(&path, &other, FP, VOCAB).err().expect("an error");
    assert!(matches!(e, PersistError::Mismatch { what: "layout", .. }), "{e}");
    let fp = engram_kv::cache_fingerprint(engram_model::Fingerprint(0x0123_4567_89ab_cdef), KvFormat::F16);
    assert_eq!(fp, FP);
}

#[test]
fn token_ids_must_be_in_the_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let path = entry_file(dir.path(), 40, KvFormat::F16);
    let max = *meta(40, FP).tokens.iter().max().unwrap() as usize;
    assert!(read_entry(&path, &pool(KvFormat::F16), FP, max + 1).is_ok());
    let e = read_entry(&path, &pool(KvFormat::F16), FP, max).err().expect("an error");
    assert!(e.is_corrupt() && e.to_string().contains("vocabulary"), "{e}");
}

#[test]
fn restore_over_the_ram_budget_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = entry_file(dir.path(), 3 * BLOCK_TOKENS, KvFormat::F16);
    let small = KvPool::new(LAYOUT, KvFormat::F16, 2 * pool(KvFormat::F16).block_bytes());
    let e = read_entry(&path, &small, FP, VOCAB).err().expect("an error");
    assert!(matches!(e, PersistError::Kv { .. }) && !e.is_corrupt(), "{e}");
    assert_eq!(small.used(), 0, "partially restored blocks are released");
}

#[test]
fn bad_metadata_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(KvFormat::F16);
    let kv = make_kv(&p, 10, 1);
    let path = dir.path().join("w.safetensors");
    let mut m = meta(10, FP);
    m.tokens.pop();
    assert!(matches!(write_entry(&path, &m, &kv), Err(PersistError::Unwritable { .. })));
    let mut m = meta(10, FP);
    m.offsets[3] = (1, 2); // inside "é"
    assert!(write_entry(&path, &m, &kv).is_err());
    let mut m = meta(10, FP);
    m.offsets.swap(2, 3);
    assert!(write_entry(&path, &m, &kv).is_err());
    let mut m = meta(10, FP);
    m.fingerprint = "has space".into();
    assert!(write_entry(&path, &m, &kv).is_err());
    assert!(write_entry(&path, &meta(0, FP), &SeqKv::new(&p)).is_err());
    // Empty offsets (text unknown) and special tokens' empty ranges are fine.
    let mut m = meta(10, FP);
    m.offsets.clear();
    write_entry(&path, &m, &kv).unwrap();
    let mut m = meta(10, FP);
    m.offsets[0] = (0, 0);
    m.offsets[5] = (0, 0);
    write_entry(&path, &m, &kv).unwrap();
    assert_eq!(read_entry(&path, &p, FP, VOCAB).unwrap().0, m);
    assert!(!std::fs::read_dir(dir.path()).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().contains(".tmp-")));
}

fn sample_file() -> &'static (tempfile::TempDir, Vec<u8>, usize) {
    static FILE: std::sync::OnceLock<(tempfile::TempDir, Vec<u8>, usize)> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = entry_file(dir.path(), 2 * BLOCK_TOKENS + 7, KvFormat::F16);
        let bytes = std::fs::read(&path).unwrap();
        let n = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        (dir, bytes, n)
    })
}

/// A damaged KV byte passes every check but the checksum: the deferred
/// restore hands out the blocks at once and its check then fails.
#[test]
fn deferred_check_catches_damaged_kv_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = entry_file(dir.path(), 3 * BLOCK_TOKENS + 5, KvFormat::F16);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1000;
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let (_, kv, check) = open_entry(&path, &pool(KvFormat::F16), FP, VOCAB).expect("the header is sound");
    assert_eq!(kv.len(), 3 * BLOCK_TOKENS + 5);
    let e = check.wait().expect_err("the checksum must fail");
    assert!(e.is_corrupt() && e.to_string().contains("checksum mismatch"), "{e}");
    expect_invalid(read_entry(&path, &pool(KvFormat::F16), FP, VOCAB), "checksum mismatch");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    /// A flipped bit anywhere (header or data) is caught.
    #[test]
    fn bit_flips_are_caught(in_header in any::<bool>(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let (_, bytes, n) = sample_file();
        let pos = if in_header { pos.index(*n) } else { pos.index(bytes.len()) };
        let mut bad = bytes.clone();
        bad[pos] ^= 1 << bit;
        let dir = tempfile::tempdir().unwrap();
        prop_assert!(read_bytes(dir.path(), &bad).is_err(), "flip of bit {} at byte {} accepted", bit, pos);
    }

    /// Arbitrary bytes after a plausible length prefix never panic.
    #[test]
    fn garbage_never_panics(len in 0u64..4096, body in prop::collection::vec(any::<u8>(), 0..4096)) {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(&body);
        let dir = tempfile::tempdir().unwrap();
        prop_assert!(read_bytes(dir.path(), &bytes).is_err());
    }
}

/// Restore throughput of a ~256 MiB entry (1B-shaped: 16 layers, 8 KV heads,
/// head_dim 64, f16, 8192 tokens). `cargo test --release -p engram-kv --test
/// persist -- --ignored --nocapture restore_throughput`.
#[test]
#[ignore]
fn restore_throughput() {
    let layout = KvLayout { num_layers: 16, num_kv_heads: 8, head_dim: 64 };
    let p = KvPool::new(layout, KvFormat::F16, 1 << 30);
    let n = 8192;
    let kv = make_kv(&p, n, 1);
    let dir = tempfile::tempdir_in(std::env::var_os("ENGRAM_BENCH_DIR").unwrap_or_else(|| ".".into())).unwrap();
    let path = dir.path().join("big.safetensors");
    let m = EntryMeta { fingerprint: FP.into(), tokens: vec![1; n], text: String::new(), offsets: vec![], ..meta(0, FP) };
    let t = std::time::Instant::now();
    let bytes = write_entry(&path, &m, &kv).unwrap();
    let write_s = t.elapsed().as_secs_f64();
    drop(kv);
    let mib = bytes as f64 / (1 << 20) as f64;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let (_, r) = read_entry(&path, &p, FP, VOCAB).unwrap();
        let s = t.elapsed().as_secs_f64();
        best = best.min(s);
        assert_eq!(r.len(), n);
    }
    let t = std::time::Instant::now();
    let info = read_meta(&path).unwrap();
    let meta_s = t.elapsed().as_secs_f64();
    println!(
        "entry {mib:.0} MiB ({} blocks of {} KiB): write+fsync {:.2} s ({:.2} GB/s); restore (map + validate + checksum, page cache warm) {:.1} ms = {:.2} GB/s; header only {:.2} ms",
        info.num_blocks,
        info.block_bytes >> 10,
        write_s,
        bytes as f64 / write_s / 1e9,
        best * 1e3,
        bytes as f64 / best / 1e9,
        meta_s * 1e3
    );
}
