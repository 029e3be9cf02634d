//! Knowledge abstracts (PerCache §4's "knowledge abstract"): per document its subject, names,
//! dates and frequent content words, extracted deterministically from the chunks the knowledge
//! bank holds, and the store's topics (distinct subjects, a longer subject folded into a
//! shorter one it contains). Query prediction (`predict.rs`) fills its templates from them.
//!
//! ```text
//!  <path>   envelope "engram-rag-abstracts" v1: { doc id → DocAbstract (with the doc's blake3) }
//!  sync(bank):  docs whose hash changed or that are new → extracted again; gone docs → dropped
//! ```
//! NOTE: PerCache summarises chunks with the LLM. The model here (pycode-7m) writes Python, so
//! an LLM summary of an e-mail is noise; the extractor below is the whole abstract. A summary
//! path through the engine would slot in beside [`extract`] (same [`DocAbstract`] fields).
//!
//! Invariant: an abstract is a pure function of its document's text (same text, same
//! abstract), and after [`AbstractStore::sync`] the store holds exactly one abstract per
//! document of the bank, made from its current text; the file is written whole (temp + fsync
//! + rename) and a damaged, truncated or foreign file is an error that leaves it in place
//! (`tests/it/idle.rs`). A crash between a bank commit and this file's save leaves abstracts of
//! older texts, which the next `sync` finds by hash and extracts again.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bank::KnowledgeBank;
use crate::envelope;
use crate::error::{RagError, Result};
use crate::parse::DocKind;

const MAGIC: &str = "engram-rag-abstracts";
const VERSION: u32 = 1;
/// At most this many names, dates and terms per document.
const KEEP: usize = 6;

/// One document's abstract.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocAbstract {
    pub kind: DocKind,
    /// blake3 of the document's text as stored by the bank (its `DocEntry::hash`).
    pub hash: String,
    /// The e-mail's subject, the event's summary or the note's first line, lowercased, without
    /// a bracketed tail; `None` when there is none of at most 8 words.
    pub subject: Option<String>,
    /// Capitalised words that are not sentence openers or header words, most frequent first.
    pub names: Vec<String>,
    /// Weekdays, months with their day, clock times and ISO dates, in order of appearance.
    pub dates: Vec<String>,
    /// Content words (≥ 4 letters, no stop words or names), most frequent first.
    pub terms: Vec<String>,
}

/// A topic: a distinct subject phrase and how many documents it covers.
#[derive(Clone, Debug, PartialEq)]
pub struct Topic {
    pub phrase: String,
    pub docs: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct AbstractFile {
    docs: BTreeMap<String, DocAbstract>,
}

/// The abstracts of a knowledge bank's documents, on disk. See the module doc.
pub struct AbstractStore {
    path: Option<PathBuf>,
    f: AbstractFile,
}

/// What a [`AbstractStore::sync`] changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncReport {
    /// Documents extracted (new or changed), in id order.
    pub extracted: Vec<String>,
    /// Documents dropped (no longer in the bank).
    pub dropped: Vec<String>,
}

impl AbstractStore {
    /// A store kept in RAM only.
    pub fn in_memory() -> AbstractStore {
        AbstractStore { path: None, f: AbstractFile::default() }
    }

    /// Opens (or starts) the store saved at `path`. A damaged, truncated or foreign file is an
    /// error and is left as it is.
    pub fn open(path: &Path) -> Result<AbstractStore> {
        let f = match envelope::read_checked(path, MAGIC, VERSION)? {
            Some(body) => serde_json::from_slice(&body).map_err(|e| RagError::bad_store(path, format!("abstracts: {e}")))?,
            None => AbstractFile::default(),
        };
        Ok(AbstractStore { path: Some(path.to_path_buf()), f })
    }

    /// Brings the store in step with `bank` (see the module doc) and saves it if anything
    /// changed.
    pub fn sync(&mut self, bank: &KnowledgeBank) -> Result<SyncReport> {
        let mut r = SyncReport::default();
        let mut docs = std::mem::take(&mut self.f.docs);
        for (id, d) in bank.docs() {
            if docs.get(id).is_some_and(|a| a.hash == d.hash) {
                continue;
            }
            let text: Vec<&str> = d.chunks.iter().filter_map(|c| bank.chunk(c)).map(|c| c.text.as_str()).collect();
            docs.insert(id.clone(), extract(d.kind, &d.hash, &text.join("\n")));
            r.extracted.push(id.clone());
        }
        docs.retain(|id, _| {
            let keep = bank.docs().contains_key(id);
            if !keep {
                r.dropped.push(id.clone());
            }
            keep
        });
        self.f.docs = docs;
        if !r.extracted.is_empty() || !r.dropped.is_empty() {
            self.save()?;
        }
        Ok(r)
    }

    /// Writes the store (atomically) if it has a file.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        let body = serde_json::to_vec(&self.f).map_err(|e| RagError::bad_store(path, e.to_string()))?;
        envelope::write_atomic(path, MAGIC, VERSION, &body)
    }

    /// The abstracts by document id.
    pub fn docs(&self) -> &BTreeMap<String, DocAbstract> {
        &self.f.docs
    }

    /// The topics: each document's subject, folded into the shortest other subject it
    /// contains ("budget review preparation" → "budget review"); most documents first, then
    /// alphabetical.
    pub fn topics(&self) -> Vec<Topic> {
        topics_of(self.f.docs.values().filter_map(|a| a.subject.as_deref()))
    }

    /// The topics of the documents `ids` only (same folding, against every subject).
    pub fn topics_of_docs(&self, ids: &[String]) -> Vec<String> {
        let all = self.topics();
        let mut out = Vec::new();
        for id in ids {
            let Some(s) = self.f.docs.get(id).and_then(|a| a.subject.as_deref()) else { continue };
            if let Some(t) = fold(s, &all) {
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
        out
    }

    /// Every name, most documents first (then alphabetical).
    pub fn names(&self) -> Vec<String> {
        ranked(self.f.docs.values().flat_map(|a| a.names.iter().map(String::as_str)))
    }

    /// Every date, most documents first (then alphabetical).
    pub fn dates(&self) -> Vec<String> {
        ranked(self.f.docs.values().flat_map(|a| a.dates.iter().map(String::as_str)))
    }
}

fn ranked<'a>(items: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for i in items {
        *n.entry(i).or_default() += 1;
    }
    let mut v: Vec<(&str, usize)> = n.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    v.into_iter().map(|(s, _)| s.to_string()).collect()
}

fn topics_of<'a>(subjects: impl Iterator<Item = &'a str>) -> Vec<Topic> {
    let subjects: Vec<&str> = subjects.collect();
    let mut n: BTreeMap<String, usize> = BTreeMap::new();
    for s in &subjects {
        let base = subjects.iter().filter(|o| o.len() < s.len() && contains_words(s, o)).min_by_key(|o| (o.len(), **o)).unwrap_or(s);
        *n.entry(base.to_string()).or_default() += 1;
    }
    let mut v: Vec<Topic> = n.into_iter().map(|(phrase, docs)| Topic { phrase, docs }).collect();
    v.sort_by(|a, b| b.docs.cmp(&a.docs).then(a.phrase.cmp(&b.phrase)));
    v
}

fn fold(subject: &str, topics: &[Topic]) -> Option<String> {
    topics.iter().filter(|t| contains_words(subject, &t.phrase)).min_by_key(|t| t.phrase.len()).map(|t| t.phrase.clone())
}

/// Whether `phrase` occurs in `text` as whole words.
pub(crate) fn contains_words(text: &str, phrase: &str) -> bool {
    find_words(text, phrase).is_some()
}

/// Byte offset of `phrase` in `text` as whole words (ASCII case-insensitive).
pub(crate) fn find_words(text: &str, phrase: &str) -> Option<usize> {
    if phrase.is_empty() {
        return None;
    }
    let (t, p) = (text.to_ascii_lowercase(), phrase.to_ascii_lowercase());
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric());
    let mut from = 0;
    while let Some(i) = t[from..].find(&p) {
        let at = from + i;
        if !word(t[..at].chars().next_back()) && !word(t[at + p.len()..].chars().next()) {
            return Some(at);
        }
        from = at + p.len().max(1);
        while !t.is_char_boundary(from) {
            from += 1;
        }
    }
    None
}

const WEEKDAYS: &[&str] = &["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const MONTHS: &[&str] =
    &["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
/// Capitalised words that are headers, openers or function words, never names.
const NOT_NAMES: &[&str] = &[
    "From",
    "To",
    "Cc",
    "Date",
    "Subject",
    "Event",
    "When",
    "Where",
    "With",
    "Hi",
    "Hello",
    "Dear",
    "The",
    "A",
    "An",
    "Please",
    "Let",
    "We",
    "I",
    "You",
    "It",
    "This",
    "That",
    "Thanks",
    "Update",
    "Action",
    "Attendees",
    "Meeting",
    "Notes",
    "Re",
    "Fwd",
    "Coffee",
    "Remote",
    "Next",
    "Bring",
    "See",
    "Note",
];
const GREETINGS: &[&str] = &["Hi", "Hello", "Hey", "Dear"];
const STOP: &[&str] = &[
    "about", "after", "again", "also", "been", "before", "being", "bring", "could", "does", "each", "every", "from", "have", "here",
    "into", "just", "know", "like", "more", "most", "only", "other", "over", "please", "same", "should", "some", "still", "such", "than",
    "that", "their", "them", "then", "there", "these", "they", "this", "those", "through", "very", "want", "were", "what", "when", "where",
    "which", "while", "will", "with", "would", "your", "yours", "event", "subject", "example", "com", "mailto",
];

/// The abstract of one document's text (see [`DocAbstract`]). Pure: same inputs, same output.
pub fn extract(kind: DocKind, hash: &str, text: &str) -> DocAbstract {
    DocAbstract { kind, hash: hash.to_string(), subject: subject(kind, text), names: names(text), dates: dates(text), terms: terms(text) }
}

/// The words after the e-mail's `Subject:` (the event's `Event:`; a note's leading label or its
/// start) up to the next label (`Word:`), a greeting or a sentence end, at most 8. Works on the
/// bank's chunk text, whose lines are joined by spaces.
fn subject(kind: DocKind, text: &str) -> Option<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let label = if kind == DocKind::Calendar { "Event:" } else { "Subject:" };
    let start = match words.iter().position(|w| *w == label) {
        Some(i) => i + 1,
        None if matches!(kind, DocKind::Markdown | DocKind::Text) => {
            words.iter().take(4).position(|w| w.ends_with(':')).map_or(0, |i| i + 1)
        }
        None => return None,
    };
    let mut taken = Vec::new();
    for w in words.iter().skip(start) {
        if taken.is_empty() && matches!(w.to_ascii_lowercase().as_str(), "re:" | "fwd:" | "fw:") {
            continue;
        }
        if w.ends_with(':') || GREETINGS.contains(&w.trim_end_matches(',')) {
            break;
        }
        taken.push(*w);
        if w.ends_with(['.', '!', '?']) || taken.len() == 8 {
            break;
        }
    }
    let line = taken.join(" ");
    let mut s = line.trim().to_lowercase();
    for prefix in ["re:", "fwd:", "fw:"] {
        s = s.strip_prefix(prefix).map_or(s.clone(), |r| r.trim().to_string());
    }
    if let Some(i) = s.find(['(', '[']) {
        s.truncate(i);
    }
    let s = s.trim_matches(|c: char| !c.is_alphanumeric()).to_string();
    let words = s.split_whitespace().count();
    (1..=8).contains(&words).then_some(s)
}

/// Words of `text` with whether each opens a sentence or a line.
fn words(text: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut opener = true;
        for raw in line.split_whitespace() {
            let w: String = raw.trim_matches(|c: char| !c.is_alphanumeric()).to_string();
            if !w.is_empty() {
                out.push((w, opener));
            }
            opener = raw.ends_with(['.', '!', '?']);
        }
    }
    out
}

fn names(text: &str) -> Vec<String> {
    let ws = words(text);
    let mut mid: HashMap<&str, usize> = HashMap::new();
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (i, (w, opener)) in ws.iter().enumerate() {
        let w = w.as_str();
        let cap = w.chars().next().is_some_and(char::is_uppercase) && w.chars().skip(1).all(|c| c.is_lowercase()) && w.len() >= 2;
        if !cap || NOT_NAMES.contains(&w) || WEEKDAYS.contains(&w) || MONTHS.contains(&w) {
            continue;
        }
        first.entry(w).or_insert(i);
        if !opener {
            *mid.entry(w).or_default() += 1;
        }
    }
    let mut v: Vec<(&str, usize)> = mid.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(first[a.0].cmp(&first[b.0])));
    v.into_iter().take(KEEP).map(|(w, _)| w.to_string()).collect()
}

fn dates(text: &str) -> Vec<String> {
    let ws = words(text);
    let mut out: Vec<String> = Vec::new();
    let mut push = |s: String| {
        if !out.contains(&s) {
            out.push(s);
        }
    };
    for (i, (w, _)) in ws.iter().enumerate() {
        if WEEKDAYS.contains(&w.as_str()) {
            push(w.clone());
        } else if MONTHS.contains(&w.as_str()) {
            match ws.get(i + 1).filter(|(n, _)| n.len() <= 2 && n.chars().all(|c| c.is_ascii_digit())) {
                Some((n, _)) => push(format!("{w} {n}")),
                None => push(w.clone()),
            }
        } else if is_time(w) {
            push(w.clone());
        } else if is_iso_date(w) {
            push(w[..10].to_string());
        } else if let Some(d) = compact_date(w) {
            push(d);
        }
    }
    out.truncate(KEEP);
    out
}

fn is_time(w: &str) -> bool {
    let Some((h, m)) = w.split_once(':') else { return false };
    (1..=2).contains(&h.len()) && m.len() == 2 && h.chars().chain(m.chars()).all(|c| c.is_ascii_digit())
}

fn is_iso_date(w: &str) -> bool {
    let b = w.as_bytes();
    b.len() >= 10 && b[4] == b'-' && b[7] == b'-' && b[..4].iter().chain(&b[5..7]).chain(&b[8..10]).all(u8::is_ascii_digit)
}

/// An iCalendar date (`20260303` or `20260303T100000Z`) as `2026-03-03`.
fn compact_date(w: &str) -> Option<String> {
    let b = w.as_bytes();
    let ok = b.len() >= 8 && b[..8].iter().all(u8::is_ascii_digit) && (b.len() == 8 || b[8] == b'T');
    ok.then(|| format!("{}-{}-{}", &w[..4], &w[4..6], &w[6..8]))
}

fn terms(text: &str) -> Vec<String> {
    let names = names(text);
    let mut n: BTreeMap<String, usize> = BTreeMap::new();
    for (w, _) in words(text) {
        let l = w.to_lowercase();
        if l.chars().count() < 4 || !l.chars().all(char::is_alphabetic) || STOP.contains(&l.as_str()) || names.contains(&w) {
            continue;
        }
        if WEEKDAYS.iter().chain(MONTHS).any(|d| d.eq_ignore_ascii_case(&l)) {
            continue;
        }
        *n.entry(l).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = n.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().take(KEEP).map(|(w, _)| w).collect()
}
