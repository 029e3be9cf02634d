//! The pieces of a tool call's text that let its arguments stream as they are written: the
//! call's head (the family's opening, then `{"name": "<tool>", "arguments": ` with any
//! whitespace, up to the arguments' `{`), the arguments themselves scanned character by
//! character until their object closes, the literals after them, and the body of a JSON
//! string decoded as it comes (the generic family's text answer).
//!
//! A call in another shape (its keys in another order, its arguments a string) does not
//! match [`head`]; the splitter then parses it whole.
//!
//! Invariant: [`Args`] gives out exactly the arguments' text with the whitespace between
//! JSON tokens removed (strings untouched), so the fragments of a call put together are its
//! compact arguments, the same text whether fed whole or a character at a time.

/// How a fixed shape matches the start of a text.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Match<T> {
    /// It matches, taking this many bytes.
    Yes(T, usize),
    /// The text is a proper prefix of a match: more text may complete it.
    More,
    /// It cannot match.
    No,
}

/// A cursor over a text for matching literals with whitespace between them.
struct Cur<'a> {
    text: &'a str,
    at: usize,
}

impl Cur<'_> {
    fn ws(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    /// `Ok` when `lit` is next (and taken), else whether more text could still hold it.
    fn lit(&mut self, lit: &str) -> Result<(), bool> {
        let rest = &self.text[self.at..];
        if rest.starts_with(lit) {
            self.at += lit.len();
            Ok(())
        } else {
            Err(lit.starts_with(rest))
        }
    }

    /// The first of `lits` that is next (taken), else whether more text could hold one.
    fn one_of(&mut self, lits: &[&str]) -> Result<(), bool> {
        let mut more = false;
        for l in lits {
            match self.lit(l) {
                Ok(()) => return Ok(()),
                Err(m) => more |= m,
            }
        }
        Err(more)
    }

    /// A JSON string next (taken), else whether more text could complete one.
    fn string(&mut self) -> Result<String, bool> {
        let rest = &self.text[self.at..];
        if rest.is_empty() {
            return Err(true);
        }
        if !rest.starts_with('"') {
            return Err(false);
        }
        let mut escaped = false;
        for (i, c) in rest.char_indices().skip(1) {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                let s = serde_json::from_str(&rest[..=i]).map_err(|_| false)?;
                self.at += i + 1;
                return Ok(s);
            }
        }
        Err(true)
    }
}

/// Matches `opening` (literals with any whitespace between them) and then
/// `{"name": "<tool>", "arguments": ` (or `"parameters"`), up to the arguments' `{`: the
/// tool's name and the bytes before the arguments.
pub(super) fn head(text: &str, opening: &[&str]) -> Match<String> {
    let mut c = Cur { text, at: 0 };
    let step = |r: Result<(), bool>| match r {
        Ok(()) => None,
        Err(true) => Some(Match::More),
        Err(false) => Some(Match::No),
    };
    for lit in opening {
        c.ws();
        if let Some(m) = step(c.lit(lit)) {
            return m;
        }
    }
    c.ws();
    if let Some(m) = step(c.lit("{")) {
        return m;
    }
    c.ws();
    if let Some(m) = step(c.lit("\"name\"")) {
        return m;
    }
    c.ws();
    if let Some(m) = step(c.lit(":")) {
        return m;
    }
    c.ws();
    let name = match c.string() {
        Ok(n) => n,
        Err(true) => return Match::More,
        Err(false) => return Match::No,
    };
    for lits in [&[","][..], &["\"arguments\"", "\"parameters\""], &[":"]] {
        c.ws();
        if let Some(m) = step(c.one_of(lits)) {
            return m;
        }
    }
    c.ws();
    match text[c.at..].chars().next() {
        None => Match::More,
        Some('{') => Match::Yes(name, c.at),
        Some(_) => Match::No,
    }
}

/// Matches literals with any whitespace before each: the bytes they take.
pub(super) fn literals(text: &str, lits: &[&str]) -> Match<()> {
    let mut c = Cur { text, at: 0 };
    for lit in lits {
        c.ws();
        match c.lit(lit) {
            Ok(()) => {}
            Err(true) => return Match::More,
            Err(false) => return Match::No,
        }
    }
    Match::Yes((), c.at)
}

/// Scans a call's arguments (a JSON object) as their text comes. Invariant: `text` is what
/// has been scanned, whitespace outside strings removed; `depth` counts the open brackets.
#[derive(Debug, Default)]
pub(super) struct Args {
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// The compact arguments so far.
    pub text: String,
}

/// What [`Args::feed`] took.
pub(super) struct Fed {
    /// Bytes of the input taken.
    pub taken: usize,
    /// The compact text they add to the arguments.
    pub fragment: String,
    /// Whether the arguments' object closed.
    pub done: bool,
}

impl Args {
    /// Takes `input` up to the end of the arguments' object (all of it if it has not closed).
    pub fn feed(&mut self, input: &str) -> Fed {
        let mut fragment = String::new();
        for (i, c) in input.char_indices() {
            if self.in_string {
                fragment.push(c);
                if self.escaped {
                    self.escaped = false;
                } else if c == '\\' {
                    self.escaped = true;
                } else if c == '"' {
                    self.in_string = false;
                }
                continue;
            }
            if c.is_whitespace() {
                continue;
            }
            fragment.push(c);
            match c {
                '"' => self.in_string = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
            if self.depth == 0 {
                self.text.push_str(&fragment);
                return Fed { taken: i + c.len_utf8(), fragment, done: true };
            }
        }
        self.text.push_str(&fragment);
        Fed { taken: input.len(), fragment, done: false }
    }
}

/// The decoded start of a JSON string's body (after its opening quote): the text, the bytes
/// taken, and whether the closing quote was reached (and taken). An escape is decoded only
/// when whole (a surrogate pair with both halves), unless at the `end` of the answer;
/// an escape JSON does not have is kept as written.
pub(super) fn string_prefix(body: &str, end: bool) -> (String, usize, bool) {
    let bytes = body.as_bytes();
    let mut out = String::new();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => return (out, at + 1, true),
            b'\\' => {
                let len = match bytes.get(at + 1) {
                    None => break,
                    Some(b'u') => {
                        let high = body.get(at + 2..at + 6).and_then(|h| u16::from_str_radix(h, 16).ok());
                        match high {
                            None if at + 6 > bytes.len() => break,
                            Some(h) if (0xD800..0xDC00).contains(&h) => {
                                if at + 12 > bytes.len() && !end {
                                    break;
                                }
                                if body.get(at + 6..at + 8) == Some("\\u") {
                                    12
                                } else {
                                    6
                                }
                            }
                            _ => 6,
                        }
                    }
                    Some(_) => 2,
                };
                let len = len.min(bytes.len() - at);
                let esc = &body[at..at + len];
                match serde_json::from_str::<String>(&format!("\"{esc}\"")) {
                    Ok(s) => out.push_str(&s),
                    Err(_) => out.push_str(esc),
                }
                at += len;
            }
            _ => {
                let next = body[at..].find(['"', '\\']).map_or(body.len(), |n| at + n);
                out.push_str(&body[at..next]);
                at = next;
            }
        }
    }
    (out, at, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_matches_with_any_whitespace_and_waits_on_a_prefix() {
        let t = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"";
        let at = t.find("{\"city").unwrap();
        assert_eq!(head(t, &["<tool_call>"]), Match::Yes("get_weather".into(), at));
        let m = "[TOOL_CALLS] [{\"name\":\"f\",\"parameters\":{}";
        assert_eq!(head(m, &["[TOOL_CALLS]", "["]), Match::Yes("f".into(), m.len() - 2));
        for cut in 1..at {
            assert_eq!(head(&t[..cut], &["<tool_call>"]), Match::More, "{:?}", &t[..cut]);
        }
        assert_eq!(head("{\"arguments\": {}, \"name\": \"f\"}", &[]), Match::No);
        assert_eq!(head("{\"name\": \"f\", \"arguments\": \"{}\"}", &[]), Match::No);
        assert_eq!(head("Sure", &["<tool_call>"]), Match::No);
    }

    #[test]
    fn arguments_scan_to_their_close_compact_whole_or_by_character() {
        let t = "{ \"a\": [1, {\"b\": \"x }\\\" y\"}],\n \"c\": {} } tail";
        let mut whole = Args::default();
        let f = whole.feed(t);
        assert!(f.done);
        assert_eq!(&t[f.taken..], " tail");
        assert_eq!(whole.text, "{\"a\":[1,{\"b\":\"x }\\\" y\"}],\"c\":{}}");
        let mut by_char = Args::default();
        let mut joined = String::new();
        for c in t.chars() {
            let f = by_char.feed(&c.to_string());
            joined.push_str(&f.fragment);
            if f.done {
                break;
            }
        }
        assert_eq!(joined, whole.text);
    }

    #[test]
    fn literals_after_the_arguments() {
        assert_eq!(literals("}\n</tool_call>x", &["}", "</tool_call>"]), Match::Yes((), 14));
        assert_eq!(literals("} \n</tool", &["}", "</tool_call>"]), Match::More);
        assert_eq!(literals("}, ", &["}", "]"]), Match::No);
    }
}
