//! `TimedSink`: the `EventSink` of the benchmarks that drive the scheduler in process. It
//! keeps when a request's first text, its first token and its end arrived, the text, the completion tokens
//! and any failure, with the engine thread's own timestamps (so how often the caller looks
//! does not change what it measures).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use engram_engine::scheduler::{Event, EventSink};

/// What a request's events said so far.
#[derive(Clone, Debug, Default)]
pub struct Timed {
    pub first_text: Option<Instant>,
    /// The first token's arrival: its text or, for a request asking for log-probabilities,
    /// its log-probability (a token whose bytes do not finish a character yet sends no text).
    pub first_token: Option<Instant>,
    pub end: Option<Instant>,
    pub text: String,
    pub completion_tokens: usize,
    pub failed: Option<String>,
}

/// A cloneable sink whose clones share one [`Timed`].
#[derive(Clone, Default)]
pub struct TimedSink(Arc<Mutex<Timed>>);

impl TimedSink {
    /// A copy of what arrived so far.
    pub fn get(&self) -> Timed {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl EventSink for TimedSink {
    fn send(&self, event: Event) -> bool {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Text(s) => {
                let now = Instant::now();
                t.first_text.get_or_insert(now);
                t.first_token.get_or_insert(now);
                t.text.push_str(&s);
            }
            Event::Finished { completion_tokens, .. } => {
                t.end = Some(Instant::now());
                t.completion_tokens = completion_tokens;
            }
            Event::Failed(e) => t.failed = Some(e.message),
            Event::Logprob(_) => {
                t.first_token.get_or_insert_with(Instant::now);
            }
            Event::Started { .. } => {}
        }
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}
