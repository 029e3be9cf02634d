//! Engine events → Server-Sent Events (and, through [`EventStream`], Ollama's
//! newline-delimited JSON). Each API supplies a formatter that turns one engine
//! [`Event`] (or `None`: the engine went away) into zero or more items and says
//! whether the stream is over.
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

use crate::engine_handle::Event;

/// Formats engine events into items of type `T`; returns them and whether the stream ends.
pub type FormatterOf<T> = Box<dyn FnMut(Option<Event>) -> (Vec<T>, bool) + Send>;

/// Formats engine events; returns the SSE events and whether the stream ends.
pub type Formatter = FormatterOf<SseEvent>;

/// The formatted items of a job's events, in order; ends after the item the formatter marks
/// last, or once the engine drops the channel.
pub(crate) struct EventStream<T> {
    rx: UnboundedReceiver<Event>,
    pending: VecDeque<T>,
    format: FormatterOf<T>,
    done: bool,
}

impl<T> EventStream<T> {
    /// `first`, then the formatted `head` (the job's first output), then the formatted rest of `rx`.
    pub(crate) fn new(first: Vec<T>, head: Event, rx: UnboundedReceiver<Event>, mut format: FormatterOf<T>) -> EventStream<T> {
        let mut pending: VecDeque<T> = first.into();
        let (items, done) = format(Some(head));
        pending.extend(items);
        EventStream { rx, pending, format, done }
    }
}

impl<T: Unpin> futures_core::Stream for EventStream<T> {
    type Item = Result<T, Infallible>;

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
    format: Formatter,
    headers: Vec<(&'static str, String)>,
) -> Response {
    let mut r = Sse::new(EventStream::new(first, head, rx, format)).into_response();
    for (k, v) in headers {
        if let Ok(v) = v.parse() {
            r.headers_mut().insert(k, v);
        }
    }
    r.headers_mut().insert("cache-control", axum::http::HeaderValue::from_static("no-cache"));
    r
}
