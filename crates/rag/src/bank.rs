//! [`KnowledgeBank`]: the user's documents as chunks, embedded and indexed, on disk.
//!
//! ```text
//!  <dir>/bank.manifest   envelope "engram-rag-bank" v1: documents, chunks (text, vector), generation
//!  <dir>/bm25/           tantivy index of the chunks, committed with the generation as payload
//! ```
//! An ingest parses, chunks and embeds everything first (any error: nothing changed), then
//! commits the index as generation g+1, then replaces the manifest (atomic rename) as g+1. A
//! crash between the two leaves the manifest at g and the index at g+1: the next open sees the
//! mismatch and rebuilds the index from the manifest. The manifest is the truth.
//!
//! Invariant: a document's chunks are exactly those of its last ingest; re-ingesting a source
//! (a file's path, a text's id) replaces all documents it produced; a failed operation (bad
//! input, unknown id, a failed write) leaves manifest and index as they were
//! (`tests/it/bank.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use engram_embed::TextEncoder;
use serde::{Deserialize, Serialize};

use crate::bm25::Bm25;
use crate::chunk::{chunk_text, DEFAULT_CHUNK_WORDS};
use crate::envelope;
use crate::error::{RagError, Result};
use crate::parse::{parse_bytes, parse_file, DocKind, ParsedDoc};
use crate::retrieve::{fuse, Retrieved};

const MAGIC: &str = "engram-rag-bank";
const VERSION: u32 = 1;
/// The manifest's file name in the bank's folder.
pub const MANIFEST_FILE: &str = "bank.manifest";

/// A chunk's id: blake3 of its document id, ordinal and text (16 hex digits), so a chunk
/// whose text changes gets a new id, and one id always names the same text.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChunkId(pub String);

impl ChunkId {
    fn of(doc: &str, ordinal: usize, text: &str) -> ChunkId {
        let mut h = blake3::Hasher::new();
        h.update(doc.as_bytes()).update(&[0]).update(&(ordinal as u64).to_le_bytes()).update(text.as_bytes());
        ChunkId(h.finalize().to_hex()[..16].to_string())
    }
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A stored document: where it came from and its chunks in order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DocEntry {
    pub kind: DocKind,
    /// The file path or text id it was ingested from (replacing that source replaces it).
    pub source: String,
    /// blake3 of its text.
    pub hash: String,
    pub chunks: Vec<ChunkId>,
    pub words: usize,
}

/// A stored chunk.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChunkEntry {
    pub doc: String,
    pub ordinal: usize,
    pub text: String,
    /// The encoder's vector of `text` (unit length for all-MiniLM-L6-v2).
    pub vector: Vec<f32>,
    /// The bank generation that added it.
    pub added: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Manifest {
    encoder: String,
    dim: usize,
    chunk_words: usize,
    generation: u64,
    docs: BTreeMap<String, DocEntry>,
    chunks: BTreeMap<ChunkId, ChunkEntry>,
}

/// What an ingest changed.
#[derive(Clone, Debug, Default)]
pub struct IngestReport {
    /// Documents written (new or replaced).
    pub docs: Vec<String>,
    /// Documents of the source that are gone (replaced or no longer in it).
    pub docs_removed: Vec<String>,
    pub chunks_added: Vec<ChunkId>,
    pub chunks_removed: Vec<ChunkId>,
    /// The source's text was unchanged: nothing written.
    pub unchanged: bool,
}

/// Counts for `engram rag stats`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BankStats {
    pub documents: usize,
    pub chunks: usize,
    pub words: usize,
    pub manifest_bytes: u64,
    pub index_bytes: u64,
    pub generation: u64,
}

/// The knowledge bank. See the module doc.
pub struct KnowledgeBank {
    dir: PathBuf,
    encoder: Arc<dyn TextEncoder>,
    m: Manifest,
    bm25: Bm25,
    rebuilt: bool,
}

impl KnowledgeBank {
    /// Opens (or creates) the bank in `dir` for `encoder`. A manifest that is damaged,
    /// truncated, foreign or made with another encoder is an error (nothing is touched); a
    /// BM25 index out of step with the manifest is rebuilt from it.
    pub fn open(dir: &Path, encoder: Arc<dyn TextEncoder>) -> Result<KnowledgeBank> {
        std::fs::create_dir_all(dir).map_err(|e| RagError::io(dir, e))?;
        let path = dir.join(MANIFEST_FILE);
        let m = match envelope::read_checked(&path, MAGIC, VERSION)? {
            Some(body) => {
                let m: Manifest = serde_json::from_slice(&body).map_err(|e| RagError::bad_store(&path, format!("manifest: {e}")))?;
                if m.encoder != encoder.id() || m.dim != encoder.dim() {
                    return Err(RagError::bad_store(
                        &path,
                        format!("made with encoder {} ({} dims), not {} ({} dims)", m.encoder, m.dim, encoder.id(), encoder.dim()),
                    ));
                }
                m
            }
            None => Manifest {
                encoder: encoder.id().to_string(),
                dim: encoder.dim(),
                chunk_words: DEFAULT_CHUNK_WORDS,
                generation: 0,
                docs: BTreeMap::new(),
                chunks: BTreeMap::new(),
            },
        };
        let mut all = m.chunks.iter().map(|(id, c)| (id.0.as_str(), c.text.as_str()));
        let (bm25, rebuilt) = Bm25::open(&dir.join("bm25"), m.generation, &mut all)?;
        Ok(KnowledgeBank { dir: dir.to_path_buf(), encoder, m, bm25, rebuilt })
    }

    /// Whether the last open rebuilt the BM25 index from the manifest.
    pub fn index_was_rebuilt(&self) -> bool {
        self.rebuilt
    }

    /// The encoder.
    pub fn encoder(&self) -> &Arc<dyn TextEncoder> {
        &self.encoder
    }

    /// The generation: how many changes were committed.
    pub fn generation(&self) -> u64 {
        self.m.generation
    }

    /// Ingests a file (its canonical path is the source; documents are named after it).
    pub fn ingest_file(&mut self, path: &Path) -> Result<IngestReport> {
        let canon = std::fs::canonicalize(path).map_err(|e| RagError::io(path, e))?;
        let source = canon.display().to_string();
        let docs = parse_file(&canon, &source)?;
        self.ingest_docs(&source, docs)
    }

    /// Ingests `text` of `kind` under `id` (the source and the document id).
    pub fn ingest_text(&mut self, id: &str, kind: DocKind, text: &str) -> Result<IngestReport> {
        if id.trim().is_empty() || id.len() > 512 {
            return Err(RagError::bad_input("document id", "must be 1 to 512 bytes, not blank"));
        }
        let docs = parse_bytes(&format!("document {id:?}"), id, kind, false, text.as_bytes())?;
        self.ingest_docs(id, docs)
    }

    /// Replaces every document of `source` with `docs`. See the module doc.
    pub fn ingest_docs(&mut self, source: &str, docs: Vec<ParsedDoc>) -> Result<IngestReport> {
        let old: Vec<String> = self.m.docs.iter().filter(|(_, d)| d.source == source).map(|(id, _)| id.clone()).collect();
        for d in &docs {
            if let Some(e) = self.m.docs.get(&d.id).filter(|e| e.source != source) {
                return Err(RagError::bad_input(&d.id, format!("a document of that id came from {}", e.source)));
            }
        }
        let hash = |t: &str| blake3::hash(t.as_bytes()).to_hex().to_string();
        let same = old.len() == docs.len() && docs.iter().all(|d| self.m.docs.get(&d.id).is_some_and(|e| e.hash == hash(&d.text)));
        if same {
            return Ok(IngestReport { docs: docs.into_iter().map(|d| d.id).collect(), unchanged: true, ..Default::default() });
        }
        let generation = self.m.generation + 1;
        let mut m = self.m.clone();
        let mut report = IngestReport::default();
        for id in &old {
            let e = m.docs.remove(id).expect("listed above");
            for c in e.chunks {
                m.chunks.remove(&c);
                report.chunks_removed.push(c);
            }
        }
        let mut to_embed: Vec<(ChunkId, String)> = Vec::new();
        for d in &docs {
            let texts = chunk_text(&d.text, m.chunk_words);
            let ids: Vec<ChunkId> = texts.iter().enumerate().map(|(i, t)| ChunkId::of(&d.id, i, t)).collect();
            for (i, (id, t)) in ids.iter().zip(&texts).enumerate() {
                match self.m.chunks.get(id) {
                    // The same text under the same id: keep its vector (and its KV elsewhere).
                    Some(c) if report.chunks_removed.contains(id) => {
                        m.chunks.insert(id.clone(), c.clone());
                    }
                    _ => {
                        m.chunks.insert(
                            id.clone(),
                            ChunkEntry { doc: d.id.clone(), ordinal: i, text: t.clone(), vector: Vec::new(), added: generation },
                        );
                        to_embed.push((id.clone(), t.clone()));
                    }
                }
            }
            let words = d.text.split_whitespace().count();
            m.docs.insert(d.id.clone(), DocEntry { kind: d.kind, source: source.to_string(), hash: hash(&d.text), chunks: ids, words });
            report.docs.push(d.id.clone());
        }
        let texts: Vec<String> = to_embed.iter().map(|(_, t)| t.clone()).collect();
        for (batch_ids, batch) in to_embed.chunks(64).zip(texts.chunks(64)) {
            let e = self.encoder.encode(batch)?;
            for ((id, _), v) in batch_ids.iter().zip(e.vectors) {
                m.chunks.get_mut(id).expect("inserted above").vector = v;
            }
        }
        // A chunk id both removed and re-added is unchanged: neither list names it.
        let kept: std::collections::HashSet<ChunkId> =
            report.chunks_removed.iter().filter(|c| m.chunks.contains_key(*c)).cloned().collect();
        report.chunks_removed.retain(|c| !kept.contains(c));
        report.chunks_added = to_embed.into_iter().map(|(id, _)| id).collect();
        report.docs_removed = old.into_iter().filter(|d| !m.docs.contains_key(d)).collect();
        m.generation = generation;
        self.commit(m, &report.chunks_removed, &report.chunks_added)?;
        Ok(report)
    }

    /// Removes document `id` (one message of an mbox, or a whole text/file document).
    pub fn remove(&mut self, id: &str) -> Result<Vec<ChunkId>> {
        let Some(e) = self.m.docs.get(id) else { return Err(RagError::UnknownId(id.to_string())) };
        let removed = e.chunks.clone();
        let mut m = self.m.clone();
        m.docs.remove(id);
        for c in &removed {
            m.chunks.remove(c);
        }
        m.generation += 1;
        self.commit(m, &removed, &[])?;
        Ok(removed)
    }

    /// Index first, then the manifest; on a failed manifest write the index is rebuilt from the
    /// manifest still in force, so both stay at the old generation.
    fn commit(&mut self, m: Manifest, removed: &[ChunkId], added: &[ChunkId]) -> Result<()> {
        let body = serde_json::to_vec(&m).map_err(|e| RagError::Index(e.to_string()))?;
        let rm: Vec<&str> = removed.iter().map(|c| c.as_str()).collect();
        let mut add = added.iter().map(|c| (c.as_str(), m.chunks[c].text.as_str()));
        let wrote = self
            .bm25
            .apply(&rm, &mut add, m.generation)
            .and_then(|_| envelope::write_atomic(&self.dir.join(MANIFEST_FILE), MAGIC, VERSION, &body));
        if let Err(e) = wrote {
            let mut all = self.m.chunks.iter().map(|(id, c)| (id.0.as_str(), c.text.as_str()));
            if let Ok((b, _)) = Bm25::open(&self.dir.join("bm25"), self.m.generation, &mut all) {
                self.bm25 = b;
            }
            return Err(e);
        }
        self.m = m;
        Ok(())
    }

    /// Documents, by id.
    pub fn docs(&self) -> &BTreeMap<String, DocEntry> {
        &self.m.docs
    }

    /// A chunk.
    pub fn chunk(&self, id: &ChunkId) -> Option<&ChunkEntry> {
        self.m.chunks.get(id)
    }

    /// Whether chunk `id` is stored.
    pub fn has_chunk(&self, id: &ChunkId) -> bool {
        self.m.chunks.contains_key(id)
    }

    /// Embeds `query` with the bank's encoder.
    pub fn embed(&self, query: &str) -> Result<Vec<f32>> {
        Ok(self.encoder.encode(&[query.to_string()])?.vectors.remove(0))
    }

    /// The `k` best chunks for `query` (whose vector is `qv`): BM25 and cosine rankings fused
    /// by reciprocal rank (see [`crate::retrieve`]), best first.
    pub fn search(&self, query: &str, qv: &[f32], k: usize) -> Result<Vec<Retrieved>> {
        let depth = crate::retrieve::candidate_depth(k);
        let lexical: Vec<ChunkId> = self.bm25.search(query, depth)?.into_iter().map(|(id, _)| ChunkId(id)).collect();
        let mut dense: Vec<(&ChunkId, f32)> = self.m.chunks.iter().map(|(id, c)| (id, engram_embed::cosine(qv, &c.vector))).collect();
        dense.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        dense.truncate(depth);
        let dense: Vec<ChunkId> = dense.into_iter().map(|(id, _)| id.clone()).collect();
        Ok(fuse(&lexical, &dense, k)
            .into_iter()
            .filter_map(|mut r| {
                let c = self.m.chunks.get(&r.chunk)?;
                r.doc = c.doc.clone();
                Some(r)
            })
            .collect())
    }

    /// Sizes.
    pub fn stats(&self) -> BankStats {
        let dir_bytes =
            |d: &Path| std::fs::read_dir(d).map(|r| r.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0);
        BankStats {
            documents: self.m.docs.len(),
            chunks: self.m.chunks.len(),
            words: self.m.docs.values().map(|d| d.words).sum(),
            manifest_bytes: std::fs::metadata(self.dir.join(MANIFEST_FILE)).map(|m| m.len()).unwrap_or(0),
            index_bytes: dir_bytes(&self.dir.join("bm25")),
            generation: self.m.generation,
        }
    }
}
