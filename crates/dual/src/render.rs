//! How a conversation becomes the dual-stream policy's token pieces, for every front end that
//! speaks to it (the server's chat routes, `engram chat --context dual`): a user's anchors, a
//! thread's new turn rendered alone, and a fact's (or a summary's) segment.
//!
//! ```text
//!  messages: [system…] [earlier turns…] [user: new message]
//!             │                           │
//!             anchors (the system part ───┘ the new turn: the template's text for it after
//!             rendered, tokenized)            the system part, after the closing of the
//!                                             previous answer when there was one
//!  fact:      the template's text for one system message `FACT_PREFIX + text`, alone
//! ```
//! Invariant: a turn's text is exactly what the chat template renders for it after the system
//! messages (and after the previous answer's closing), so a ring of such turns holds what a
//! full render of the kept turns would; a segment's text is what the template writes for that
//! one system message after whatever precedes it.

use engram_tokenizer::{ChatMessage, ChatTemplate, Tokenizer, TokenizerError};

/// How a fact's text is introduced in its system message.
pub const FACT_PREFIX: &str = "Fact about the user: ";
/// How a summary of the facts is introduced in its system message.
pub const SUMMARY_PREFIX: &str = "Facts about the user, summarized: ";

/// One chat turn's place in the dual-stream contexts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnTokens {
    /// The system messages rendered and tokenized: the user's anchors (empty when the template
    /// does not render the system part as a prefix of the turn).
    pub anchors: Vec<u32>,
    /// The new turn's tokens.
    pub turn: Vec<u32>,
}

/// The anchors and the new turn of `messages`, rendered by `tpl` with `tok`'s BOS/EOS. The
/// last message is the user's new turn (the caller checks its role; with no message after the
/// system part the turn is empty); the earlier non-system messages only decide whether the
/// previous answer's closing comes first (the ring already holds their tokens).
pub fn turn_tokens(tok: &Tokenizer, tpl: &ChatTemplate, messages: &[ChatMessage]) -> Result<TurnTokens, TokenizerError> {
    let (bos, eos) = (tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""));
    let system: Vec<ChatMessage> = messages.iter().take_while(|m| m.role == "system").cloned().collect();
    let Some(last) = messages.last().filter(|_| messages.len() > system.len()) else {
        return Ok(TurnTokens { anchors: encode(tok, &tpl.render(&system, false, bos, eos)?)?, turn: Vec::new() });
    };
    // Without system messages the base is what the template writes before any (its BOS), so
    // a user's facts follow it as they would follow a system prompt.
    let base = tpl.render(&system, false, bos, eos)?;
    let mut with_turn = system.clone();
    with_turn.push(last.clone());
    let full = tpl.render(&with_turn, true, bos, eos)?;
    // A template that does not render the system part as a prefix: no anchors, the turn whole.
    let (base, rest) = match full.strip_prefix(base.as_str()) {
        Some(rest) => (base.clone(), rest.to_string()),
        None => (String::new(), full.clone()),
    };
    let earlier = &messages[system.len()..messages.len() - 1];
    let text = if earlier.iter().any(|m| m.role == "assistant") { answer_closing(tok, tpl)? + &rest } else { rest };
    Ok(TurnTokens { anchors: encode(tok, &base)?, turn: tok.encode(&text, false)?.ids })
}

/// The tokens of the system message `content` as the template writes it after whatever
/// precedes it (a fact, a summary, a state entry), tokenized alone; a line of its own when the
/// model has no chat template.
pub fn segment_tokens(tok: &Tokenizer, content: &str) -> Result<Vec<u32>, TokenizerError> {
    let text = match tok.chat_template() {
        Some(tpl) => {
            let (bos, eos) = (tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""));
            let before = tpl.render(&[], false, bos, eos)?;
            let with = tpl.render(&[ChatMessage::new("system", content)], false, bos, eos)?;
            match with.strip_prefix(before.as_str()) {
                Some(rest) => rest.to_string(),
                None => format!("{content}\n"),
            }
        }
        None => format!("{content}\n"),
    };
    Ok(tok.encode(&text, false)?.ids)
}

/// What the chat template writes after an assistant message's text (its end-of-turn marker),
/// which the ring's previous turn lacks: the answer ended at its stop token, never fed.
fn answer_closing(tok: &Tokenizer, tpl: &ChatTemplate) -> Result<String, TokenizerError> {
    let probe = [ChatMessage::new("user", "x"), ChatMessage::new("assistant", "\u{1}")];
    let text = tpl.render(&probe, false, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""))?;
    Ok(text.rsplit_once('\u{1}').map(|(_, after)| after.to_string()).unwrap_or_default())
}

/// `text`'s tokens, none for an empty text.
fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, TokenizerError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    Ok(tok.encode(text, false)?.ids)
}
