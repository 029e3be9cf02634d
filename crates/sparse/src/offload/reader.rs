//! Reads of offloaded rows: runs of consecutive rows, through one of three backends that
//! `bench sparse` compares side by side:
//!
//! - [`Backend::Thread`]: a dedicated reader thread (requests over a channel), one `pread` per
//!   run;
//! - [`Backend::Inline`]: the attention thread that needs the rows `pread`s them itself;
//! - [`Backend::Uring`]: the attention thread submits every run of the request to an
//!   `io_uring` at once (up to [`URING_DEPTH`] in flight) and waits for all of them, so the
//!   device sees the whole request as one queue instead of one read after another. Where the
//!   kernel refuses `io_uring_setup` (disabled, seccomp), [`Reader::new`] falls back to the
//!   reader thread and says so on stderr ([`Reader::backend`] names what runs).
//!
//! Invariant: a request's reply is the bytes of its runs, concatenated in request order,
//! exactly as appended; an I/O error is returned to the requester, never swallowed; no buffer
//! an `io_uring` read targets is freed before its completion is reaped.

use std::io;
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;

use io_uring::{opcode, types, IoUring};

use super::file::RowReader;

/// Reads in flight at once on one `io_uring`.
pub const URING_DEPTH: u32 = 64;

/// Which thread issues the reads, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A dedicated reader thread; attention threads wait for its reply.
    Thread,
    /// The attention thread that needs the rows reads them itself.
    Inline,
    /// The attention thread submits all of a request's runs to an `io_uring` and waits.
    Uring,
}

impl Backend {
    /// Parses `thread`, `inline` or `uring`.
    pub fn parse(s: &str) -> Result<Backend, String> {
        match s {
            "thread" => Ok(Backend::Thread),
            "inline" => Ok(Backend::Inline),
            "uring" => Ok(Backend::Uring),
            _ => Err(format!("unknown offload reader {s:?} (thread, inline, uring)")),
        }
    }

    /// The name [`Backend::parse`] reads.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Thread => "thread",
            Backend::Inline => "inline",
            Backend::Uring => "uring",
        }
    }
}

type Request = (Vec<(u64, u32)>, Sender<io::Result<Vec<u8>>>);

/// Reads runs of rows through one [`Backend`].
pub struct Reader {
    row_bytes: usize,
    backend: Backend,
    inline: Option<RowReader>,
    uring: Option<Mutex<(IoUring, RowReader)>>,
    tx: Option<Mutex<Sender<Request>>>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    /// A reader over `rows` using `backend` (a thread is started for [`Backend::Thread`]; for
    /// [`Backend::Uring`] a ring is set up, or, where the kernel refuses one, the reader
    /// thread runs instead, with a warning on stderr).
    pub fn new(rows: RowReader, row_bytes: usize, backend: Backend) -> io::Result<Reader> {
        match backend {
            Backend::Inline => return Ok(Reader { row_bytes, backend, inline: Some(rows), uring: None, tx: None, thread: None }),
            Backend::Uring => match IoUring::new(URING_DEPTH) {
                Ok(ring) => {
                    return Ok(Reader { row_bytes, backend, inline: None, uring: Some(Mutex::new((ring, rows))), tx: None, thread: None })
                }
                Err(e) => eprintln!("warning: io_uring is not available here ({e}); the DynaKV offload reads on a reader thread instead"),
            },
            Backend::Thread => {}
        }
        let (tx, rx) = channel::<Request>();
        let thread = std::thread::Builder::new().name("dynakv-reader".into()).spawn(move || {
            for (runs, reply) in rx {
                let _ = reply.send(read_runs(&rows, row_bytes, &runs));
            }
        })?;
        Ok(Reader { row_bytes, backend: Backend::Thread, inline: None, uring: None, tx: Some(Mutex::new(tx)), thread: Some(thread) })
    }

    /// The backend that runs (the one asked for, or the reader thread after a fallback).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The rows of `runs` (`(first row, rows)`), concatenated.
    pub fn read(&self, runs: Vec<(u64, u32)>) -> io::Result<Vec<u8>> {
        if let Some(r) = &self.inline {
            return read_runs(r, self.row_bytes, &runs);
        }
        if let Some(u) = &self.uring {
            let mut u = u.lock().expect("uring lock");
            let (ring, rows) = &mut *u;
            return read_uring(ring, rows, self.row_bytes, &runs);
        }
        let (tx, rx) = channel();
        self.tx.as_ref().expect("a reader thread").lock().expect("reader lock").send((runs, tx)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}

/// All of `runs` through `ring`, [`URING_DEPTH`] in flight at most. Every submitted read is
/// reaped before this returns (the kernel writes into `out`), error or not; a short read (the
/// file ends inside the run) is redone with `pread`, which names the truncation.
fn read_uring(ring: &mut IoUring, r: &RowReader, rb: usize, runs: &[(u64, u32)]) -> io::Result<Vec<u8>> {
    let total: usize = runs.iter().map(|&(_, n)| n as usize * rb).sum();
    let mut out = vec![0u8; total];
    let mut at = Vec::with_capacity(runs.len());
    let mut acc = 0;
    for &(_, n) in runs {
        at.push(acc);
        acc += n as usize * rb;
    }
    let base = out.as_mut_ptr();
    let (mut next, mut pending) = (0usize, 0usize);
    let mut first_err: Option<io::Error> = None;
    let mut short = Vec::new();
    while (next < runs.len() && first_err.is_none()) || pending > 0 {
        while next < runs.len() && first_err.is_none() && pending < URING_DEPTH as usize {
            let (first, n) = runs[next];
            let len = n as usize * rb;
            // SAFETY: `base + at[next] .. + len` lies in `out`, which is neither moved nor
            // dropped until every submitted read is reaped below.
            let e = opcode::Read::new(types::Fd(r.raw_fd()), unsafe { base.add(at[next]) }, len as u32)
                .offset(r.offset(first))
                .build()
                .user_data(next as u64);
            // SAFETY: the entry's buffer stays valid until its completion (above).
            if unsafe { ring.submission().push(&e) }.is_err() {
                break; // the queue is full: submit what is queued first
            }
            next += 1;
            pending += 1;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // Nothing more is reaped if the ring itself fails; the reads already queued may
            // still land in `out`, so it is leaked rather than freed under them.
            std::mem::forget(out);
            return Err(e);
        }
        for c in ring.completion() {
            pending -= 1;
            let i = c.user_data() as usize;
            let want = runs[i].1 as usize * rb;
            match c.result() {
                res if res < 0 => {
                    first_err.get_or_insert(io::Error::from_raw_os_error(-res));
                }
                res if (res as usize) < want => short.push(i),
                _ => {}
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    for i in short {
        let (first, n) = runs[i];
        r.read_rows(first, &mut out[at[i]..at[i] + n as usize * rb])?;
    }
    Ok(out)
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
