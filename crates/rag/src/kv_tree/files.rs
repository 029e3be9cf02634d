//! The chunk KV tree on disk: one `engram-kv` entry file per leaf (`tree-<blake3>.kv`: the KV of
//! the leaf's whole prefix, its tokens, and its segment path and ends as the entry's text), so a
//! tree survives a restart. Loading a leaf re-inserts every prefix of its path (forks of the
//! mapped blocks).
//!
//! Invariant: a file is used only after `engram_kv::read_entry` has checked it (magic, version,
//! shape, the model's fingerprint and KV format, token ids, checksum) and its path and ends are
//! consistent with its tokens; a damaged file is deleted, a sound one of another model or
//! version is left alone and never used; writes are temp + fsync + rename
//! (`engram_kv::write_entry`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use engram_kv::{cache_fingerprint, KvPool};

use super::{KvTree, SegKey};
use crate::entry_files;

/// What [`KvTree::load`] found.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Leaf files loaded.
    pub loaded: usize,
    /// Files refused, with why (damaged ones were also deleted).
    pub rejected: Vec<(PathBuf, String)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Shape {
    path: Vec<SegKey>,
    ends: Vec<usize>,
}

fn file_name(path: &[SegKey], tokens: &[u32]) -> String {
    let mut h = blake3::Hasher::new();
    for s in path {
        h.update(s.as_bytes());
        h.update(&[0]);
    }
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    format!("tree-{}.kv", &h.finalize().to_hex()[..32])
}

impl KvTree {
    fn entry_fingerprint(&self) -> String {
        cache_fingerprint(self.fingerprint, self.format)
    }

    /// Writes each leaf not on disk yet to `dir` and deletes the files this tree wrote or
    /// loaded whose entries are gone (evicted, forgotten, or no longer leaves). Returns the
    /// files written.
    pub fn save(&mut self, dir: &Path) -> std::io::Result<usize> {
        std::fs::create_dir_all(dir)?;
        let leaves: Vec<Vec<SegKey>> = self.entries.iter().filter(|(_, e)| e.children == 0).map(|(k, _)| k.clone()).collect();
        let mut keep = HashSet::new();
        let mut written = 0;
        for path in leaves {
            let e = &self.entries[&path];
            let name = file_name(&path, &e.tokens);
            keep.insert(name.clone());
            if self.on_disk.contains(&name) {
                continue;
            }
            // Every ancestor is stored (eviction takes leaves, forgetting takes subtrees).
            let ends: Vec<usize> = (1..=path.len()).map(|d| self.entries.get(&path[..d]).map_or(0, |a| a.tokens.len())).collect();
            let text = serde_json::to_string(&Shape { path: path.clone(), ends }).map_err(std::io::Error::other)?;
            entry_files::write_prefix(&dir.join(&name), self.entry_fingerprint(), e.tokens.clone(), text, &e.kv)?;
            self.on_disk.insert(name);
            written += 1;
        }
        entry_files::remove_gone(dir, &mut self.on_disk, &keep);
        Ok(written)
    }

    /// Loads every `tree-*.kv` in `dir` (none if it is missing) into the tree, KV mapped and
    /// charged to `pool`; token ids must be below `vocab`. See the module doc.
    pub fn load(&mut self, dir: &Path, pool: &KvPool, vocab: usize) -> LoadReport {
        let mut report = LoadReport::default();
        let fp = self.entry_fingerprint();
        for file in entry_files::list(dir, "tree") {
            let Some((meta, kv)) = entry_files::read_checked(&file, pool, &fp, vocab, &mut report.rejected) else { continue };
            let shape: Option<Shape> = serde_json::from_str(&meta.text).ok();
            let ok = shape.as_ref().is_some_and(|s| {
                !s.path.is_empty()
                    && s.path.len() == s.ends.len()
                    && s.ends.windows(2).all(|w| w[0] < w[1])
                    && s.ends[0] > 0
                    && s.ends.last() == Some(&meta.tokens.len())
                    && kv.len() >= meta.tokens.len()
            });
            let name = entry_files::name_of(&file);
            match shape {
                Some(s) if ok && file_name(&s.path, &meta.tokens) == name => {
                    self.insert(&s.path, &s.ends, &meta.tokens, &kv);
                    self.on_disk.insert(name);
                    report.loaded += 1;
                }
                _ => {
                    let _ = std::fs::remove_file(&file);
                    report.rejected.push((file, "segment path and ends do not match the entry's tokens".into()));
                }
            }
        }
        report
    }
}
