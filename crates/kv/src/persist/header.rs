//! Entry headers: the safetensors JSON header of an entry file parsed and validated against
//! the file's length (magic and version first, then every field: shapes within the limits,
//! fingerprint, token ids, offsets), and the metadata hasher the checksum starts from. Nothing
//! is allocated before the header's length is checked against [`MAX_HEADER_BYTES`].

use super::*;

/// A hasher fed every metadata key and value except `checksum`, sorted by
/// key, each length-prefixed (so no two maps hash the same input).
pub(super) fn meta_hasher(m: &HashMap<String, String>) -> Xxh3 {
    let mut keys: Vec<&String> = m.keys().filter(|k| k.as_str() != "checksum").collect();
    keys.sort();
    let mut h = Xxh3::new();
    for k in keys {
        let v = &m[k];
        h.update(&(k.len() as u64).to_le_bytes());
        h.update(k.as_bytes());
        h.update(&(v.len() as u64).to_le_bytes());
        h.update(v.as_bytes());
    }
    h
}

/// The header length from the first 8 bytes, checked against the limits
/// before anything is allocated.
pub(super) fn header_len(n8: [u8; 8], file_len: u64) -> Result<usize, String> {
    let n = u64::from_le_bytes(n8);
    if n > MAX_HEADER_BYTES {
        return Err(format!("header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit"));
    }
    if n > file_len - 8 {
        return Err(format!("header of {n} bytes runs past the end of the {file_len}-byte file"));
    }
    if n % 8 != 0 {
        return Err(format!("header length {n} is not a multiple of 8 (tensor data would be misaligned)"));
    }
    Ok(n as usize)
}

/// Why a header was refused.
pub(super) enum HeaderError {
    /// Damaged, or not an entry at all: [`PersistError::Invalid`].
    Invalid(String),
    /// An entry of another format version (the one found): [`PersistError::Mismatch`].
    Version(String),
}

impl HeaderError {
    pub(super) fn at(self, path: &Path) -> PersistError {
        match self {
            HeaderError::Invalid(reason) => PersistError::invalid(path, reason),
            HeaderError::Version(found) => {
                PersistError::Mismatch { path: path.to_path_buf(), what: "format version", found, expected: VERSION.to_string() }
            }
        }
    }
}

/// Validates a header against the file length. Returns the entry's info and
/// a hasher already fed the metadata. The magic and version are read first: an
/// entry of another version (older or newer) is a [`HeaderError::Version`] however
/// the rest is laid out, so it is a miss that stays, not a corrupt file.
pub(super) fn parse_header(header: &[u8], file_len: u64) -> Result<(EntryInfo, Xxh3), HeaderError> {
    let invalid = HeaderError::Invalid;
    let md: Metadata = serde_json::from_slice(header).map_err(|e| invalid(format!("header is not safetensors JSON: {e}")))?;
    let m = md.metadata().as_ref().ok_or_else(|| invalid("header has no __metadata__".into()))?;
    match m.get("magic") {
        Some(magic) if magic == MAGIC => {}
        other => return Err(invalid(format!("magic is {other:?}, not {MAGIC:?}"))),
    }
    match m.get("version") {
        Some(v) if *v == VERSION.to_string() => {}
        Some(v) if v.parse::<u32>().is_ok_and(|n| n.to_string() == *v) => return Err(HeaderError::Version(v.clone())),
        other => return Err(invalid(format!("version {other:?} is not a version number"))),
    }
    parse_fields(&md, m, header.len(), file_len).map_err(invalid)
}

/// [`parse_header`] past the magic and version.
pub(super) fn parse_fields(
    md: &Metadata,
    m: &HashMap<String, String>,
    header_len: usize,
    file_len: u64,
) -> Result<(EntryInfo, Xxh3), String> {
    let tensors = md.tensors();
    let window_ti = tensors.get(WINDOW_TENSOR);
    let Some(ti) = tensors.get(TENSOR_NAME).filter(|_| tensors.len() == 1 + window_ti.is_some() as usize) else {
        let mut names: Vec<_> = tensors.keys().cloned().collect();
        names.sort();
        return Err(format!("expected the tensor \"{TENSOR_NAME}\" and optionally \"{WINDOW_TENSOR}\", found {names:?}"));
    };
    let get = |k: &str| m.get(k).map(String::as_str).ok_or_else(|| format!("metadata key \"{k}\" missing"));
    if let Some(k) = m.keys().find(|k| !KEYS.contains(&k.as_str()) && !OPTIONAL_KEYS.contains(&k.as_str())) {
        return Err(format!("unknown metadata key {k:?}"));
    }
    let num = |k: &str, lo: u64, hi: u64| -> Result<u64, String> {
        let s = get(k)?;
        let v: u64 = s.parse().map_err(|_| format!("{k} is {s:?}, not a number"))?;
        if v.to_string() != s || v < lo || v > hi {
            return Err(format!("{k} is {s:?}, expected {lo}..={hi}"));
        }
        Ok(v)
    };
    let format: KvFormat = get("kv_format")?.parse().map_err(|e: KvError| e.to_string())?;
    num("block_tokens", BLOCK_TOKENS as u64, BLOCK_TOKENS as u64)?;
    let layout = KvLayout {
        num_layers: num("num_layers", 1, MAX_LAYERS)? as usize,
        num_kv_heads: num("num_kv_heads", 1, MAX_KV_HEADS)? as usize,
        head_dim: num("head_dim", 2, MAX_HEAD_DIM)? as usize,
    };
    let probe = KvPool::try_new(layout, format, 0).map_err(|e| e.to_string())?;
    let block_bytes = probe.block_bytes();
    // The data cannot be longer than the file, which bounds num_tokens.
    let num_tokens = num("num_tokens", 1, file_len)? as usize;
    let num_blocks = num_tokens.div_ceil(BLOCK_TOKENS);
    let (released, keep) = match m.get("released") {
        None => (None, Vec::new()),
        Some(r) => {
            let (g, blocks, keep) = parse_released(r, layout.num_layers, num_blocks, num_tokens)?;
            (Some((g, blocks)), keep)
        }
    };
    let num_released = released.as_ref().map_or(0, |(_, b)| b.len());
    let small = released.as_ref().map_or(0, |(g, _)| g.released_block_bytes(&probe));
    let data_len = (num_blocks - num_released)
        .checked_mul(block_bytes)
        .and_then(|f| num_released.checked_mul(small)?.checked_add(f))
        .ok_or("tensor size overflows")?;
    let shape = if released.is_some() { vec![data_len] } else { vec![num_blocks, block_bytes] };
    if ti.dtype != Dtype::U8 || ti.shape != shape || ti.data_offsets != (0, data_len) {
        return Err(format!("tensor is {:?} {:?} at {:?}, expected U8 {shape:?} at (0, {data_len})", ti.dtype, ti.shape, ti.data_offsets));
    }
    let window_bytes = match window_ti {
        None => 0,
        Some(w) => {
            let wb = probe.window_bytes();
            if !probe.has_window() || num_tokens % BLOCK_TOKENS == 0 {
                return Err(format!(
                    "a recent window for {num_tokens} tokens of {format} KV (only q8/q4 sequences ending in a partial block keep one)"
                ));
            }
            if w.dtype != Dtype::U8 || w.shape != [wb] || w.data_offsets != (data_len, data_len + wb) {
                return Err(format!(
                    "window tensor is {:?} {:?} at {:?}, expected U8 [{wb}] at ({data_len}, {})",
                    w.dtype,
                    w.shape,
                    w.data_offsets,
                    data_len + wb
                ));
            }
            wb
        }
    };
    let expect_len = (data_len as u64).checked_add(window_bytes as u64 + 8 + header_len as u64).ok_or("tensor size overflows")?;
    if file_len != expect_len {
        return Err(format!("file is {file_len} bytes, header describes {expect_len}"));
    }
    let fingerprint = get("fingerprint")?.to_string();
    check_fingerprint(&fingerprint)?;
    let kind = EntryKind::parse(get("kind")?).ok_or_else(|| format!("kind {:?} is not session or prefix", m["kind"]))?;
    let created_unix = num("created_unix", 0, u64::MAX)?;
    let tokens: Vec<u32> = serde_json::from_str(get("tokens")?).map_err(|e| format!("tokens: {e}"))?;
    if tokens.len() != num_tokens {
        return Err(format!("{} token ids for {num_tokens} tokens", tokens.len()));
    }
    let text = get("text")?.to_string();
    let offsets: Vec<(usize, usize)> = serde_json::from_str(get("offsets")?).map_err(|e| format!("offsets: {e}"))?;
    check_offsets(&offsets, &text, num_tokens)?;
    let cs = get("checksum")?;
    let checksum = u64::from_str_radix(cs, 16)
        .ok()
        .filter(|c| format!("{c:016x}") == cs)
        .ok_or_else(|| format!("checksum {cs:?} is not 16 lowercase hex digits"))?;
    let hasher = meta_hasher(m);
    let meta = EntryMeta { fingerprint, kind, owner: get("owner")?.to_string(), tokens, text, offsets, created_unix };
    let info = EntryInfo {
        meta,
        format,
        layout,
        num_tokens,
        num_blocks,
        block_bytes,
        window_bytes,
        kv_bytes: data_len,
        released,
        keep,
        file_bytes: file_len,
        checksum,
    };
    Ok((info, hasher))
}

/// The `released` metadata value: the sliding geometry (one flag per layer, a window of at
/// least one position, some layer sliding), the released blocks (ascending, distinct, at least
/// one, each full: below the last block unless that one is full) and resume points (ascending,
/// `<= num_tokens`).
fn parse_released(
    v: &str,
    num_layers: usize,
    num_blocks: usize,
    num_tokens: usize,
) -> Result<(crate::SlidingLayers, Vec<usize>, Vec<usize>), String> {
    let v: serde_json::Value = serde_json::from_str(v).map_err(|e| format!("released: {e}"))?;
    let bad = || format!("released is {v}, expected {{\"window\", \"sliding\", \"blocks\", \"keep\"}}");
    let obj = v.as_object().filter(|o| o.len() == 4).ok_or_else(bad)?;
    let window = obj.get("window").and_then(|w| w.as_u64()).ok_or_else(bad)? as usize;
    let sliding: Vec<bool> = obj
        .get("sliding")
        .and_then(|s| s.as_array())
        .ok_or_else(bad)?
        .iter()
        .map(|b| b.as_bool())
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let nums = |k: &str| -> Result<Vec<usize>, String> {
        obj.get(k)
            .and_then(|s| s.as_array())
            .ok_or_else(bad)?
            .iter()
            .map(|b| b.as_u64().map(|x| x as usize))
            .collect::<Option<_>>()
            .ok_or_else(bad)
    };
    let (blocks, keep) = (nums("blocks")?, nums("keep")?);
    if sliding.len() != num_layers {
        return Err(format!("released: {} layer flags for {num_layers} layers", sliding.len()));
    }
    let g = crate::SlidingLayers::new(window, sliding).ok_or("released: no sliding layer or a zero window")?;
    let full_blocks = num_tokens / BLOCK_TOKENS;
    if blocks.is_empty() || !blocks.windows(2).all(|w| w[0] < w[1]) || blocks.last().is_some_and(|&b| b >= full_blocks.min(num_blocks)) {
        return Err(format!("released: blocks {blocks:?} are not ascending full blocks of {num_blocks}"));
    }
    if !keep.windows(2).all(|w| w[0] < w[1]) || keep.last().is_some_and(|&p| p > num_tokens) {
        return Err(format!("released: resume points {keep:?} are not ascending positions up to {num_tokens}"));
    }
    Ok((g, blocks, keep))
}

pub(super) fn check_fingerprint(f: &str) -> Result<(), String> {
    if f.is_empty() || f.len() > MAX_FINGERPRINT || !f.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("fingerprint {f:?} is not 1..={MAX_FINGERPRINT} printable ASCII characters"));
    }
    Ok(())
}

/// Offsets are empty or one per token; each lies within `text` on character
/// boundaries; non-empty ranges are monotone (starts and ends never go
/// back). Empty ranges (special tokens, `(0, 0)`) may appear anywhere.
pub(super) fn check_offsets(offsets: &[(usize, usize)], text: &str, num_tokens: usize) -> Result<(), String> {
    if !offsets.is_empty() && offsets.len() != num_tokens {
        return Err(format!("{} offsets for {num_tokens} tokens", offsets.len()));
    }
    let mut prev = (0usize, 0usize);
    for (i, &(s, e)) in offsets.iter().enumerate() {
        if s > e || e > text.len() || !text.is_char_boundary(s) || !text.is_char_boundary(e) {
            return Err(format!("offset {i} ({s}, {e}) is not a range of the {}-byte text on character boundaries", text.len()));
        }
        if s < e {
            if s < prev.0 || e < prev.1 {
                return Err(format!("offset {i} ({s}, {e}) goes back before ({}, {})", prev.0, prev.1));
            }
            prev = (s, e);
        }
    }
    Ok(())
}
