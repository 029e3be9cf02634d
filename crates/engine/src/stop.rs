//! Stop strings over a text stream.
//!
//! Invariant: text is released only once it can no longer be the start of a
//! stop string, so a streaming client never sees part of a stop sequence, and
//! the concatenation of released text equals the non-streamed result.

/// Holds back text that might begin a stop string.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), pending: String::new(), matched: None }
    }

    /// Adds text; returns `(releasable text, stopped)`. After a stop, the text
    /// before the stop string is released and the rest is discarded.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some((at, which)) = self.stops.iter().enumerate().filter_map(|(i, s)| self.pending.find(s.as_str()).map(|at| (at, i))).min()
        {
            self.matched = Some(which);
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (i, _) in self.pending.char_indices() {
                let suffix = &self.pending[i..];
                if suffix.len() < s.len() && s.starts_with(suffix) {
                    hold = hold.max(suffix.len());
                    break;
                }
            }
        }
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// The stop string that ended the stream, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Releases whatever is held (the stream ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_partial_matches_and_cuts_at_stop() {
        let mut m = StopMatcher::new(&["\nUser:".to_string()]);
        assert_eq!(m.push("Hello"), ("Hello".into(), false));
        assert_eq!(m.push(" there\nUs"), (" there".into(), false));
        assert_eq!(m.push("er: hi"), ("".into(), true));
        assert_eq!(m.matched(), Some("\nUser:"));
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("an E"), ("an ".into(), false));
        assert_eq!(m.push("xit"), ("Exit".into(), false));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn streamed_equals_whole_for_any_split() {
        let text = "naïve café — stop here STOP and not this";
        let stops = vec!["STOP".to_string(), "é —".to_string()];
        let whole = {
            let mut m = StopMatcher::new(&stops);
            m.push(text).0
        };
        for split in text.char_indices().map(|(i, _)| i) {
            let mut m = StopMatcher::new(&stops);
            let (a, s1) = m.push(&text[..split]);
            let mut out = a;
            if !s1 {
                let (b, _) = m.push(&text[split..]);
                out += &b;
            }
            assert_eq!(out, whole, "split at {split}");
        }
    }
}
