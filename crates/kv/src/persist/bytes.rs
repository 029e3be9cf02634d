//! Entries as byte strings instead of files: the same header, owner and checksum as an entry
//! file ([`super::write_entry`]), for tiers that store values rather than files (a remote
//! key-value store).
//!
//! Invariant: [`decode_entry`] accepts exactly what [`encode_entry`] produced for the same
//! model, KV format and layout: the header is parsed and checked as a file's is, the checksum
//! covers every byte, and anything else (truncated, bit-flipped, foreign, another model) is a
//! [`PersistError`] naming `what`, never a panic and never a wrong sequence. The decoded
//! blocks are owned copies in RAM, charged to the pool.

use super::*;

/// `kv` and `meta` as one entry's bytes (what [`write_entry`] would write to a file).
pub fn encode_entry(meta: &EntryMeta, kv: &SeqKv) -> Result<Vec<u8>, PersistError> {
    encode_entry_range(meta, kv, 0..kv.len())
}

/// `kv`'s tokens `range` and `meta` (whose `tokens` are that range's) as one entry's bytes: a
/// run of whole blocks, `range.start` on a block boundary and `range.end` on one or at the
/// sequence's end (the recent window, if any, goes with the range that ends there). Decoded,
/// it is a sequence of `range.len()` tokens whose rows are those positions' rows.
pub fn encode_entry_range(meta: &EntryMeta, kv: &SeqKv, range: std::ops::Range<usize>) -> Result<Vec<u8>, PersistError> {
    let prepared = prepare(Path::new("<entry>"), meta, kv, range, Checksum::Computed)?;
    let mut out = Vec::with_capacity(prepared.total_len() as usize);
    out.extend_from_slice(&(prepared.header.len() as u64).to_le_bytes());
    out.extend_from_slice(&prepared.header);
    for row in &prepared.rows {
        out.extend_from_slice(row);
    }
    if let Some(win) = &prepared.window {
        out.extend_from_slice(win);
    }
    Ok(out)
}

/// Validates `bytes` as an entry (header, identity against `pool` and `expect_fingerprint`,
/// token ids below `vocab_size`, checksum) and returns its metadata and a sequence of owned
/// blocks. `what` names the value in errors (a key, say).
pub fn decode_entry(
    what: &str,
    bytes: &[u8],
    pool: &KvPool,
    expect_fingerprint: &str,
    vocab_size: usize,
) -> Result<(EntryMeta, SeqKv), PersistError> {
    let path = Path::new(what);
    let len = bytes.len() as u64;
    if len < 8 {
        return Err(PersistError::invalid(path, format!("value is {len} bytes, shorter than a safetensors header")));
    }
    let n8: [u8; 8] = bytes[..8].try_into().expect("length checked");
    let n = header_len(n8, len).map_err(|r| PersistError::invalid(path, r))?;
    let (info, hasher) = parse_header(&bytes[8..8 + n], len).map_err(|e| e.at(path))?;
    check_identity(path, &info, pool, expect_fingerprint, vocab_size)?;
    let data = &bytes[8 + n..];
    check_sum(path, data, info.checksum, hasher)?;
    let bb = info.block_bytes;
    let kv_err = |e| PersistError::Kv { path: path.to_path_buf(), source: e };
    let mut blocks = Vec::with_capacity(info.num_blocks);
    let mut at = 0;
    for b in 0..info.num_blocks {
        let len = (info.num_tokens - b * BLOCK_TOKENS).min(BLOCK_TOKENS);
        let block = match released_of(&info, b) {
            Some(g) => {
                let rb = g.released_block_bytes(pool);
                at += rb;
                pool.released_block(&data[at - rb..at], len, g).map_err(kv_err)?
            }
            None => {
                at += bb;
                pool.owned_block(&data[at - bb..at], len).map_err(kv_err)?
            }
        };
        blocks.push(Arc::new(block));
    }
    let mut kv = SeqKv::from_blocks(pool, blocks, info.num_tokens);
    if info.window_bytes > 0 {
        let at = info.kv_bytes;
        kv.set_window(&data[at..at + info.window_bytes]).map_err(kv_err)?;
    }
    restore_release(&mut kv, &info);
    Ok((info.meta, kv))
}
