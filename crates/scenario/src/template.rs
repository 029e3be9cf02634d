//! Prompt templates: `${phase_name.messages[agent_key]}` stands for the messages said in
//! `phase_name`, written from `agent_key`'s point of view (its own lines labelled "You",
//! everyone else's by display name), one `Name: text` line each.
//!
//! Invariant: resolution replaces exactly the references [`references`] finds and leaves
//! every other character of the template as written.

/// One `${phase.messages[agent]}` in a template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// Byte range of the whole `${...}` in the template.
    pub range: std::ops::Range<usize>,
    /// The phase quoted and whose point of view it is quoted from.
    pub phase: String,
    pub agent: String,
}

/// Every reference in `template`, in order. Text that starts with `${` but is not a whole
/// reference is left alone (and reported by [`malformed`]).
pub fn references(template: &str) -> Vec<Reference> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = template[from..].find("${") {
        let start = from + i;
        match parse_at(&template[start..]) {
            Some((len, phase, agent)) => {
                out.push(Reference { range: start..start + len, phase, agent });
                from = start + len;
            }
            None => from = start + 2,
        }
    }
    out
}

/// The `${...}` spans of `template` that are not well-formed references.
pub fn malformed(template: &str) -> Vec<String> {
    let good: Vec<usize> = references(template).iter().map(|r| r.range.start).collect();
    template
        .match_indices("${")
        .filter(|(i, _)| !good.contains(i))
        .map(|(i, _)| {
            let rest = &template[i..];
            rest[..rest.find('}').map_or(rest.len().min(40), |e| e + 1)].to_string()
        })
        .collect()
}

/// Parses `${word.messages[word]}` at the start of `s`: (length, phase, agent).
fn parse_at(s: &str) -> Option<(usize, String, String)> {
    let body = s.strip_prefix("${")?;
    let word = |t: &str| t.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(t.len());
    let p = word(body);
    let rest = body[p..].strip_prefix(".messages[")?;
    let a = word(rest);
    let tail = rest[a..].strip_prefix("]}")?;
    if p == 0 || a == 0 {
        return None;
    }
    Some((s.len() - tail.len(), body[..p].to_string(), rest[..a].to_string()))
}

/// One line said in a phase: who said it and what.
#[derive(Clone, Debug)]
pub struct Line<'a> {
    /// The speaker's agent id.
    pub speaker: &'a str,
    pub text: &'a str,
}

/// `lines` as `agent` reads them: its own as `You: ...`, others' as `Name: ...`
/// (`display` maps an agent id to its name).
pub fn from_perspective(lines: &[Line], agent: &str, display: &dyn Fn(&str) -> String) -> String {
    lines
        .iter()
        .map(|l| {
            let who = if l.speaker == agent { "You".to_string() } else { display(l.speaker) };
            format!("{who}: {}", l.text.trim())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `template` with each reference replaced by `resolve(phase, agent)`.
pub fn resolve(template: &str, resolve: &mut dyn FnMut(&str, &str) -> String) -> String {
    let mut out = String::with_capacity(template.len());
    let mut at = 0;
    for r in references(template) {
        out.push_str(&template[at..r.range.start]);
        out.push_str(&resolve(&r.phase, &r.agent));
        at = r.range.end;
    }
    out.push_str(&template[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_and_resolves_references() {
        let t = "A ${p1.messages[alice]} B ${bad} ${p_2.messages[bob]}";
        let refs = references(t);
        assert_eq!(refs.len(), 2);
        assert_eq!((refs[0].phase.as_str(), refs[0].agent.as_str()), ("p1", "alice"));
        assert_eq!(malformed(t), vec!["${bad}".to_string()]);
        let r = resolve(t, &mut |p, a| format!("<{p}:{a}>"));
        assert_eq!(r, "A <p1:alice> B ${bad} <p_2:bob>");
    }

    #[test]
    fn own_lines_are_you() {
        let lines = [Line { speaker: "alice", text: "hi" }, Line { speaker: "bob", text: " yo " }];
        let name = |id: &str| if id == "bob" { "Bob".to_string() } else { id.to_string() };
        assert_eq!(from_perspective(&lines, "alice", &name), "You: hi\nBob: yo");
        assert_eq!(from_perspective(&lines, "eve", &name), "alice: hi\nBob: yo");
    }
}
