//! The BM25 side of retrieval: a tantivy index of chunks (`chunk_id` stored, `text` scored
//! after splitting on non-alphanumerics, lowercasing and dropping English stop words; no
//! stemming). Without stop words a question's "the" and "is" rank any chunk that repeats
//! them first, and reciprocal-rank fusion gives that rank full weight.
//!
//! Invariant: the index's last commit carries the knowledge bank's generation as its payload;
//! an index whose payload is not the manifest's generation (a crash between the two writes,
//! a damaged folder) is rebuilt from the manifest at open, so BM25 never answers from chunks
//! the manifest does not hold. Commits are tantivy's own (a new `meta.json` by atomic rename).

use std::path::Path;

use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, STORED, STRING};
use tantivy::tokenizer::{LowerCaser, RemoveLongFilter, SimpleTokenizer, StopWordFilter, TextAnalyzer};
use tantivy::{doc, Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

use crate::error::{RagError, Result};

/// Heap for tantivy's indexing arena (its minimum per thread is 15 MB).
const WRITER_HEAP: usize = 15_000_000;

/// The chunk index. See the module doc.
pub struct Bm25 {
    index: Index,
    reader: IndexReader,
    id: Field,
    text: Field,
}

/// The text field's analyzer's name.
const ANALYZER: &str = "engram_en";

/// Lucene's English stop set (`EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`).
/// NOTE: tantivy's `stopwords` feature carries the same list (and 17 other languages) but
/// costs a rebuild of tantivy for 33 words.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not", "of", "on", "or", "such",
    "that", "the", "their", "then", "there", "these", "they", "this", "to", "was", "will", "with",
];

fn schema() -> (Schema, Field, Field) {
    let mut b = Schema::builder();
    let id = b.add_text_field("chunk_id", STRING | STORED);
    let indexing = TextFieldIndexing::default().set_tokenizer(ANALYZER).set_index_option(IndexRecordOption::WithFreqsAndPositions);
    let text = b.add_text_field("text", TextOptions::default().set_indexing_options(indexing));
    (b.build(), id, text)
}

fn analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .filter(StopWordFilter::remove(STOP_WORDS.iter().map(|w| w.to_string())))
        .build()
}

impl Bm25 {
    /// Opens the index in `dir` if its payload is `generation`, else rebuilds it there from
    /// `chunks` (id, text). Returns the index and whether it was rebuilt.
    pub fn open(dir: &Path, generation: u64, chunks: &mut dyn Iterator<Item = (&str, &str)>) -> Result<(Bm25, bool)> {
        if let Ok(b) = Bm25::open_existing(dir) {
            if b.generation() == Some(generation) {
                return Ok((b, false));
            }
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| RagError::io(dir, e))?;
        }
        std::fs::create_dir_all(dir).map_err(|e| RagError::io(dir, e))?;
        let mut b = Bm25::open_existing(dir)?;
        b.apply(&[], chunks, generation)?;
        Ok((b, true))
    }

    fn open_existing(dir: &Path) -> Result<Bm25> {
        std::fs::create_dir_all(dir).map_err(|e| RagError::io(dir, e))?;
        let (schema, id, text) = schema();
        let mmap = MmapDirectory::open(dir).map_err(|e| RagError::Index(e.to_string()))?;
        let index = Index::open_or_create(mmap, schema)?;
        index.tokenizers().register(ANALYZER, analyzer());
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        Ok(Bm25 { index, reader, id, text })
    }

    /// The generation of the last commit (`None` for a new or foreign index).
    pub fn generation(&self) -> Option<u64> {
        self.index.load_metas().ok()?.payload?.parse().ok()
    }

    /// Removes the chunks `remove`, adds `add` (id, text), commits as `generation`.
    pub fn apply(&mut self, remove: &[&str], add: &mut dyn Iterator<Item = (&str, &str)>, generation: u64) -> Result<()> {
        let mut w: IndexWriter = self.index.writer_with_num_threads(1, WRITER_HEAP)?;
        for id in remove {
            w.delete_term(Term::from_field_text(self.id, id));
        }
        for (id, text) in add {
            w.add_document(doc!(self.id => id, self.text => text))?;
        }
        let mut commit = w.prepare_commit()?;
        commit.set_payload(&generation.to_string());
        commit.commit()?;
        w.wait_merging_threads()?;
        self.reader.reload()?;
        Ok(())
    }

    /// The `n` best chunks for `query` by BM25, best first (ties by chunk id).
    pub fn search(&self, query: &str, n: usize) -> Result<Vec<(String, f32)>> {
        let searcher = self.reader.searcher();
        let parser = QueryParser::for_index(&self.index, vec![self.text]);
        // NOTE: lenient: a question's `?`, quotes or colons are text, not query syntax.
        let (q, _) = parser.parse_query_lenient(query);
        let mut out = Vec::new();
        for (score, addr) in searcher.search(&q, &TopDocs::with_limit(n.max(1)))? {
            let d: TantivyDocument = searcher.doc(addr)?;
            let id = d.get_first(self.id).and_then(|v| v.as_str()).ok_or_else(|| RagError::Index("a document without chunk_id".into()))?;
            out.push((id.to_string(), score));
        }
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(out)
    }
}
