//! The chunk store on disk: one `engram-kv` entry file per chunk
//! (`chunk-<blake3>.kv`: the KV of `sys + chunk` at positions `0..`, their tokens, and the
//! system prompt's key and length as the entry's text), in a folder per model and KV format
//! (the caller passes [`crate::tree_dir`] of its base), so blend reuse survives a restart. The
//! same entry format, checks and atomic writes as the chunk KV tree's files (`kv_tree/files.rs`).
//!
//! Invariant: a file is used only after `engram_kv::read_entry` has checked it (magic, version,
//! shape, the model's fingerprint and KV format, token ids, checksum), its system prompt key is
//! the hash of its first `sys_len` tokens, and its name is the hash of what it holds; a damaged
//! file is deleted, a sound one of another model, format or version is left alone and never
//! used (a miss: the chunk is computed again); the files mirror the entries in RAM after each
//! save, so they stay within the store's byte cap; writes are temp + fsync + rename.

use std::path::{Path, PathBuf};

use engram_kv::{cache_fingerprint, KvPool};

use super::{ChunkStore, Entry, Sys};
use crate::entry_files;
use crate::kv_tree::SegKey;

/// What [`ChunkStore::load`] found.
#[derive(Debug, Default)]
pub struct ChunkLoadReport {
    /// Chunk files loaded.
    pub loaded: usize,
    /// Files refused, with why (damaged ones were also deleted).
    pub rejected: Vec<(PathBuf, String)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Shape {
    sys: SegKey,
    chunk: SegKey,
    sys_len: usize,
}

fn file_name(sys: &str, chunk: &str, tokens: &[u32]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(sys.as_bytes());
    h.update(&[0]);
    h.update(chunk.as_bytes());
    h.update(&[0]);
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    format!("chunk-{}.kv", &h.finalize().to_hex()[..32])
}

/// The key [`crate::build_prompt`] gives a system prompt of `tokens`.
fn sys_key(tokens: &[u32]) -> SegKey {
    let mut h = blake3::Hasher::new();
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    format!("sys:{}", &h.finalize().to_hex()[..16])
}

impl ChunkStore {
    /// Writes each chunk not on disk yet to `dir` and deletes the files this store wrote or
    /// loaded whose chunks are gone (evicted or forgotten). Returns the files written.
    pub fn save(&mut self, dir: &Path) -> std::io::Result<usize> {
        std::fs::create_dir_all(dir)?;
        let fingerprint = cache_fingerprint(self.fingerprint, self.format);
        let mut keep = std::collections::HashSet::new();
        let mut written = 0;
        for ((sys, chunk), e) in &self.entries {
            let Some(s) = self.sys.get(sys).filter(|s| s.tokens.len() == e.sys_len) else {
                // The system prompt was evicted: its KV is still the entry's first `sys_len`
                // rows, but its tokens are gone with it; written once it is back.
                continue;
            };
            let mut tokens = s.tokens.clone();
            tokens.extend_from_slice(&e.tokens);
            let name = file_name(sys, chunk, &tokens);
            keep.insert(name.clone());
            if self.on_disk.contains(&name) {
                continue;
            }
            let text = serde_json::to_string(&Shape { sys: sys.clone(), chunk: chunk.clone(), sys_len: e.sys_len })
                .map_err(std::io::Error::other)?;
            entry_files::write_prefix(&dir.join(&name), fingerprint.clone(), tokens, text, &e.kv)?;
            self.on_disk.insert(name);
            written += 1;
        }
        entry_files::remove_gone(dir, &mut self.on_disk, &keep);
        Ok(written)
    }

    /// Loads every `chunk-*.kv` in `dir` (none if it is missing), KV mapped and charged to
    /// `pool`; token ids must be below `vocab`. Past the byte cap the least recently used are
    /// dropped again. See the module doc.
    pub fn load(&mut self, dir: &Path, pool: &KvPool, vocab: usize) -> ChunkLoadReport {
        let mut report = ChunkLoadReport::default();
        let fp = cache_fingerprint(self.fingerprint, self.format);
        for file in entry_files::list(dir, "chunk") {
            let Some((meta, kv)) = entry_files::read_checked(&file, pool, &fp, vocab, &mut report.rejected) else { continue };
            let name = entry_files::name_of(&file);
            let shape: Option<Shape> = serde_json::from_str(&meta.text).ok();
            let n = meta.tokens.len();
            let shape = shape.filter(|s| {
                s.sys_len > 0
                    && s.sys_len < n
                    && kv.len() >= n
                    && sys_key(&meta.tokens[..s.sys_len]) == s.sys
                    && file_name(&s.sys, &s.chunk, &meta.tokens) == name
            });
            let Some(s) = shape else {
                let _ = std::fs::remove_file(&file);
                report.rejected.push((file, "its system prompt key, length and name do not match its tokens".into()));
                continue;
            };
            let sys_tokens = meta.tokens[..s.sys_len].to_vec();
            self.sys.entry(s.sys.clone()).or_insert_with(|| Sys { kv: kv.fork(s.sys_len), tokens: sys_tokens });
            let entry = Entry { kv: kv.fork(n), tokens: meta.tokens[s.sys_len..].to_vec(), sys_len: s.sys_len, last_used: 0 };
            self.entries.insert((s.sys, s.chunk), entry);
            self.on_disk.insert(name);
            report.loaded += 1;
        }
        self.evict_to_cap();
        report
    }
}
