//! A lean reader of run values over a plain TCP connection: `MGET` sent and its bulk replies
//! read straight from the socket into one reused buffer, each handed to the caller as it
//! arrives (decoded while the store's next bytes wait in the socket).
//!
//! The `redis` crate's reply parser (combine's partial decoder) buffers each multi-MiB bulk
//! string, then copies it into a fresh `Vec` per value; on a restore of tens of MiB that is
//! most of the time a fetch takes. This reader speaks only what a fetch needs (RESP2: `AUTH`,
//! `SELECT`, `MGET`); TLS and Unix-socket URLs keep the crate's connection.
//!
//! Invariant: a reply is consumed whole or the connection is dropped (the caller's link
//! reconnects after its backoff), so the stream never falls out of step; a bulk length past
//! [`MAX_VALUE_BYTES`] or anything but an array of bulk strings is a protocol error.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Largest value this reader accepts (a run of a large model's f32 KV is under this).
pub const MAX_VALUE_BYTES: usize = 1 << 30;

/// Why a bulk read failed.
#[derive(Debug)]
pub(crate) enum BulkError {
    /// The socket failed or timed out, or the reply was not RESP: the connection is unusable.
    Io(std::io::Error),
    /// The store answered with an error (`NOPERM`, `LOADING`): the connection is in step.
    Refused(String),
}

impl From<std::io::Error> for BulkError {
    fn from(e: std::io::Error) -> BulkError {
        BulkError::Io(e)
    }
}

fn protocol(what: &str) -> BulkError {
    BulkError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("remote tier reply: {what}")))
}

/// A plain TCP connection to the store, authenticated and on its database.
pub(crate) struct BulkConn {
    reader: BufReader<TcpStream>,
    line: Vec<u8>,
    value: Vec<u8>,
}

impl BulkConn {
    /// Connects to `host:port` within `timeout`, then `AUTH` (if `password`) and `SELECT db`
    /// (if not 0).
    pub fn connect(
        host: &str,
        port: u16,
        username: Option<&str>,
        password: Option<&str>,
        db: i64,
        timeout: Duration,
    ) -> Result<BulkConn, BulkError> {
        let mut last = None;
        let mut stream = None;
        for addr in (host, port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = stream.ok_or_else(|| last.unwrap_or_else(|| std::io::Error::other("no address")))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut c = BulkConn { reader: BufReader::with_capacity(1 << 16, stream), line: Vec::new(), value: Vec::new() };
        if let Some(pass) = password {
            let mut args = vec!["AUTH"];
            args.extend(username);
            args.push(pass);
            c.simple(&args)?;
        }
        if db != 0 {
            c.simple(&["SELECT", &db.to_string()])?;
        }
        Ok(c)
    }

    /// Sets the read timeout of the next replies.
    pub fn set_read_timeout(&mut self, timeout: Duration) -> Result<(), BulkError> {
        Ok(self.reader.get_ref().set_read_timeout(Some(timeout))?)
    }

    /// Sends `args` as one command.
    fn send(&mut self, args: &[&str]) -> Result<(), BulkError> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&req)?;
        Ok(())
    }

    /// Reads one reply line (without its CRLF) into `self.line`.
    fn read_line(&mut self) -> Result<(), BulkError> {
        self.line.clear();
        let n = (&mut self.reader).take(1 << 16).read_until(b'\n', &mut self.line)?;
        if n < 3 || !self.line.ends_with(b"\r\n") {
            return Err(protocol("a line without its end"));
        }
        self.line.truncate(n - 2);
        Ok(())
    }

    fn number(&self) -> Result<i64, BulkError> {
        std::str::from_utf8(&self.line[1..]).ok().and_then(|s| s.parse().ok()).ok_or_else(|| protocol("not a length"))
    }

    /// Sends `args` and expects a simple `+…` reply.
    fn simple(&mut self, args: &[&str]) -> Result<(), BulkError> {
        self.send(args)?;
        self.read_line()?;
        match self.line.first() {
            Some(b'+') => Ok(()),
            Some(b'-') => Err(BulkError::Refused(String::from_utf8_lossy(&self.line[1..]).into_owned())),
            _ => Err(protocol("not a status")),
        }
    }

    /// `MGET keys`, calling `each(i, value)` for every key in order as its value arrives (`None`:
    /// no such key). The whole reply is read whatever `each` does.
    pub fn mget_each(&mut self, keys: &[String], mut each: impl FnMut(usize, Option<&[u8]>)) -> Result<(), BulkError> {
        let mut req = format!("*{}\r\n$4\r\nMGET\r\n", keys.len() + 1).into_bytes();
        for k in keys {
            req.extend_from_slice(format!("${}\r\n", k.len()).as_bytes());
            req.extend_from_slice(k.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&req)?;
        self.read_line()?;
        match self.line.first() {
            Some(b'*') if self.number()? == keys.len() as i64 => {}
            Some(b'-') => return Err(BulkError::Refused(String::from_utf8_lossy(&self.line[1..]).into_owned())),
            _ => return Err(protocol("not an array of the keys' length")),
        }
        for i in 0..keys.len() {
            self.read_line()?;
            if self.line.first() != Some(&b'$') {
                return Err(protocol("not a bulk string"));
            }
            let len = self.number()?;
            if len < 0 {
                each(i, None);
                continue;
            }
            let len = len as usize;
            if len > MAX_VALUE_BYTES {
                return Err(protocol("a value past the size limit"));
            }
            // Into the reused buffer: no allocation, zeroing or page faults per value once it
            // has grown to a run's size.
            if self.value.len() < len + 2 {
                self.value.resize(len + 2, 0);
            }
            let value = &mut self.value[..len + 2];
            self.reader.read_exact(value)?;
            if !value.ends_with(b"\r\n") {
                return Err(protocol("a value without its end"));
            }
            each(i, Some(&value[..len]));
        }
        Ok(())
    }
}
