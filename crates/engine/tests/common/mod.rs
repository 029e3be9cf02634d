//! What the engine's integration tests share: an `EventSink` that keeps a job's events.

use std::sync::{Arc, Mutex};

use engram_engine::{Event, EventSink, FinishReason};

/// Collects a job's events.
#[derive(Clone, Default)]
pub struct Collect(pub Arc<Mutex<Vec<Event>>>);

impl EventSink for Collect {
    fn send(&self, event: Event) -> bool {
        self.0.lock().unwrap().push(event);
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

impl Collect {
    /// The streamed text and how the job finished.
    pub fn outcome(&self) -> (String, Option<FinishReason>) {
        let events = self.0.lock().unwrap();
        let text = events.iter().filter_map(|e| if let Event::Text(t) = e { Some(t.as_str()) } else { None }).collect();
        let finish = events.iter().find_map(|e| if let Event::Finished { finish, .. } = e { Some(*finish) } else { None });
        (text, finish)
    }
}
