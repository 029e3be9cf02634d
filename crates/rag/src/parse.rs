//! Parsers: a file (or a named text) becomes one or more plain-text documents.
//!
//! ```text
//!  .txt .text      → one document, the text as is
//!  .md .markdown   → one document, pulldown-cmark's text events (markup dropped, blocks as lines)
//!  .eml            → one document: From / To / Date / Subject lines, then the text body (mail-parser)
//!  .mbox           → one document per message (`<name>#<n>`, n from 1), each as an .eml
//!  .ics            → one document, one paragraph per VEVENT: summary, when, where, who, description
//! ```
//! Invariant: a parse either returns documents that each hold some non-blank text, or an
//! error naming the input and why (binary bytes, over [`MAX_FILE_BYTES`], unknown extension,
//! nothing but markup or headers); it never returns a partial set for one input.

use std::path::Path;

use mail_parser::MessageParser;

use crate::error::{RagError, Result};

/// Inputs larger than this are refused (a personal document, not a disk image).
pub const MAX_FILE_BYTES: usize = 8 << 20;

/// What a document was parsed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DocKind {
    Text,
    Markdown,
    Email,
    Calendar,
}

impl DocKind {
    /// The kind a file name's extension names (`None` for any other).
    pub fn of_path(path: &Path) -> Option<DocKind> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "txt" | "text" => DocKind::Text,
            "md" | "markdown" => DocKind::Markdown,
            "eml" | "mbox" => DocKind::Email,
            "ics" => DocKind::Calendar,
            _ => return None,
        })
    }

    /// The lowercase name (`text`, `markdown`, `email`, `calendar`).
    pub fn name(self) -> &'static str {
        match self {
            DocKind::Text => "text",
            DocKind::Markdown => "markdown",
            DocKind::Email => "email",
            DocKind::Calendar => "calendar",
        }
    }
}

/// One parsed document: its id, kind and plain text (never blank).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedDoc {
    pub id: String,
    pub kind: DocKind,
    pub text: String,
}

/// Reads and parses `path`; documents are named after `id` (an `.mbox`'s messages `id#n`).
pub fn parse_file(path: &Path, id: &str) -> Result<Vec<ParsedDoc>> {
    let what = || path.display().to_string();
    let kind =
        DocKind::of_path(path).ok_or_else(|| RagError::bad_input(what(), "unknown file kind (expected .txt, .md, .eml, .mbox or .ics)"))?;
    let meta = std::fs::metadata(path).map_err(|e| RagError::io(path, e))?;
    if !meta.is_file() {
        return Err(RagError::bad_input(what(), "not a regular file"));
    }
    if meta.len() > MAX_FILE_BYTES as u64 {
        return Err(RagError::bad_input(what(), format!("{} bytes is over the {MAX_FILE_BYTES}-byte limit", meta.len())));
    }
    let bytes = std::fs::read(path).map_err(|e| RagError::io(path, e))?;
    let mbox = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("mbox"));
    parse_bytes(&what(), id, kind, mbox, &bytes)
}

/// Parses `bytes` of `kind` (`mbox`: a mailbox of messages) into documents named after `id`;
/// `what` names the input in errors.
pub fn parse_bytes(what: &str, id: &str, kind: DocKind, mbox: bool, bytes: &[u8]) -> Result<Vec<ParsedDoc>> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(RagError::bad_input(what, format!("{} bytes is over the {MAX_FILE_BYTES}-byte limit", bytes.len())));
    }
    // NOTE: a NUL byte never occurs in text, mail or calendars; it is the cheap, reliable sign
    // of a binary file (an image, a PDF's streams, an executable).
    if bytes.contains(&0) {
        return Err(RagError::bad_input(what, "binary content (NUL bytes)"));
    }
    let docs = match kind {
        DocKind::Email if mbox => parse_mbox(what, id, bytes)?,
        DocKind::Email => vec![ParsedDoc { id: id.into(), kind, text: email_text(what, bytes)? }],
        DocKind::Text => vec![ParsedDoc { id: id.into(), kind, text: utf8(what, bytes)?.to_string() }],
        DocKind::Markdown => vec![ParsedDoc { id: id.into(), kind, text: markdown_text(utf8(what, bytes)?) }],
        DocKind::Calendar => vec![ParsedDoc { id: id.into(), kind, text: calendar_text(what, utf8(what, bytes)?)? }],
    };
    if docs.is_empty() {
        return Err(RagError::bad_input(what, "no documents in it"));
    }
    for d in &docs {
        if d.text.trim().is_empty() {
            return Err(RagError::bad_input(what, format!("document {:?} has no text", d.id)));
        }
    }
    Ok(docs)
}

fn utf8<'a>(what: &str, bytes: &'a [u8]) -> Result<&'a str> {
    std::str::from_utf8(bytes).map_err(|e| RagError::bad_input(what, format!("not UTF-8 text ({e})")))
}

/// Markdown's text: text and code events, soft breaks as spaces, block ends as line ends.
fn markdown_text(src: &str) -> String {
    use pulldown_cmark::{Event, Parser, TagEnd};
    let mut out = String::new();
    for ev in Parser::new(src) {
        match ev {
            Event::Text(t) | Event::Code(t) => out.push_str(&t),
            Event::SoftBreak => out.push(' '),
            Event::HardBreak | Event::End(TagEnd::Paragraph | TagEnd::Heading(_) | TagEnd::Item | TagEnd::CodeBlock | TagEnd::TableRow) => {
                out.push('\n')
            }
            Event::End(TagEnd::TableCell) => out.push(' '),
            _ => {}
        }
    }
    out
}

/// A message as text: header lines a reader would ask about, then the text body.
fn email_text(what: &str, bytes: &[u8]) -> Result<String> {
    let msg = MessageParser::default().parse(bytes).ok_or_else(|| RagError::bad_input(what, "not an e-mail message"))?;
    let people = |a: Option<&mail_parser::Address>| {
        a.and_then(|a| a.as_list())
            .map(|l| {
                l.iter()
                    .map(|p| match (p.name(), p.address()) {
                        (Some(n), Some(a)) => format!("{n} <{a}>"),
                        (Some(n), None) => n.to_string(),
                        (None, Some(a)) => a.to_string(),
                        (None, None) => String::new(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let body = msg.body_text(0).map(|b| b.trim().to_string()).unwrap_or_default();
    if body.is_empty() && msg.subject().is_none_or(|s| s.trim().is_empty()) {
        return Err(RagError::bad_input(what, "an e-mail with neither subject nor text body"));
    }
    let mut out = String::new();
    for (name, value) in [
        ("From", people(msg.from())),
        ("To", people(msg.to())),
        ("Date", msg.date().map(|d| d.to_rfc3339()).unwrap_or_default()),
        ("Subject", msg.subject().unwrap_or_default().to_string()),
    ] {
        if !value.is_empty() {
            out.push_str(&format!("{name}: {value}\n"));
        }
    }
    out.push('\n');
    out.push_str(&body);
    Ok(out)
}

/// Each message of an mbox as its own document, `id#n` (n from 1, in file order).
fn parse_mbox(what: &str, id: &str, bytes: &[u8]) -> Result<Vec<ParsedDoc>> {
    let mut docs = Vec::new();
    for (i, m) in mail_parser::mailbox::mbox::MessageIterator::new(bytes).enumerate() {
        let m = m.map_err(|e| RagError::bad_input(what, format!("reading message {}: {e}", i + 1)))?;
        let text = email_text(&format!("{what} message {}", i + 1), m.contents())?;
        docs.push(ParsedDoc { id: format!("{id}#{}", i + 1), kind: DocKind::Email, text });
    }
    if docs.is_empty() {
        return Err(RagError::bad_input(what, "no messages (an mbox starts each with a \"From \" line)"));
    }
    Ok(docs)
}

/// RFC 5545 text unescaped: `\n`, `\,`, `\;`, `\\`.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n' | 'N') => out.push('\n'),
            Some(o) => out.push(o),
            None => {}
        }
    }
    out
}

/// One paragraph per event: "Event: summary. When: start to end. Where: location. With: … ."
fn calendar_text(what: &str, src: &str) -> Result<String> {
    use icalendar::{CalendarComponent, Component};
    let cal: icalendar::Calendar = src.parse().map_err(|e: String| RagError::bad_input(what, format!("not an iCalendar file: {e}")))?;
    let mut out = String::new();
    for c in &cal.components {
        let CalendarComponent::Event(ev) = c else { continue };
        let v = |k: &str| ev.property_value(k).map(unescape).filter(|s| !s.trim().is_empty());
        let mut para = Vec::new();
        if let Some(s) = v("SUMMARY") {
            para.push(format!("Event: {s}."));
        }
        match (v("DTSTART"), v("DTEND")) {
            (Some(a), Some(b)) => para.push(format!("When: {a} to {b}.")),
            (Some(a), None) => para.push(format!("When: {a}.")),
            _ => {}
        }
        if let Some(l) = v("LOCATION") {
            para.push(format!("Where: {l}."));
        }
        let who: Vec<String> = ev
            .multi_properties()
            .get("ATTENDEE")
            .into_iter()
            .flatten()
            .filter_map(|p| {
                p.params().get("CN").map(|cn| cn.value().to_string()).or_else(|| Some(p.value().trim_start_matches("mailto:").to_string()))
            })
            .collect();
        if !who.is_empty() {
            para.push(format!("With: {}.", who.join(", ")));
        }
        if let Some(d) = v("DESCRIPTION") {
            para.push(d);
        }
        if !para.is_empty() {
            out.push_str(&para.join(" "));
            out.push('\n');
        }
    }
    if out.trim().is_empty() {
        return Err(RagError::bad_input(what, "a calendar without events that say anything"));
    }
    Ok(out)
}
