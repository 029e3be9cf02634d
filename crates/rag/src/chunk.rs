//! Chunking: a document's text becomes chunks of at most `max_words` words (default
//! [`DEFAULT_CHUNK_WORDS`], PerCache's ~100), cut on sentence boundaries.
//!
//! ```text
//!  text       "Lunch moved to Friday. Bring the slides!\nAgenda: budget ..."
//!  sentences  ["Lunch moved to Friday.", "Bring the slides!", "Agenda: budget ..."]
//!  chunks     sentences packed greedily while the chunk stays <= max_words words
//! ```
//! A sentence ends at `.`, `!` or `?` followed by whitespace, or at a line end (headers, list
//! items, calendar paragraphs). A sentence longer than `max_words` is cut into runs of
//! `max_words` words (the only cut not on a sentence boundary).
//!
//! Invariant: the chunks' words, in order, are exactly the text's words (whitespace-separated);
//! every chunk holds between 1 and `max_words` words (`tests/it/chunk.rs`, property-tested).

/// PerCache's chunk length in words.
pub const DEFAULT_CHUNK_WORDS: usize = 100;

/// The text's sentences (trimmed, never empty), in order.
pub fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for line in text.lines() {
        let b = line.as_bytes();
        let mut start = 0;
        for i in 0..b.len() {
            let ends = matches!(b[i], b'.' | b'!' | b'?') && b.get(i + 1).is_some_and(|c| c.is_ascii_whitespace());
            if ends {
                push_trimmed(&mut out, &line[start..=i]);
                start = i + 1;
            }
        }
        push_trimmed(&mut out, &line[start..]);
    }
    out
}

fn push_trimmed<'a>(out: &mut Vec<&'a str>, s: &'a str) {
    let s = s.trim();
    if !s.is_empty() {
        out.push(s);
    }
}

/// The text cut into chunks of at most `max_words` (>= 1) words; see the module doc.
pub fn chunk_text(text: &str, max_words: usize) -> Vec<String> {
    let max_words = max_words.max(1);
    let mut chunks = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    let flush = |cur: &mut Vec<&str>, chunks: &mut Vec<String>| {
        if !cur.is_empty() {
            chunks.push(cur.join(" "));
            cur.clear();
        }
    };
    for s in sentences(text) {
        let words: Vec<&str> = s.split_whitespace().collect();
        if cur.len() + words.len() > max_words {
            flush(&mut cur, &mut chunks);
        }
        if words.len() > max_words {
            for run in words.chunks(max_words) {
                chunks.push(run.join(" "));
            }
            continue;
        }
        cur.extend(words);
    }
    flush(&mut cur, &mut chunks);
    chunks
}
