//! What the chunk KV tree's files (`kv_tree/files.rs`) and the chunk store's
//! (`chunk_store/files.rs`) share: one `engram-kv` prefix entry per file, named
//! `<prefix>-<hash>.kv` in one folder, written once (temp + fsync + rename, by
//! `engram_kv::write_entry`), deleted when its entry is gone, and read back only through
//! `engram_kv::read_entry`'s checks.
//!
//! Invariant: a file that fails those checks as damaged is deleted; one that is sound but of
//! another model, format or version is left alone; either way it is reported and never used.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use engram_kv::{read_entry, write_entry, EntryKind, EntryMeta, KvPool, SeqKv};

/// Writes `kv`'s first `tokens.len()` rows as a prefix entry (`text` describes its shape) to
/// `path`.
pub(crate) fn write_prefix(path: &Path, fingerprint: String, tokens: Vec<u32>, text: String, kv: &SeqKv) -> std::io::Result<()> {
    let meta = EntryMeta {
        fingerprint,
        kind: EntryKind::Prefix,
        owner: String::new(),
        text,
        offsets: Vec::new(),
        created_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        tokens,
    };
    write_entry(path, &meta, &kv.fork(meta.tokens.len())).map(|_| ()).map_err(std::io::Error::other)
}

/// Deletes the files of `on_disk` (names in `dir`) not in `keep`, and forgets them.
pub(crate) fn remove_gone(dir: &Path, on_disk: &mut HashSet<String>, keep: &HashSet<String>) {
    let gone: Vec<String> = on_disk.difference(keep).cloned().collect();
    for name in gone {
        let _ = std::fs::remove_file(dir.join(&name));
        on_disk.remove(&name);
    }
}

/// The `<prefix>-*.kv` files in `dir`, sorted (none if it is missing).
pub(crate) fn list(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{prefix}-")) && n.ends_with(".kv")))
        .collect();
    files.sort();
    files
}

/// [`read_entry`] of `file`; a refusal is pushed to `rejected` (and the file deleted if it is
/// damaged) and gives `None`.
pub(crate) fn read_checked(
    file: &Path,
    pool: &KvPool,
    fingerprint: &str,
    vocab: usize,
    rejected: &mut Vec<(PathBuf, String)>,
) -> Option<(EntryMeta, SeqKv)> {
    match read_entry(file, pool, fingerprint, vocab) {
        Ok(x) => Some(x),
        Err(e) => {
            if e.is_corrupt() {
                let _ = std::fs::remove_file(file);
            }
            rejected.push((file.to_path_buf(), e.to_string()));
            None
        }
    }
}

/// The file's name (what `on_disk` sets hold).
pub(crate) fn name_of(file: &Path) -> String {
    file.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string()
}
