//! One connection to the store, kept healthy: a timeout on connecting, on every read and every
//! write; a connection that failed is dropped (a reply cut by a timeout would desynchronise it)
//! and reconnected only after a backoff, so a store that is down costs a caller nothing but a
//! check of the clock until the backoff has passed.
//!
//! Bulk reads of run values over a plain TCP URL use a second, lean connection (`bulk.rs`)
//! under the same timeout and backoff.
//!
//! Invariant: [`Link::run`] and [`Link::mget_each`] return within about the timeout per round trip (connecting
//! included), whatever the store does; after a failure no call connects again until
//! the backoff (doubling from [`BACKOFF_MIN`] to [`BACKOFF_MAX`]) has passed.

use std::time::{Duration, Instant};

use crate::bulk::{BulkConn, BulkError};
use crate::stats::Stats;

/// The first wait after a failure.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait between attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Why a call to the store did nothing.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// No attempt was made: the store failed recently and the backoff has not passed.
    #[error("remote KV tier unavailable (retrying in {0:?})")]
    Backoff(Duration),
    /// The store failed (unreachable, timed out, refused the command).
    #[error("remote KV tier: {0}")]
    Redis(#[from] redis::RedisError),
    /// The store answered a bulk read with an error (the connection stays in step).
    #[error("remote KV tier refused: {0}")]
    Refused(String),
}

/// Where a plain TCP URL's bulk reads connect (`crate::bulk`): host, port, user, password, db.
type Plain = (String, u16, Option<String>, Option<String>, i64);

/// A connection to one store URL, reconnected on demand.
pub struct Link {
    client: redis::Client,
    timeout: Duration,
    conn: Option<redis::Connection>,
    /// For a plain TCP URL: where bulk reads go, and their connection once made.
    plain: Option<Plain>,
    bulk: Option<BulkConn>,
    /// When a failed store may be tried again, and the backoff that led there.
    retry_at: Option<(Instant, Duration)>,
    stats: Stats,
}

impl Link {
    /// A link to `url` (`redis://[user:password@]host:port[/db]`, or `rediss://` for TLS,
    /// verified against `ca_pem` if given, else the system's roots); connects on first use.
    pub fn new(url: &str, timeout: Duration, ca_pem: Option<&[u8]>, stats: Stats) -> Result<Link, redis::RedisError> {
        let client = client(url, ca_pem)?;
        let info = client.get_connection_info();
        let plain = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => {
                let r = info.redis_settings();
                Some((host.clone(), *port, r.username().map(str::to_string), r.password().map(str::to_string), r.db()))
            }
            _ => None,
        };
        Ok(Link { client, timeout, conn: None, plain, bulk: None, retry_at: None, stats })
    }

    /// `MGET keys` with `timeout` on the reply, calling `each(i, value)` for every key in order
    /// (`None`: no such key) as its value arrives: over a plain TCP URL through the lean reader
    /// (`bulk.rs`), else through the crate's connection. Failures are handled as in
    /// [`Link::run`].
    pub fn mget_each(&mut self, keys: &[String], timeout: Duration, mut each: impl FnMut(usize, Option<&[u8]>)) -> Result<(), LinkError> {
        let Some((host, port, user, pass, db)) = self.plain.clone() else {
            let values: Vec<Option<Vec<u8>>> = self.run(|c| {
                c.set_read_timeout(Some(timeout))?;
                redis::cmd("MGET").arg(keys).query(c)
            })?;
            for (i, v) in values.iter().enumerate() {
                each(i, v.as_deref());
            }
            return Ok(());
        };
        if self.bulk.is_none() {
            if let Some((at, _)) = self.retry_at {
                let now = Instant::now();
                if now < at {
                    return Err(LinkError::Backoff(at - now));
                }
            }
            match BulkConn::connect(&host, port, user.as_deref(), pass.as_deref(), db, self.timeout) {
                Ok(c) => {
                    self.bulk = Some(c);
                    if self.retry_at.take().is_some() {
                        tracing::info!("remote KV tier reconnected");
                    }
                    self.stats.connected(true);
                }
                // Refused while connecting (a wrong password) is a failed connection too.
                Err(BulkError::Refused(m)) => {
                    return Err(self.bulk_failed(BulkError::Io(std::io::Error::new(std::io::ErrorKind::PermissionDenied, m))))
                }
                Err(e) => return Err(self.bulk_failed(e)),
            }
        }
        let conn = self.bulk.as_mut().expect("connected above");
        match conn.set_read_timeout(timeout).and_then(|()| conn.mget_each(keys, &mut each)) {
            Ok(()) => {
                self.stats.connected(true);
                Ok(())
            }
            Err(e) => Err(self.bulk_failed(e)),
        }
    }

    /// A failed bulk read or connection: a refusal keeps the connection (it is in step);
    /// anything else drops it and starts (or doubles) the backoff.
    fn bulk_failed(&mut self, e: BulkError) -> LinkError {
        match e {
            BulkError::Refused(m) => LinkError::Refused(m),
            BulkError::Io(e) => {
                let e = redis::RedisError::from(e);
                self.bulk = None;
                self.stats.connected(false);
                self.fail(&e);
                LinkError::Redis(e)
            }
        }
    }

    /// Runs `f` on the connection (connecting first if needed). A failure drops the connection
    /// and starts (or doubles) the backoff; an error the store answered (a refused command)
    /// keeps the connection.
    pub fn run<T>(&mut self, f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>) -> Result<T, LinkError> {
        if self.conn.is_none() {
            if let Some((at, _)) = self.retry_at {
                let now = Instant::now();
                if now < at {
                    return Err(LinkError::Backoff(at - now));
                }
            }
            match self.connect() {
                Ok(c) => {
                    self.conn = Some(c);
                    if self.retry_at.take().is_some() {
                        tracing::info!("remote KV tier reconnected");
                    }
                    self.stats.connected(true);
                }
                Err(e) => {
                    self.stats.connected(false);
                    self.fail(&e);
                    return Err(e.into());
                }
            }
        }
        let conn = self.conn.as_mut().expect("connected above");
        match f(conn) {
            Ok(v) => {
                self.stats.connected(true);
                Ok(v)
            }
            Err(e) => {
                // A reply the store gave (NOPERM, OOM, WRONGTYPE) leaves the stream in step; a
                // timeout or a broken connection does not.
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                    self.conn = None;
                    self.stats.connected(false);
                    self.fail(&e);
                }
                Err(e.into())
            }
        }
    }

    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let c = self.client.get_connection_with_timeout(self.timeout)?;
        c.set_read_timeout(Some(self.timeout))?;
        c.set_write_timeout(Some(self.timeout))?;
        Ok(c)
    }

    fn fail(&mut self, e: &redis::RedisError) {
        let wait = self.retry_at.map_or(BACKOFF_MIN, |(_, w)| (w * 2).min(BACKOFF_MAX));
        if self.retry_at.is_none() {
            tracing::warn!("remote KV tier failed ({e}); serving from local tiers, retrying with backoff");
        }
        self.retry_at = Some((Instant::now() + wait, wait));
    }
}

/// A client for `url`: TLS with `ca_pem` as the trusted authority for a `rediss://` URL when
/// given, else as the URL says.
pub(crate) fn client(url: &str, ca_pem: Option<&[u8]>) -> redis::RedisResult<redis::Client> {
    match ca_pem {
        Some(pem) if url.starts_with("rediss://") => {
            redis::Client::build_with_tls(url, redis::TlsCertificates { client_tls: None, root_cert: Some(pem.to_vec()) })
        }
        _ => redis::Client::open(url),
    }
}
