//! Where things are in a scenario file's text, for error messages.
//!
//! NOTE: `serde_yaml_ng` reports positions only for syntax and type errors, not for the
//! nodes of a parsed document, so semantic errors find their line by searching the text:
//! a phase's block starts at the line with `name: <phase>` under `phases:` and runs to the
//! next phase's; a name inside it is the first line of the block that holds it as a word.
//! A line that cannot be found falls back to the enclosing block's.
//!
//! Invariant: every line number is 1-based and points into the file.

/// The file's lines and its top-level sections.
pub struct SourceLines<'a> {
    lines: Vec<&'a str>,
}

impl<'a> SourceLines<'a> {
    /// Splits `text` into lines.
    pub fn new(text: &'a str) -> SourceLines<'a> {
        SourceLines { lines: text.lines().collect() }
    }

    /// The 1-based line of the top-level key `key:`, or 1.
    pub fn top_key(&self, key: &str) -> usize {
        let want = format!("{key}:");
        self.lines.iter().position(|l| l.starts_with(&want)).map_or(1, |i| i + 1)
    }

    /// The 1-based line range `[start, end)` of the list item under the top-level key
    /// `section` whose `field:` is `value` (its `- ` line to the next item's).
    pub fn item(&self, section: &str, field: &str, value: &str) -> Option<(usize, usize)> {
        let from = self.top_key(section);
        let end_of_section = (from..self.lines.len()).find(|&i| is_top_level(self.lines[i])).map_or(self.lines.len() + 1, |i| i + 1);
        let key_line = (from..end_of_section - 1).find(|&i| {
            let l = self.lines[i].trim_start().trim_start_matches("- ").trim_start();
            l.strip_prefix(field).and_then(|r| r.trim_start().strip_prefix(':')).is_some_and(|v| unquote(v.trim()) == value)
        })?;
        // The item starts at its `- ` line (the key line or one above it).
        let start = (from..=key_line).rev().find(|&i| self.lines[i].trim_start().starts_with("- ")).unwrap_or(key_line);
        let indent = indent_of(self.lines[start]);
        let end = (start + 1..end_of_section - 1)
            .find(|&i| {
                let l = self.lines[i];
                !l.trim().is_empty() && indent_of(l) <= indent && l.trim_start().starts_with("- ")
            })
            .map_or(end_of_section, |i| i + 1);
        Some((start + 1, end))
    }

    /// The first 1-based line in `[start, end)` holding `needle` (as a whole word when it
    /// is one), or `start`.
    pub fn find_in(&self, (start, end): (usize, usize), needle: &str) -> usize {
        (start..end.min(self.lines.len() + 1)).find(|&n| contains_word(self.lines[n - 1], needle)).unwrap_or(start)
    }
}

fn is_top_level(line: &str) -> bool {
    !line.is_empty() && !line.starts_with(' ') && !line.starts_with('#') && !line.starts_with('-')
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn unquote(v: &str) -> &str {
    v.trim_matches(|c| c == '"' || c == '\'')
}

fn contains_word(line: &str, needle: &str) -> bool {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(needle).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + needle.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}
