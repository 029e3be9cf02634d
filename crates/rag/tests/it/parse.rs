//! Every supported format parses into plain text; binary, oversized, empty, unknown and
//! malformed inputs are clear errors.

use crate::common;
use common::{write, EMAIL, ICS};
use engram_rag::parse::{parse_bytes, parse_file, MAX_FILE_BYTES};
use engram_rag::{DocKind, RagError};

fn one(name: &str, text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), name, text);
    let docs = parse_file(&p, "doc").unwrap();
    assert_eq!(docs.len(), 1);
    docs[0].text.clone()
}

#[test]
fn text_and_markdown() {
    assert_eq!(one("a.txt", "Plain words.\n"), "Plain words.\n");
    let md = one("a.md", "# Trip plan\n\nWe fly to **Lisbon** on `Friday`.\n\n- pack [tickets](http://x)\n- book hotel\n");
    assert_eq!(md, "Trip plan\nWe fly to Lisbon on Friday.\npack tickets\nbook hotel\n");
}

#[test]
fn an_email_has_its_headers_and_decoded_body() {
    let t = one("m.eml", EMAIL);
    assert!(t.contains("From: Alice Moreau <alice@example.com>"), "{t}");
    assert!(t.contains("To: Bob Chen <bob@example.com>"), "{t}");
    assert!(t.contains("Subject: Budget review moved"), "{t}");
    assert!(t.contains("Date: 2026-03-03T09:15:00"), "{t}");
    assert!(t.contains("Please bring the Q1 forecast."), "quoted-printable soft break decoded: {t}");
}

#[test]
fn an_mbox_is_one_document_per_message() {
    let dir = tempfile::tempdir().unwrap();
    let second = EMAIL.replace("Budget review moved", "Lunch on Friday").replace("<1@", "<2@");
    let p = write(
        dir.path(),
        "box.mbox",
        &format!("From alice@example.com Tue Mar  3 09:15:00 2026\n{EMAIL}\nFrom alice@example.com Wed Mar  4 09:15:00 2026\n{second}\n"),
    );
    let docs = parse_file(&p, "box").unwrap();
    assert_eq!(docs.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["box#1", "box#2"]);
    assert!(docs[0].text.contains("Budget review moved") && docs[1].text.contains("Lunch on Friday"));
    assert!(docs.iter().all(|d| d.kind == DocKind::Email));
}

#[test]
fn a_calendar_is_one_paragraph_per_event() {
    let t = one("c.ics", ICS);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 2, "{t}");
    assert_eq!(
        lines[0],
        "Event: Budget review. When: 20260305T150000Z to 20260305T160000Z. Where: Room Fjord. With: Bob Chen. Bring the Q1 forecast, and the hiring plan."
    );
    assert_eq!(lines[1], "Event: Lunch with Carol. When: 20260306T120000Z. Where: Green Cafe.");
}

fn refused(name: &str, bytes: &[u8], why: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    match parse_file(&p, "x") {
        Err(RagError::BadInput { why: w, .. }) => assert!(w.contains(why), "{name}: {w:?} should say {why:?}"),
        other => panic!("{name}: expected a refusal saying {why:?}, got {other:?}"),
    }
}

#[test]
fn bad_inputs_are_clear_errors() {
    refused("a.txt", b"PK\x03\x04\x00\x00binary", "binary");
    refused("a.md", &[0xff, 0xfe, b'a'], "not UTF-8");
    refused("a.txt", b"   \n\t\n", "no text");
    refused("a.md", b"<!-- only a comment -->\n", "no text");
    refused("a.pdf", b"%PDF-1.7", "unknown file kind");
    refused("a.ics", b"BEGIN:VCALENDAR\r\nVERSION:2.0\r\nEND:VCALENDAR\r\n", "without events");
    refused("a.ics", b"this is not a calendar", "iCalendar");
    refused("a.mbox", b"", "no messages");
    refused("a.eml", b"", "not an e-mail message");
    refused("a.eml", b"From: a@example.com\r\nSubject:  \r\n\r\n  \r\n", "neither subject nor text body");
    let big = vec![b'a'; MAX_FILE_BYTES + 1];
    refused("big.txt", &big, "limit");
    assert!(matches!(parse_bytes("t", "t", DocKind::Text, false, &big), Err(RagError::BadInput { .. })));
}
