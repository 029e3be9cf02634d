//! Accepting connections under limits (every queue, body, header wait and connection count bounded).
//!
//! - At most [`HttpLimits::max_connections`] connections are open at once; the next
//!   one is not accepted (it waits in the kernel's backlog) until one closes, so a flood
//!   of idle sockets cannot exhaust file descriptors or tasks.
//! - A request's headers must arrive within [`HttpLimits::header_timeout`] of the
//!   connection starting to wait for them — which is also how long a kept-alive
//!   connection may sit idle between requests (hyper's `header_read_timeout`, which
//!   axum's own `serve` leaves off: it sets no timer).
//! - The body's deadline is the `read_body` middleware's (`guard.rs`).
//!
//! Invariant: every accepted connection holds one permit of the connection semaphore
//! until its task ends; on shutdown every connection is asked to finish its in-flight
//! request and close, and `serve_limited` returns once all have, or after `grace`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

/// Limits of the HTTP layer; see the module doc.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HttpLimits {
    /// Connections open at once (at least 1).
    pub max_connections: usize,
    /// Time for a request's headers to arrive, and the idle limit of a kept-alive connection.
    pub header_timeout: Duration,
    /// Time for a request's whole body to arrive once its headers have (a 408 after).
    pub body_timeout: Duration,
}

impl Default for HttpLimits {
    /// 512 connections, 30 s for headers (and idle), 30 s for a body (at most 2 MiB).
    fn default() -> Self {
        HttpLimits { max_connections: 512, header_timeout: Duration::from_secs(30), body_timeout: Duration::from_secs(30) }
    }
}

/// Serves `app` on `listener` under `limits` until `shutdown` resolves, then gives
/// in-flight requests at most `grace` to finish.
pub(crate) async fn serve_limited(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Every connection task holds a clone of `open_rx`; `open_tx.closed()` fires when all are gone.
    let (open_tx, open_rx) = watch::channel(());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the connection semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let open = open_rx.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: hyper::Request<Incoming>| app.clone().oneshot(req.map(axum::body::Body::new)));
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
            let mut conn = std::pin::pin!(builder.serve_connection(TokioIo::new(stream), service));
            let mut asked = *stop.borrow();
            if asked {
                conn.as_mut().graceful_shutdown();
            }
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!("connection ended: {e}");
                        }
                        break;
                    }
                    changed = stop.changed(), if !asked => {
                        asked = true;
                        if changed.is_ok() {
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                }
            }
            drop(permit);
            drop(open);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(open_rx);
    tokio::select! {
        _ = open_tx.closed() => {}
        _ = tokio::time::sleep(grace) => tracing::warn!("in-flight requests did not finish within {grace:?}; exiting anyway"),
    }
    Ok(())
}
