//! Bounded connections: a key is checked before the body is read,
//! slow headers and slow bodies are cut off, and open connections are capped (the next
//! one waits until one closes). Every answer keeps the API's error shape.

use crate::common;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use engram_server::{HttpLimits, ServerConfig};

fn limited(limits: HttpLimits, keys: bool) -> SocketAddr {
    let mut config = ServerConfig::new("tiny");
    config.limits = limits;
    if keys {
        config.api_keys = vec![("k1".into(), "alice".into())];
    }
    start(64 << 20, config)
}

/// Reads what the server sends until it closes the connection (or `within` passes).
fn read_until_closed(s: &mut TcpStream, within: Duration) -> (String, bool) {
    s.set_read_timeout(Some(within)).unwrap();
    let mut raw = Vec::new();
    let closed = s.read_to_end(&mut raw).is_ok();
    (String::from_utf8_lossy(&raw).into_owned(), closed)
}

fn status_of(raw: &str) -> u16 {
    raw.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status line in {raw:?}"))
}

#[test]
fn a_wrong_key_is_refused_before_the_body_is_read() {
    let addr = limited(HttpLimits::default(), true);
    let mut s = TcpStream::connect(addr).unwrap();
    // Announces 2 MB but sends none of it: the answer cannot have waited for the body.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer wrong\r\n\
         Content-Type: application/json\r\nContent-Length: 2000000\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let t = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    let raw = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert_eq!(status_of(&raw), 401, "{raw}");
    assert!(raw.contains("invalid API key"), "{raw}");
    assert!(t.elapsed() < Duration::from_secs(10));
    // Anthropic's route answers in Anthropic's shape.
    let r = request(addr, "POST", "/v1/messages", &[("x-api-key", "nope")], "{}");
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["type"], "error", "{}", r.body);
    // /health stays open to supervisors; a valid key passes.
    assert_eq!(request(addr, "GET", "/health", &[], "").status, 200);
    assert_eq!(request(addr, "GET", "/v1/models", &[("authorization", "Bearer k1")], "").status, 200);
}

#[test]
fn slow_headers_and_idle_connections_are_closed() {
    let limits = HttpLimits { header_timeout: Duration::from_millis(700), ..HttpLimits::default() };
    let addr = limited(limits, false);
    // Half a request line, then silence.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /health HT").unwrap();
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(20));
    assert!(closed, "a connection that never finishes its headers is closed");
    // A kept-alive connection answered once, then idle, is closed too.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).unwrap();
    let (raw, closed) = read_until_closed(&mut s, Duration::from_secs(20));
    assert!(closed, "an idle kept-alive connection is closed");
    assert_eq!(status_of(&raw), 200, "{raw}");
}

#[test]
fn a_slow_body_is_a_408_in_the_apis_shape() {
    let limits = HttpLimits { body_timeout: Duration::from_millis(500), ..HttpLimits::default() };
    let addr = limited(limits, false);
    let mut s = TcpStream::connect(addr).unwrap();
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"hi"}]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&body.as_bytes()[..10]).unwrap(); // the rest never comes
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    let raw = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert_eq!(status_of(&raw), 408, "{raw}");
    assert!(raw.contains("request_timeout"), "{raw}");
    // A body over the limit is a JSON 413 before it is read.
    let r = request(addr, "POST", "/v1/chat/completions", &[], &"x".repeat((2 << 20) + 1));
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "request_too_large");
}

#[test]
fn open_connections_are_capped_and_the_next_waits_its_turn() {
    let limits = HttpLimits { max_connections: 1, ..HttpLimits::default() };
    let addr = limited(limits, false);
    let holder = TcpStream::connect(addr).unwrap();
    std::thread::sleep(Duration::from_millis(200)); // accepted: it holds the only permit
    let mut waiting = TcpStream::connect(addr).unwrap(); // completes in the kernel's backlog
    waiting.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    waiting.set_read_timeout(Some(Duration::from_millis(800))).unwrap();
    let mut buf = [0u8; 256];
    let early = waiting.read(&mut buf);
    assert!(early.is_err(), "no answer while the only connection is held: {early:?}");
    drop(holder);
    let (raw, _) = read_until_closed(&mut waiting, Duration::from_secs(20));
    assert_eq!(status_of(&raw), 200, "answered once the holder left: {raw}");
}
