//! Engine events → Server-Sent Events. Each API supplies a formatter that
//! turns one engine [`Event`] (or `None`: the engine went away) into zero or
//! more SSE events and says whether the stream is over.
//!
//! Dropping the stream (client disconnected) drops the receiver, which the
//! engine notices before its next step and cancels the sequence.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::scheduler::Event;

/// Formats engine events; returns the SSE events and whether the stream ends.
pub type Formatter = Box<dyn FnMut(Option<Event>) -> (Vec<SseEvent>, bool) + Send>;

struct EventStream {
    rx: UnboundedReceiver<Event>,
    pending: VecDeque<SseEvent>,
    format: Formatter,
    done: bool,
}

impl futures_core::Stream for EventStream {
    type Item = Result<SseEvent, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(e) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(e)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(ev) => {
                    let closed = ev.is_none();
                    let (events, end) = (this.format)(ev);
                    this.pending.extend(events);
                    this.done = end || closed;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// An SSE response that starts with `first`, then the formatted `head` (the job's first output,
/// from [`crate::api::first_output`]), and continues with the formatted events of `rx`.
pub fn respond(
    first: Vec<SseEvent>,
    head: Event,
    rx: UnboundedReceiver<Event>,
    mut format: Formatter,
    headers: Vec<(&'static str, String)>,
) -> Response {
    let mut pending: VecDeque<SseEvent> = first.into();
    let (events, done) = format(Some(head));
    pending.extend(events);
    let stream = EventStream { rx, pending, format, done };
    let mut r = Sse::new(stream).into_response();
    for (k, v) in headers {
        if let Ok(v) = v.parse() {
            r.headers_mut().insert(k, v);
        }
    }
    r.headers_mut().insert("cache-control", axum::http::HeaderValue::from_static("no-cache"));
    r
}
