//! Cache entry files: one sequence's KV plus what is needed to reuse it, as a
//! safetensors file that is restored by mapping it: computing starts on the
//! file's pages, and a copy in RAM takes their place once the checksum passes.
//!
//! ```text
//!  0          8                               8+n (a multiple of 8)
//!  [ n: u64 LE ][ JSON header, space-padded     ][ tensor "kv": U8 [num_blocks, block_bytes] ][ "window": U8 [w] ]
//!                {"__metadata__": {...},          row b = Block::bytes() of block b            optional: q8/q4
//!                 "kv": {...}, "window": {...}}   (positions b*32 .. b*32+32)                   recent window
//! ```
//! `window`, present only for a q8/q4 sequence that ends in a partial block
//! and held its recent window, is that window (`recent_window.rs`: the partial
//! block's rows in f16, block layout), so a restored sequence attends its
//! newest tokens exactly as the live one did.
//! The `__metadata__` keys, all string-valued (see [`KEYS`]): `magic`
//! (`engram-kv`), `version` (`2`), `fingerprint` ([`cache_fingerprint`]),
//! `kv_format`, `block_tokens`, `num_layers`, `num_kv_heads`, `head_dim`,
//! `num_tokens`, `tokens` (JSON array of u32), `text`, `offsets` (JSON array of
//! `[start, end]` byte ranges into `text`, one per token, or empty), `kind`
//! (`session` | `prefix`), `owner`, `created_unix` and `checksum`: xxh3-64,
//! 16 lowercase hex digits, over every other key and value (sorted by key,
//! each length-prefixed) followed by the tensor bytes (`kv`, then `window`).
//!
//! One optional key, `released`, is present only for a sequence whose sliding layers were
//! released outside their window (`sliding.rs`): JSON `{"window": W, "sliding": [bool per
//! layer], "blocks": [released block indices, ascending], "keep": [resume points]}`. Such a
//! file stores only what is held: released blocks' rows are their global layers' sections,
//! and the `kv` tensor is then one flat run of bytes (`U8 [n]`, rows in block order) instead of
//! `[num_blocks, block_bytes]`.
//!
//! Invariants:
//! * Nothing read is trusted (ARCHITECTURE.md invariant (3)): any byte string either
//!   yields exactly an entry that was written or a [`PersistError`] naming the
//!   file and the reason. Never a panic; the only allocation before
//!   validation is the header, bounded by [`MAX_HEADER_BYTES`].
//! * Writes are crash-safe (invariant 4): a temp file in the same directory,
//!   fsync, rename, fsync of the directory. A kill at any moment leaves the
//!   old file or the new one. Files are never modified in place, which is
//!   also what makes mapping them safe: a restored sequence keeps reading the
//!   old inode while a newer version replaces the name.
//! * Restored blocks are the file's pages ([`KvPool::mapped_block`]), charged
//!   to the RAM budget like any block; writing after a restore copies the
//!   partial last block first (copy-on-write in `SeqKv::reserve`). Once the
//!   checksum has passed, the thread that checked it copies every block into
//!   RAM and the blocks read the copy ([`crate::Block::is_in_ram`]): a file
//!   truncated under the process (not ours to do, but SECURITY.md's fault
//!   tests do it) can fault only reads made before that, during the restore's
//!   own prefill, never a session kept in RAM afterwards.
//!
//! NOTE: the header is built and parsed with the `safetensors` crate's
//! `Metadata` (so its offset and shape rules apply), but the tensor bytes are
//! streamed by hand: `safetensors::serialize_to_file` wants each tensor as one
//! contiguous `View::data()`, and a sequence's rows are scattered blocks, so
//! it would first copy the whole cache (hundreds of MiB) into one buffer.
//!
//! NOTE: stale slots of a partial last block (tokens past the sequence's
//! length, left by `truncate`) are written as zeros, so trimmed text never
//! reaches the disk.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use engram_model::{Fingerprint, KvElem};
use memmap2::Mmap;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;
use xxhash_rust::xxh3::Xxh3;

use crate::block::{LineBytes, BLOCK_TOKENS};
use crate::error::KvError;
use crate::format::KvFormat;
use crate::pool::{KvLayout, KvPool};
use crate::seq::SeqKv;

mod bytes;
mod deferred;
mod header;
pub use bytes::{decode_entry, encode_entry, encode_entry_range};
pub use deferred::{check_in_background, open_entry_unchecked, UncheckedEntry};
use header::{check_fingerprint, check_offsets, header_len, meta_hasher, parse_header};

/// The `magic` metadata value.
pub const MAGIC: &str = "engram-kv";
/// The `version` metadata value this build writes and reads.
pub const VERSION: u32 = 2;
/// The block rows' tensor name.
pub const TENSOR_NAME: &str = "kv";
/// The optional recent window's tensor name.
pub const WINDOW_TENSOR: &str = "window";
/// Headers larger than this are refused before anything is allocated.
/// 64 MiB holds the tokens, offsets and text of well over a million tokens.
pub const MAX_HEADER_BYTES: u64 = 64 << 20;
/// The metadata keys, exactly; a file with any other key set is refused.
pub const KEYS: [&str; 16] = [
    "magic",
    "version",
    "fingerprint",
    "kv_format",
    "block_tokens",
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "num_tokens",
    "tokens",
    "text",
    "offsets",
    "kind",
    "owner",
    "created_unix",
    "checksum",
];

/// Metadata keys a file may carry besides [`KEYS`].
pub const OPTIONAL_KEYS: [&str; 1] = ["released"];

/// Marks temp files: `.<final name>.tmp-<pid>-<n>`. Readers skip names that
/// start with a dot; `DiskStore::open` deletes these.
pub(crate) const TEMP_MARK: &str = ".tmp-";

// Shape limits checked before any arithmetic on them (no overflow below).
const MAX_LAYERS: u64 = 4096;
const MAX_KV_HEADS: u64 = 4096;
const MAX_HEAD_DIM: u64 = 65536;
const MAX_FINGERPRINT: usize = 256;

/// What an entry is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// One owner's conversation or agent state, extended turn by turn.
    Session,
    /// A read-only shared prefix (system prompt, document).
    Prefix,
}

impl EntryKind {
    /// The `kind` metadata value.
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::Session => "session",
            EntryKind::Prefix => "prefix",
        }
    }
    /// The kind named `s`, if any.
    pub fn parse(s: &str) -> Option<EntryKind> {
        match s {
            "session" => Some(EntryKind::Session),
            "prefix" => Some(EntryKind::Prefix),
            _ => None,
        }
    }
}

impl std::fmt::Display for EntryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What an entry carries besides the KV bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    /// [`cache_fingerprint`] of the model and KV format that made the KV.
    pub fingerprint: String,
    pub kind: EntryKind,
    /// The session, agent or tenant the entry belongs to (empty: shared).
    pub owner: String,
    /// One token id per cached position.
    pub tokens: Vec<u32>,
    /// The rendered text the tokens were encoded from.
    pub text: String,
    /// Byte range of each token in `text`, or empty when unknown.
    pub offsets: Vec<(usize, usize)>,
    pub created_unix: u64,
}

/// An entry's header: its metadata and the shape of its KV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryInfo {
    pub meta: EntryMeta,
    pub format: KvFormat,
    pub layout: KvLayout,
    pub num_tokens: usize,
    pub num_blocks: usize,
    pub block_bytes: usize,
    /// Bytes of the recent window stored after the blocks (0: none).
    pub window_bytes: usize,
    /// Bytes of the blocks' rows (`num_blocks * block_bytes` unless some are released).
    pub kv_bytes: usize,
    /// The sliding geometry of the released blocks, and which blocks those are (ascending;
    /// empty: every block holds every layer).
    pub released: Option<(crate::SlidingLayers, Vec<usize>)>,
    /// Resume points of the sequence (`SeqKv::keep_window_at`), where it released anything.
    pub keep: Vec<usize>,
    /// Size of the whole file.
    pub file_bytes: u64,
    pub checksum: u64,
}

/// Why an entry file could not be used. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// No file at the path.
    #[error("{}: no such cache entry", path.display())]
    NotFound { path: PathBuf },
    /// The file system failed (reading, writing, renaming).
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is damaged or not an entry at all: drop it and recompute.
    #[error("{}: invalid cache entry: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    /// A sound entry made by another model, KV format or layout, or an entry of
    /// another format version (older or newer; this build cannot read it): a miss.
    #[error("{}: cache entry has {what} {found}, expected {expected}", path.display())]
    Mismatch { path: PathBuf, what: &'static str, found: String, expected: String },
    /// The entry cannot be written as given (caller bug or unsupported shape).
    #[error("{}: cannot write cache entry: {reason}", path.display())]
    Unwritable { path: PathBuf, reason: String },
    /// The restored blocks do not fit the RAM budget.
    #[error("{}: {source}", path.display())]
    Kv {
        path: PathBuf,
        #[source]
        source: KvError,
    },
}

impl PersistError {
    /// The file concerned.
    pub fn path(&self) -> &Path {
        match self {
            PersistError::NotFound { path }
            | PersistError::Io { path, .. }
            | PersistError::Invalid { path, .. }
            | PersistError::Mismatch { path, .. }
            | PersistError::Unwritable { path, .. }
            | PersistError::Kv { path, .. } => path,
        }
    }
    /// True when the file itself is bad and should be deleted.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, PersistError::Invalid { .. })
    }
    fn io(path: &Path, source: std::io::Error) -> PersistError {
        if source.kind() == std::io::ErrorKind::NotFound {
            PersistError::NotFound { path: path.to_path_buf() }
        } else {
            PersistError::Io { path: path.to_path_buf(), source }
        }
    }
    fn invalid(path: &Path, reason: impl Into<String>) -> PersistError {
        PersistError::Invalid { path: path.to_path_buf(), reason: reason.into() }
    }
}

/// The fingerprint string entries carry: the model's fingerprint (weights,
/// tokenizer, template, positional settings) and the KV format, e.g.
/// `0123456789abcdef-f16`. Any difference is a miss.
pub fn cache_fingerprint(model: Fingerprint, format: KvFormat) -> String {
    format!("{model}-{format}")
}

/// The same identity as [`cache_fingerprint`] as one hash (model fingerprint
/// extended by the format name), for keys that hash it further, such as the
/// prefix index's chained block hashes. Any difference is a miss.
pub fn cache_key(model: Fingerprint, format: KvFormat) -> Fingerprint {
    Fingerprint(engram_model::model::fnv1a64(model.0, format.name().as_bytes()))
}

/// Bytes [`write_entry`] would write for `kv` with `meta` (for budgeting
/// before writing).
pub fn encoded_len(meta: &EntryMeta, kv: &SeqKv) -> Result<u64, PersistError> {
    let p = Path::new("<entry>");
    // The checksum is fixed-width, so the length is known without reading the KV bytes (a
    // long session's are hundreds of MB; the disk store asks under its lock).
    let prepared = prepare(p, meta, kv, 0..kv.len(), Checksum::Placeholder)?;
    Ok(prepared.total_len())
}

/// Writes `kv` and `meta` to `path` atomically (temp file in the same
/// directory, fsync, rename, fsync of the directory). Returns the bytes written.
pub fn write_entry(path: &Path, meta: &EntryMeta, kv: &SeqKv) -> Result<u64, PersistError> {
    let prepared = prepare(path, meta, kv, 0..kv.len(), Checksum::Computed)?;
    atomic_write(path, |w| {
        w.write_all(&(prepared.header.len() as u64).to_le_bytes())?;
        w.write_all(&prepared.header)?;
        for row in &prepared.rows {
            w.write_all(row)?;
        }
        if let Some(win) = &prepared.window {
            w.write_all(win)?;
        }
        Ok(())
    })
    .map_err(|e| PersistError::Io { path: path.to_path_buf(), source: e })?;
    Ok(prepared.total_len())
}

/// Writes a file atomically: `.<name>.tmp-<pid>-<n>` in the same directory,
/// fsync, rename over `path`, fsync of the directory. On error the temp file
/// is removed and `path` is untouched.
pub fn atomic_write(path: &Path, write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no UTF-8 file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(".{name}{TEMP_MARK}{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let result = (|| -> std::io::Result<()> {
        let file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        write(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        // The rename is durable only once the directory is.
        File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Reads and validates an entry's header only (no checksum of the tensor
/// bytes): for listing.
pub fn read_meta(path: &Path) -> Result<EntryInfo, PersistError> {
    let mut file = File::open(path).map_err(|e| PersistError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| PersistError::io(path, e))?.len();
    if file_len < 8 {
        return Err(PersistError::invalid(path, format!("file is {file_len} bytes, shorter than a safetensors header")));
    }
    let mut n8 = [0u8; 8];
    file.read_exact(&mut n8).map_err(|e| PersistError::io(path, e))?;
    let n = header_len(n8, file_len).map_err(|r| PersistError::invalid(path, r))?;
    let mut header = vec![0u8; n];
    file.read_exact(&mut header).map_err(|e| PersistError::io(path, e))?;
    parse_header(&header, file_len).map(|(info, _)| info).map_err(|e| e.at(path))
}

/// Reads an entry's header and checks the checksum over all its bytes,
/// without restoring it (for `gc`).
pub fn verify_entry(path: &Path) -> Result<EntryInfo, PersistError> {
    let (map, n, info, hasher) = map_entry(path)?;
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::WillNeed);
    check_sum(path, &map[8 + n..], info.checksum, hasher)?;
    Ok(info)
}

/// Maps the entry at `path`, validates everything (header, shape against
/// `pool`, fingerprint, token ids below `vocab_size`, checksum) and returns
/// its metadata and a sequence whose blocks are the file's mapped rows.
pub fn read_entry(path: &Path, pool: &KvPool, expect_fingerprint: &str, vocab_size: usize) -> Result<(EntryMeta, SeqKv), PersistError> {
    let (meta, kv, sum) = open(path, pool, expect_fingerprint, vocab_size)?;
    // The caller waits for all of it: the whole file at once is the fastest read.
    #[cfg(unix)]
    let _ = sum.map.advise(memmap2::Advice::WillNeed);
    sum.check()?;
    Ok((meta, kv))
}

/// What is left to verify of an opened entry: the checksum over its bytes.
struct PendingSum {
    path: PathBuf,
    map: Arc<Mmap>,
    data_offset: usize,
    checksum: u64,
    /// Already fed the metadata.
    hasher: Xxh3,
    /// The restored blocks' private-copy slots, with their offsets in `map`.
    copies: Vec<(Arc<OnceLock<LineBytes>>, usize)>,
    block_bytes: usize,
}

impl PendingSum {
    /// Checks the sum, then copies every block's bytes into RAM (the blocks read the copy from
    /// then on: a file truncated under the process cannot fault them any more). The bytes are
    /// in the page cache from the sum, so the copy is a memory copy on this background thread.
    fn check(self) -> Result<(), PersistError> {
        check_sum(&self.path, &self.map[self.data_offset..], self.checksum, self.hasher)?;
        for (slot, offset) in &self.copies {
            let _ = slot.set(LineBytes::copy_of(&self.map[*offset..*offset + self.block_bytes]));
        }
        Ok(())
    }
}

/// A checksum over an entry's bytes being computed on its own thread.
///
/// Invariant: until [`ChecksumCheck::wait`] returns `Ok`, the KV it came
/// with may hold any bytes; it may be read (attention on garbage numbers is
/// harmless) but nothing computed from it may be shown, kept or shared.
#[must_use = "a restored entry is unverified until its check is waited for"]
pub struct ChecksumCheck {
    path: PathBuf,
    handle: std::thread::JoinHandle<Result<(), PersistError>>,
}

impl ChecksumCheck {
    /// Waits for the checksum; `Err` ([`PersistError::is_corrupt`]) when the
    /// bytes are not the ones written.
    pub fn wait(self) -> Result<(), PersistError> {
        self.handle.join().unwrap_or_else(|_| Err(PersistError::invalid(&self.path, "checksum thread panicked")))
    }
}

/// [`read_entry`] without waiting for the checksum of the KV bytes: every
/// other check has passed, and the checksum runs on a background thread while
/// the caller starts computing on the mapped blocks (reading them from disk
/// once, for both). The caller must [`ChecksumCheck::wait`] before it uses
/// anything computed from the sequence, and drop it on `Err`.
pub fn open_entry(
    path: &Path,
    pool: &KvPool,
    expect_fingerprint: &str,
    vocab_size: usize,
) -> Result<(EntryMeta, SeqKv, ChecksumCheck), PersistError> {
    let (meta, kv, sum) = open(path, pool, expect_fingerprint, vocab_size)?;
    let (num_blocks, block_bytes, layer_bytes) = (kv.blocks().len(), pool.block_bytes(), 2 * pool.section_bytes());
    let handle = std::thread::Builder::new()
        .name("engram-kv-checksum".into())
        .spawn(move || {
            read_ahead_layer_major(&sum.map, sum.data_offset, num_blocks, block_bytes, layer_bytes);
            sum.check()
        })
        .map_err(|e| PersistError::io(path, e))?;
    Ok((meta, kv, ChecksumCheck { path: path.to_path_buf(), handle }))
}

/// Maps and validates everything but the checksum, which it leaves to the
/// caller. Nothing is read of the KV bytes beyond the window's copy, so an
/// entry that fails here (a full RAM budget) is not read in vain.
fn open(path: &Path, pool: &KvPool, expect_fingerprint: &str, vocab_size: usize) -> Result<(EntryMeta, SeqKv, PendingSum), PersistError> {
    let (map, n, info, hasher) = map_entry(path)?;
    check_identity(path, &info, pool, expect_fingerprint, vocab_size)?;
    let data_offset = 8 + n;
    let kv_err = |e| PersistError::Kv { path: path.to_path_buf(), source: e };
    let mut blocks = Vec::with_capacity(info.num_blocks);
    let mut at = data_offset;
    for b in 0..info.num_blocks {
        let len = (info.num_tokens - b * BLOCK_TOKENS).min(BLOCK_TOKENS);
        // Released blocks are small (global layers only): copied into RAM now.
        let block = match released_of(&info, b) {
            Some(g) => {
                let rb = g.released_block_bytes(pool);
                let block = pool.released_block(&map[at..at + rb], len, g).map_err(kv_err)?;
                at += rb;
                block
            }
            None => {
                let block = pool.mapped_block(&map, at, len).map_err(kv_err)?;
                at += info.block_bytes;
                block
            }
        };
        blocks.push(Arc::new(block));
    }
    let mut kv = SeqKv::from_blocks(pool, blocks, info.num_tokens);
    if info.window_bytes > 0 {
        let at = data_offset + info.kv_bytes;
        kv.set_window(&map[at..at + info.window_bytes]).map_err(kv_err)?;
    }
    restore_release(&mut kv, &info);
    let copies = kv.blocks().iter().filter_map(|b| b.copy_slot()).collect();
    let sum =
        PendingSum { path: path.to_path_buf(), map, data_offset, checksum: info.checksum, hasher, copies, block_bytes: pool.block_bytes() };
    Ok((info.meta, kv, sum))
}

/// The sliding geometry block `b` of the entry was released by, if it was.
pub(crate) fn released_of(info: &EntryInfo, b: usize) -> Option<&crate::SlidingLayers> {
    info.released.as_ref().filter(|(_, blocks)| blocks.binary_search(&b).is_ok()).map(|(g, _)| g)
}

/// Gives a restored sequence the geometry and resume points it released by, so it keeps
/// releasing (and keeping) as the saved one did.
pub(crate) fn restore_release(kv: &mut SeqKv, info: &EntryInfo) {
    if let Some((g, _)) = &info.released {
        if g.num_layers() == kv.pool().layout().num_layers {
            kv.release_sliding(g.clone());
            for &p in &info.keep {
                kv.keep_window_at(p);
            }
        }
    }
}

/// The checks of an entry's identity against what the caller expects (model and KV format,
/// layout, block size, token ids within the vocabulary): cheap, so they run before any KV byte
/// is read, and a miss from another model never reads the data.
fn check_identity(path: &Path, info: &EntryInfo, pool: &KvPool, expect_fingerprint: &str, vocab_size: usize) -> Result<(), PersistError> {
    let mismatch = |what, found: String, expected: String| PersistError::Mismatch { path: path.to_path_buf(), what, found, expected };
    // Cheap checks first: a miss from another model must not read the data.
    if info.meta.fingerprint != expect_fingerprint {
        return Err(mismatch("fingerprint", info.meta.fingerprint.clone(), expect_fingerprint.to_string()));
    }
    if info.format != pool.format() {
        return Err(mismatch("KV format", info.format.to_string(), pool.format().to_string()));
    }
    if info.layout != pool.layout() {
        return Err(mismatch("layout", format!("{:?}", info.layout), format!("{:?}", pool.layout())));
    }
    if info.block_bytes != pool.block_bytes() {
        return Err(PersistError::invalid(path, format!("block of {} bytes, pool uses {}", info.block_bytes, pool.block_bytes())));
    }
    if let Some((i, &t)) = info.meta.tokens.iter().enumerate().find(|(_, &t)| t as usize >= vocab_size) {
        return Err(PersistError::invalid(path, format!("token {i} has id {t}, vocabulary has {vocab_size}")));
    }
    Ok(())
}

/// Asks the kernel to read the entry's KV in the order a forward pass reads
/// it: layer 0's keys and values of every block, then layer 1's, and so on.
/// The file is block-major, so plain sequential readahead would make the
/// first layer wait for the whole file; in this order layer `l` is in memory
/// after `(l + 1) / num_layers` of the read, and the prefill computes while
/// the rest arrives. Advice only: errors are ignored and nothing waits here.
fn read_ahead_layer_major(map: &Mmap, data_offset: usize, num_blocks: usize, block_bytes: usize, layer_bytes: usize) {
    #[cfg(unix)]
    if resident(map) {
        return; // In the page cache already: thousands of advice calls would only cost CPU.
    }
    #[cfg(unix)]
    for layer in 0..block_bytes / layer_bytes {
        for b in 0..num_blocks {
            let _ = map.advise_range(memmap2::Advice::WillNeed, data_offset + b * block_bytes + layer * layer_bytes, layer_bytes);
        }
    }
    #[cfg(not(unix))]
    let _ = (map, data_offset, num_blocks, block_bytes, layer_bytes);
}

/// Whether every page of `map` is in memory (`mincore`); false when unknown.
#[cfg(unix)]
fn resident(map: &Mmap) -> bool {
    // SAFETY: `sysconf` has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    let mut vec = vec![0u8; map.len().div_ceil(page)];
    // SAFETY: `map` is a live mapping of `map.len()` bytes starting on a page boundary, and `vec`
    // has one byte per page of it.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), vec.as_mut_ptr()) };
    rc == 0 && vec.iter().all(|&b| b & 1 != 0)
}

/// True for names [`write_entry`] gives its temp files.
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(TEMP_MARK)
}

// ---------------------------------------------------------------------------
// Internals: header building, parsing and checksums.

struct Prepared<'a> {
    /// JSON, space-padded so that the data after it starts at a multiple of 64 bytes.
    header: Vec<u8>,
    rows: Vec<Cow<'a, [u8]>>,
    window: Option<Vec<u8>>,
}

impl Prepared<'_> {
    fn total_len(&self) -> u64 {
        let window = self.window.as_ref().map_or(0, |w| w.len() as u64);
        8 + self.header.len() as u64 + self.rows.iter().map(|r| r.len() as u64).sum::<u64>() + window
    }
}

/// Whether [`prepare`] hashes the KV bytes into the header's checksum, or writes a
/// placeholder of the same width (for the length alone).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Checksum {
    Computed,
    Placeholder,
}

/// Builds the header and rows of an entry holding `kv`'s tokens `range` (the whole sequence for
/// an entry file; a run of blocks for [`encode_entry_range`]): `range.start` is a block
/// boundary, `range.end` one too or the sequence's end (where the recent window belongs).
fn prepare<'a>(
    path: &Path,
    meta: &EntryMeta,
    kv: &'a SeqKv,
    range: std::ops::Range<usize>,
    checksum: Checksum,
) -> Result<Prepared<'a>, PersistError> {
    let unwritable = |reason: String| PersistError::Unwritable { path: path.to_path_buf(), reason };
    let pool = kv.pool();
    let layout = pool.layout();
    if range.start % BLOCK_TOKENS != 0 || range.end > kv.len() || (range.end % BLOCK_TOKENS != 0 && range.end != kv.len()) {
        return Err(unwritable(format!("tokens {range:?} of {} are not a run of whole blocks", kv.len())));
    }
    let num_tokens = range.len();
    if num_tokens == 0 {
        return Err(unwritable("the sequence is empty".into()));
    }
    if kv.has_moved_positions() {
        return Err(unwritable("some tokens sit at moved positions, which entry files do not record".into()));
    }
    if meta.tokens.len() != num_tokens {
        return Err(unwritable(format!("{} token ids for {num_tokens} cached positions", meta.tokens.len())));
    }
    check_fingerprint(&meta.fingerprint).map_err(unwritable)?;
    check_offsets(&meta.offsets, &meta.text, num_tokens).map_err(unwritable)?;

    let blocks = &kv.blocks()[range.start / BLOCK_TOKENS..range.end.div_ceil(BLOCK_TOKENS)];
    let mut rows: Vec<Cow<'a, [u8]>> = blocks.iter().map(|b| Cow::Borrowed(b.bytes())).collect();
    let tail = num_tokens % BLOCK_TOKENS;
    if tail != 0 {
        let last = rows.last_mut().expect("a non-empty sequence has a block");
        let mut bytes = last.to_vec();
        zero_stale_slots(layout, pool.elem().row_bytes(layout.head_dim), pool.section_bytes(), &mut bytes, tail);
        *last = Cow::Owned(bytes);
    }
    // The window belongs to the sequence's last, partial block: only a range ending there has it.
    let window = kv.window().filter(|_| range.end == kv.len()).map(|w| {
        let mut bytes = w.to_vec();
        zero_stale_slots(layout, KvElem::F16.row_bytes(layout.head_dim), pool.window_section_bytes(), &mut bytes, tail);
        bytes
    });

    let mut m: HashMap<String, String> = HashMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_string(), v);
    };
    put("magic", MAGIC.into());
    put("version", VERSION.to_string());
    put("fingerprint", meta.fingerprint.clone());
    put("kv_format", pool.format().name().into());
    put("block_tokens", BLOCK_TOKENS.to_string());
    put("num_layers", layout.num_layers.to_string());
    put("num_kv_heads", layout.num_kv_heads.to_string());
    put("head_dim", layout.head_dim.to_string());
    put("num_tokens", num_tokens.to_string());
    put("tokens", serde_json::to_string(&meta.tokens).expect("u32s serialize"));
    put("text", meta.text.clone());
    put("offsets", serde_json::to_string(&meta.offsets).expect("pairs serialize"));
    put("kind", meta.kind.name().into());
    put("owner", meta.owner.clone());
    put("created_unix", meta.created_unix.to_string());
    let released: Vec<usize> = blocks.iter().enumerate().filter(|(_, b)| b.released().is_some()).map(|(i, _)| i).collect();
    if let Some(&first) = released.first() {
        let g = blocks[first].released().expect("filtered above");
        if released.iter().any(|&i| blocks[i].released() != Some(g)) {
            return Err(unwritable("blocks released by different sliding geometries".into()));
        }
        let sliding: Vec<bool> = (0..g.num_layers()).map(|l| g.is_sliding(l)).collect();
        let keep: Vec<usize> =
            kv.resume_points().iter().filter(|&&p| p >= range.start && p <= range.end).map(|p| p - range.start).collect();
        let v = serde_json::json!({ "window": g.window(), "sliding": sliding, "blocks": released, "keep": keep });
        put("released", v.to_string());
    }
    let sum = match checksum {
        Checksum::Placeholder => 0,
        Checksum::Computed => {
            let mut h = meta_hasher(&m);
            for r in &rows {
                h.update(r);
            }
            if let Some(w) = &window {
                h.update(w);
            }
            h.digest()
        }
    };
    m.insert("checksum".into(), format!("{sum:016x}"));

    let bb = pool.block_bytes();
    let kv_len: usize = rows.iter().map(|r| r.len()).sum();
    // Rows of one size are a matrix; with released (smaller) blocks among them, one flat run.
    let shape = if released.is_empty() { vec![rows.len(), bb] } else { vec![kv_len] };
    let mut tensors = vec![(TENSOR_NAME.to_string(), TensorInfo { dtype: Dtype::U8, shape, data_offsets: (0, kv_len) })];
    if let Some(w) = &window {
        let info = TensorInfo { dtype: Dtype::U8, shape: vec![w.len()], data_offsets: (kv_len, kv_len + w.len()) };
        tensors.push((WINDOW_TENSOR.to_string(), info));
    }
    let md = Metadata::new(Some(m), tensors).map_err(|e| unwritable(e.to_string()))?;
    let mut header = serde_json::to_vec(&md).map_err(|e| unwritable(e.to_string()))?;
    // Pad so the tensor data starts on a 64-byte line of the (page-aligned) mapping: then every
    // mapped block and head section does too, as in RAM (`block::LineBytes`). Readers only
    // require a multiple of 8 (the safetensors rule), so older files still load.
    header.resize((8 + header.len()).next_multiple_of(64) - 8, b' ');
    if header.len() as u64 > MAX_HEADER_BYTES {
        return Err(unwritable(format!("header of {} bytes exceeds the {MAX_HEADER_BYTES}-byte limit", header.len())));
    }
    Ok(Prepared { header, rows, window })
}

/// Zeroes slots `len..BLOCK_TOKENS` of every layer's key and value rows in
/// `bytes`, a buffer in the block layout with `rb`-byte rows and `sec`-byte sections.
fn zero_stale_slots(layout: KvLayout, rb: usize, sec: usize, bytes: &mut [u8], len: usize) {
    for s in 0..2 * layout.num_layers {
        for h in 0..layout.num_kv_heads {
            let start = s * sec + (h * BLOCK_TOKENS + len) * rb;
            let end = s * sec + (h + 1) * BLOCK_TOKENS * rb;
            bytes[start..end].fill(0);
        }
    }
}

fn check_sum(path: &Path, data: &[u8], stored: u64, mut hasher: Xxh3) -> Result<(), PersistError> {
    hasher.update(data);
    let got = hasher.digest();
    if got != stored {
        return Err(PersistError::invalid(path, format!("checksum mismatch: stored {stored:016x}, computed {got:016x}")));
    }
    Ok(())
}

/// Maps the file and parses its header: (map, header length, info, hasher
/// over the metadata).
fn map_entry(path: &Path) -> Result<(Arc<Mmap>, usize, EntryInfo, Xxh3), PersistError> {
    let file = File::open(path).map_err(|e| PersistError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| PersistError::io(path, e))?.len();
    if file_len < 8 {
        return Err(PersistError::invalid(path, format!("file is {file_len} bytes, shorter than a safetensors header")));
    }
    // SAFETY: entry files are never modified in place (writers rename a new
    // file over the name), so the mapped inode does not change under us. A
    // foreign process truncating it would fault reads of the map (SIGBUS): the
    // map is read only by the header parse and the checksum thread, and by the
    // restored blocks until that thread has copied them into RAM (`PendingSum`).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| PersistError::io(path, e))?;
    let file_len = map.len() as u64;
    let n8: [u8; 8] = map[..8].try_into().expect("length checked");
    let n = header_len(n8, file_len).map_err(|r| PersistError::invalid(path, r))?;
    let (info, hasher) = parse_header(&map[8..8 + n], file_len).map_err(|e| e.at(path))?;
    Ok((Arc::new(map), n, info, hasher))
}
