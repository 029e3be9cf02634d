//! `ChatStream`: a streamed answer as a Python iterator of OpenAI-shaped chunks. Each `next()`
//! waits for the engine with the GIL released, so streams iterated from several Python threads
//! at once run in the engine's batch together.
//!
//! Invariant: the chunks' texts joined are the text the same call without `stream` returns;
//! the last chunk carries the finish reason; a stream dropped or closed early cancels its job.

use std::sync::Mutex;

use engram_engine::Event;
use pyo3::prelude::*;

use crate::convert::to_py;
use crate::errors;
use crate::job::{dropped, Pending};
use crate::response::{Header, Kind};

/// A streamed answer; iterate it for chunks (dicts shaped as OpenAI's stream chunks).
#[pyclass(frozen, module = "engram._engram")]
pub struct ChatStream {
    pending: Pending,
    header: Header,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    role_sent: bool,
    done: bool,
    /// Log-probabilities of tokens whose text has not been sent yet.
    logprobs: Vec<engram_engine::TokenLogprob>,
    /// A text stream's byte offset of the next chunk's text.
    offset: usize,
}

impl ChatStream {
    /// The stream of `pending`'s answer.
    pub fn new(pending: Pending, header: Header) -> ChatStream {
        ChatStream { pending, header, state: Mutex::new(State::default()) }
    }
}

#[pymethods]
impl ChatStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if self.state.lock().unwrap_or_else(|e| e.into_inner()).done {
            return Ok(None);
        }
        loop {
            let event = self.pending.next(py);
            let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let st = &mut *guard;
            let chunk = match event? {
                Some(Event::Started { .. }) if self.header.kind == Kind::Chat && !st.role_sent => {
                    st.role_sent = true;
                    self.header.chunk(Some(""), true, None, &[], &mut st.offset)
                }
                Some(Event::Started { .. }) => continue,
                Some(Event::Logprob(l)) => {
                    st.logprobs.push(l);
                    continue;
                }
                Some(Event::Text(t)) => {
                    let entries = std::mem::take(&mut st.logprobs);
                    self.header.chunk(Some(&t), false, None, &entries, &mut st.offset)
                }
                Some(Event::Finished { finish, .. }) => {
                    st.done = true;
                    let entries = std::mem::take(&mut st.logprobs);
                    self.header.chunk(None, false, Some(finish), &entries, &mut st.offset)
                }
                Some(Event::Failed(e)) => {
                    st.done = true;
                    return Err(errors::from_job(e));
                }
                None => {
                    st.done = true;
                    return Err(errors::from_job(dropped()));
                }
            };
            return to_py(py, &chunk).map(Some);
        }
    }

    /// Stops the generation; the iterator then ends.
    fn close(&self) {
        self.pending.cancel();
        self.state.lock().unwrap_or_else(|e| e.into_inner()).done = true;
    }

    /// The answer's id (every chunk carries it).
    #[getter]
    fn id(&self) -> String {
        self.header.id.clone()
    }
}
