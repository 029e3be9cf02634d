//! Reads of offloaded rows: runs of consecutive rows, each one positioned read (`pread`),
//! either on a dedicated reader thread (requests over a channel) or inline on the calling
//! attention thread — the two backends `bench sparse` compares.
//!
//! Invariant: a request's reply is the bytes of its runs, concatenated in request order,
//! exactly as appended; an I/O error is returned to the requester, never swallowed.

use std::io;
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;

use super::file::RowReader;

/// Which thread issues the reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A dedicated reader thread; attention threads wait for its reply.
    Thread,
    /// The attention thread that needs the rows reads them itself.
    Inline,
}

impl Backend {
    /// Parses `thread` or `inline`.
    pub fn parse(s: &str) -> Result<Backend, String> {
        match s {
            "thread" => Ok(Backend::Thread),
            "inline" => Ok(Backend::Inline),
            _ => Err(format!("unknown offload reader {s:?} (thread, inline)")),
        }
    }

    /// The name [`Backend::parse`] reads.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Thread => "thread",
            Backend::Inline => "inline",
        }
    }
}

type Request = (Vec<(u64, u32)>, Sender<io::Result<Vec<u8>>>);

/// Reads runs of rows through one [`Backend`].
pub struct Reader {
    row_bytes: usize,
    inline: Option<RowReader>,
    tx: Option<Mutex<Sender<Request>>>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    /// A reader over `rows` using `backend` (a thread is started for [`Backend::Thread`]).
    pub fn new(rows: RowReader, row_bytes: usize, backend: Backend) -> io::Result<Reader> {
        if backend == Backend::Inline {
            return Ok(Reader { row_bytes, inline: Some(rows), tx: None, thread: None });
        }
        let (tx, rx) = channel::<Request>();
        let thread = std::thread::Builder::new().name("dynakv-reader".into()).spawn(move || {
            for (runs, reply) in rx {
                let _ = reply.send(read_runs(&rows, row_bytes, &runs));
            }
        })?;
        Ok(Reader { row_bytes, inline: None, tx: Some(Mutex::new(tx)), thread: Some(thread) })
    }

    /// The rows of `runs` (`(first row, rows)`), concatenated.
    pub fn read(&self, runs: Vec<(u64, u32)>) -> io::Result<Vec<u8>> {
        if let Some(r) = &self.inline {
            return read_runs(r, self.row_bytes, &runs);
        }
        let (tx, rx) = channel();
        self.tx.as_ref().expect("a reader thread").lock().expect("reader lock").send((runs, tx)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}

fn gone() -> io::Error {
    io::Error::other("the DynaKV reader thread has stopped")
}

fn read_runs(r: &RowReader, rb: usize, runs: &[(u64, u32)]) -> io::Result<Vec<u8>> {
    let total: usize = runs.iter().map(|&(_, n)| n as usize * rb).sum();
    let mut out = vec![0u8; total];
    let mut at = 0;
    for &(first, n) in runs {
        let len = n as usize * rb;
        r.read_rows(first, &mut out[at..at + len])?;
        at += len;
    }
    Ok(out)
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.tx = None; // closes the channel: the thread's loop ends
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
