//! Query prediction by the LLM (PerCache §4.2, its appendix B.3): the model is asked, through
//! its own chat template, for the questions a new chunk answers (knowledge-based) or the
//! questions a user who asked the recent ones would ask next (history-based); its greedy
//! answer is parsed into questions.
//!
//! ```text
//!  basis:     a chunk of a new document (its readable text, its kind)  │  the recent real queries
//!  prompt:    chat template( user: knowledge_prompt | history_prompt )   (add_generation_prompt)
//!  generate:  through the unit's StepClock (the engine's step), greedy, `max_tokens_for(stride)`
//!             (stopped: nothing parsed, the basis is put back)
//!  parse:     one question per line, numbering/bullets/quotes stripped; kept if it is one
//!             sentence ending in '?', 3..=MAX_WORDS words, ≤ MAX_CHARS; duplicates dropped
//! ```
//! NOTE: PerCache's prompts verbatim (the "Such as \"What is the main topic … recorded on
//! XXX?\"" examples, the `'1. ...?; 2. ...?'` format) make SmolLM2-135M-Instruct copy the
//! examples ("What activities did the user mention doing on XXX day?" four times, greedy, in
//! llama.cpp). Asking for "general questions about its main topic and detailed questions
//! about the facts in it", or leaving e-mail addresses in the chunk, makes it continue the
//! e-mail instead; without the topic named it writes generic questions ("What's the purpose of
//! the event?"). The prompts below keep the paper's inputs (the chunk with its abstract's topic,
//! or the query history; the kind of data; the stride) and ask plainly, one question per line;
//! the chunk goes through [`readable`] first.
//!
//! Invariant: the questions are a pure function of the model, the prompt's inputs and the
//! stride (greedy decoding, no sampling state); [`parse_questions`] is pure and never returns
//! an empty, duplicate or over-long question, nor more than it was asked for.

use engram_engine::SamplingParams;
use engram_kv::KvPool;
use engram_model::Model;
use engram_tokenizer::ChatMessage;

use crate::error::{RagError, Result};
use crate::parse::DocKind;

use super::preempt::StepClock;
use crate::run::{Ran, Request};

/// Longest question kept, in characters.
pub const MAX_CHARS: usize = 160;
/// Most words in a question kept (fewer than 3 is never a question about the data).
pub const MAX_WORDS: usize = 25;

/// What the model is asked about.
#[derive(Clone, Debug, PartialEq)]
pub enum Basis {
    /// A chunk's text, the kind of document it comes from, and that document's topic from its
    /// knowledge abstract if it has one (knowledge-based).
    Chunk { kind: DocKind, text: String, topic: Option<String> },
    /// The user's recent questions, oldest first (history-based).
    History(Vec<String>),
}

/// How a document kind is named in the prompts: where it comes from, and what it is.
fn kind_name(kind: DocKind) -> (&'static str, &'static str) {
    match kind {
        DocKind::Email => ("a message from my inbox", "message"),
        DocKind::Calendar => ("an entry from my calendar", "entry"),
        _ => ("a note from my notes", "note"),
    }
}

/// The knowledge-based prompt (PerCache's Figure 27, shortened: see the module doc); with the
/// document's `topic` the questions are asked about it by name.
pub fn knowledge_prompt(kind: DocKind, text: &str, topic: Option<&str>, stride: usize) -> String {
    let (from, noun) = kind_name(kind);
    let text = readable(text);
    match topic {
        Some(t) => format!(
            "Here is {from} about the {t}:\n\n{text}\n\nWrite {stride} different questions about the {t} that I might ask my assistant, one per line."
        ),
        None => format!("Here is {from}:\n\n{text}\n\nWrite {stride} different questions I might ask my assistant about this {noun}, one per line."),
    }
}

/// `text` without what a small model stumbles on: `<…>` spans (e-mail addresses) and the
/// value of a `Date:` header (an ISO timestamp). With them SmolLM2-135M-Instruct continues the
/// e-mail instead of asking about it.
pub fn readable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '<' => depth += 1,
            '>' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    let mut words: Vec<&str> = Vec::new();
    let mut skip = false;
    for w in out.split_whitespace() {
        if skip {
            skip = false;
        } else if w == "Date:" {
            skip = true;
        } else {
            words.push(w);
        }
    }
    words.join(" ")
}

/// The history-based prompt (PerCache's Figure 28, shortened: see the module doc).
pub fn history_prompt(history: &[String], stride: usize) -> String {
    let mut s = String::from("My recent questions to my assistant about my e-mails, notes and calendar were:\n");
    for (i, q) in history.iter().enumerate() {
        s.push_str(&format!("{}. {}\n", i + 1, q.trim()));
    }
    s.push_str(&format!("Write {stride} more questions like these that I might ask next, in my own words. One question per line."));
    s
}

/// The prompt text for `basis`.
pub fn prompt_text(basis: &Basis, stride: usize) -> String {
    match basis {
        Basis::Chunk { kind, text, topic } => knowledge_prompt(*kind, text, topic.as_deref(), stride),
        Basis::History(h) => history_prompt(h, stride),
    }
}

/// Tokens generated per prediction of `stride` questions (about 20 per question).
pub fn max_tokens_for(stride: usize) -> usize {
    20 * stride.max(1) + 16
}

/// `user` as one user turn in the model's chat template, tokenized, ready for the answer;
/// `None` when the model has no chat template (the template predictor is used instead).
pub fn chat_tokens(model: &Model, user: &str) -> Result<Option<Vec<u32>>> {
    let tok = &model.tokenizer;
    let Some(tpl) = tok.chat_template() else { return Ok(None) };
    let text = tpl
        .render(&[ChatMessage::new("user", user)], true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""))
        .map_err(|e| RagError::bad_input("chat template", e.to_string()))?;
    let ids = tok.encode(&text, false).map_err(|e| RagError::bad_input("prediction prompt", e.to_string()))?.ids;
    Ok(Some(ids))
}

/// Generates the model's answer to `prompt` (greedy, [`max_tokens_for`] `stride`) with a fresh
/// cache charged to `pool`, through `clock`; `None` when it said stop (nothing kept).
pub fn generate(model: &Model, pool: &KvPool, prompt: &[u32], stride: usize, clock: &mut StepClock<'_>) -> Result<Option<Ran>> {
    let params = SamplingParams { max_tokens: max_tokens_for(stride), ..SamplingParams::default() };
    clock.run(model, pool, Request { prompt: prompt.to_vec(), start: None, reused: 0, params, repair: None })
}

/// At most `max` questions from a model's answer (see the module doc), in order, without
/// repeats (case-insensitive).
pub fn parse_questions(text: &str, max: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        if out.len() >= max {
            break;
        }
        let Some(q) = clean(line) else { continue };
        if !out.iter().any(|o| o.eq_ignore_ascii_case(&q)) {
            out.push(q);
        }
    }
    out
}

/// One line as a question, or `None`.
fn clean(line: &str) -> Option<String> {
    let mut s = line.trim();
    // Numbering ("1.", "2)", "Q3:"), bullets, then quotes.
    s = s.trim_start_matches(['-', '*', '•']).trim_start();
    let digits = s.trim_start_matches(|c: char| c.is_ascii_digit() || c == 'Q' || c == 'q');
    if digits.len() < s.len() && digits.starts_with(['.', ')', ':']) {
        s = digits[1..].trim_start();
    }
    s = s.trim_matches(['"', '\'', '“', '”', '`']).trim();
    if !s.ends_with('?') || s.matches('?').count() != 1 {
        return None;
    }
    // One sentence: no sentence end before the question ("Sure. What is …?").
    if s.contains(". ") || s.contains("! ") || s.contains(": ") {
        return None;
    }
    let words = s.split_whitespace().count();
    if !(3..=MAX_WORDS).contains(&words) || s.len() > MAX_CHARS || !s.starts_with(|c: char| c.is_alphabetic()) {
        return None;
    }
    Some(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_keeps_single_questions_once_and_at_most_max() {
        let text = "Sure! Here are some questions:\n1. What's the plan for the meeting?\n2) How many people will be there?\n\
                    3. What's the budget?\n4. What's the budget?\n- \"Who books the bus?\"\nI'm ready. What's next?\n\
                    5. Why?\n6. What is this a very long question that goes on and on and on and on and on and on and on and on \
                    and on and on about nothing?\nWhat? Really?\n7. When is the offsite\n";
        let q = parse_questions(text, 10);
        assert_eq!(
            q,
            vec!["What's the plan for the meeting?", "How many people will be there?", "What's the budget?", "Who books the bus?"]
        );
        assert_eq!(parse_questions(text, 2).len(), 2);
        assert!(parse_questions("def f(x):\n    return x?\n", 5).is_empty(), "code is not a question");
        assert!(parse_questions("", 5).is_empty());
        assert_eq!(parse_questions("Q1: Where is the lunch with Carol?", 5), vec!["Where is the lunch with Carol?"]);
    }

    #[test]
    fn prompts_carry_their_inputs() {
        let k = knowledge_prompt(DocKind::Email, "  Budget review moved to Thursday. ", None, 5);
        assert!(k.contains("from my inbox") && k.contains("\n\nBudget review moved to Thursday.\n\n") && k.contains("Write 5 different"));
        let t = knowledge_prompt(DocKind::Markdown, "Notes.", Some("budget review"), 3);
        assert!(t.contains("a note from my notes about the budget review:") && t.contains("3 different questions about the budget review"));
        assert_eq!(
            readable("From: Alice Moreau <alice@example.com> To: Bob <b@x.org> Date: 2026-03-03T09:15:00Z Subject: Budget  review"),
            "From: Alice Moreau To: Bob Subject: Budget review"
        );
        let h = history_prompt(&["When is the budget review?".into(), "Who comes?".into()], 3);
        assert!(h.contains("1. When is the budget review?\n2. Who comes?\n") && h.contains("Write 3 more"));
        assert_eq!(prompt_text(&Basis::History(vec!["a b c?".into()]), 2), history_prompt(&["a b c?".into()], 2));
    }
}
