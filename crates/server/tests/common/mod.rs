//! Helpers shared by the server's end-to-end tests: the tiny fixture model, servers on
//! 127.0.0.1:0 (shared, or stoppable and persisting), and a tiny HTTP/1.1 client on
//! `std::net::TcpStream` (no client crate in the tree).
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_server::{Server, ServerConfig};
use serde_json::{json, Value};

/// The tiny fixture's Q8_0 GGUF (generated once per test binary) and the model loaded from it.
pub fn fixture() -> &'static (tempfile::TempDir, std::path::PathBuf, Arc<Model>) {
    static M: OnceLock<(tempfile::TempDir, std::path::PathBuf, Arc<Model>)> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let files =
            engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
        let path = files.gguf(GgufFormat::Q8_0).unwrap().to_path_buf();
        let m = Model::load(&path).unwrap();
        (dir, path, Arc::new(m))
    })
}

pub fn model() -> Arc<Model> {
    fixture().2.clone()
}

/// Starts a server on its own runtime thread; returns its address.
pub fn start(budget_bytes: usize, config: ServerConfig) -> SocketAddr {
    start_model(model(), budget_bytes, config)
}

/// [`start`] serving `model`.
pub fn start_model(model: Arc<Model>, budget_bytes: usize, config: ServerConfig) -> SocketAddr {
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, budget_bytes);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let server = Server::start(model, pool, config);
            server.serve(listener, std::future::pending(), Duration::from_secs(1)).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

pub fn shared() -> SocketAddr {
    static A: OnceLock<SocketAddr> = OnceLock::new();
    *A.get_or_init(|| start(256 << 20, ServerConfig::new("tiny")))
}

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    /// `data:` payloads of an SSE body, with their `event:` names.
    pub fn sse(&self) -> Vec<(Option<String>, String)> {
        let mut out = Vec::new();
        for block in self.body.split("\n\n") {
            let mut ev = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    ev = Some(e.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_string());
                }
            }
            if let Some(d) = data {
                out.push((ev, d));
            }
        }
        out
    }
}

pub fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
    }
    out
}

pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    // Written on its own thread: the server may answer (a 413 from the headers) and close
    // before it has taken a large body, which is its right, not a failed request.
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(req.as_bytes());
    });
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    writer.join().unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines.filter_map(|l| l.split_once(": ").map(|(k, v)| (k.to_string(), v.to_string()))).collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Resp { status, headers, body: String::from_utf8(body).unwrap() }
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, &[], &body.to_string())
}

pub fn chat(addr: SocketAddr, messages: &Value, extra: Value) -> Resp {
    let mut body = json!({"model": "tiny", "messages": messages, "max_tokens": 16, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    post(addr, "/v1/chat/completions", &body)
}

pub fn content(r: &Resp) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

/// Starts a server that stops when `stop` is sent; joining the thread waits
/// for its shutdown (engine finished, sessions flushed to disk).
pub fn start_stoppable(config: ServerConfig) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>) {
    start_stoppable_with(model(), config)
}

/// [`start_stoppable`] with another model (e.g. the same file at another attention precision).
pub fn start_stoppable_with(
    model: Arc<Model>,
    config: ServerConfig,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>) {
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20);
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let t = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let server = Server::start(model, pool, config);
            server
                .serve(
                    listener,
                    async {
                        let _ = stop_rx.await;
                    },
                    Duration::from_secs(5),
                )
                .await
                .unwrap();
        });
    });
    (rx.recv().unwrap(), stop_tx, t)
}

/// A server config that persists sessions (and agents) under `<dir>/kv`, 256 MiB.
pub fn persisting(dir: &std::path::Path, policy: engram_kv::EvictionPolicy) -> ServerConfig {
    let mut c = ServerConfig::new("tiny");
    c.sessions.disk = Some(engram_server::DiskConfig { dir: dir.join("kv"), budget_bytes: 256 << 20, policy, tenant_share_bytes: None });
    c
}

/// The session entry files a [`persisting`] server keeps under `<dir>/kv`.
pub fn session_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir.join("kv"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("session-"))
        .collect()
}

pub fn metric(addr: SocketAddr, line_prefix: &str) -> f64 {
    let m = request(addr, "GET", "/metrics", &[], "").body;
    m.lines().find(|l| l.starts_with(line_prefix)).and_then(|l| l.rsplit(' ').next()).map_or(0.0, |v| v.parse().unwrap())
}

/// A `POST /v1/rag/query` that must succeed: its JSON body.
pub fn rag_query(addr: SocketAddr, body: Value) -> Value {
    let r = post(addr, "/v1/rag/query", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// Three small personal documents (an e-mail-like note, Markdown notes, a calendar-like note)
/// for the RAG tests; `txt` is also the type a document without one gets.
pub fn rag_docs() -> Value {
    json!([
        {"id": "mail-1", "type": "txt", "text": "Alice wrote that the budget review moves to Thursday at ten. Bring the spreadsheet with the travel costs."},
        {"id": "notes-2", "type": "md", "text": "# Standup\n\nBob finished the parser. Carol will test the importer on Monday. The release is planned for June."},
        {"id": "cal-3", "text": "Dentist appointment on Friday afternoon. Call the garage about the car before noon."}
    ])
}

/// Every file under `dir` with its bytes (to check that a refused request changed nothing).
/// A file or folder removed while the walk runs (a server saving or deleting in the background,
/// which tests polling for that work race with) is left out, as if the walk had come after.
pub fn snapshot(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Err(e) if gone(&e) && d != dir => continue,
            r => r.unwrap(),
        };
        for e in entries {
            let p = match e {
                Err(e) if gone(&e) => continue,
                r => r.unwrap().path(),
            };
            if p.is_dir() {
                stack.push(p);
            } else {
                match std::fs::read(&p) {
                    Err(e) if gone(&e) => {}
                    r => {
                        out.insert(p.display().to_string(), r.unwrap());
                    }
                }
            }
        }
    }
    out
}
