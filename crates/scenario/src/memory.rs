//! An agent's working memory as text: the conversation it has seen, from its own point of
//! view, across every phase it took part in.
//!
//! Invariant: the log is append-only, so each prompt the agent is given starts with
//! exactly the previous prompt and the agent's answer to it — the EXTEND path of the
//! agent's cache. What others say reaches it only through [`Memory::hear`], and only when it
//! takes part in the phase where it was said.

use engram_tokenizer::ChatMessage;

/// One agent's conversation so far, plus what it has heard since it last spoke.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    said_and_heard: Vec<ChatMessage>,
    unheard: Vec<String>,
}

impl Memory {
    /// Queues `text` (a phase opening, others' lines) for the agent's next turn.
    pub fn hear(&mut self, text: impl Into<String>) {
        let text = text.into();
        if !text.is_empty() {
            self.unheard.push(text);
        }
    }

    /// The conversation the agent answers now: everything so far, then one user message with
    /// what it heard since its last turn ("Continue." if nothing). That message joins the log.
    pub fn prompt(&mut self) -> Vec<ChatMessage> {
        let heard = if self.unheard.is_empty() { "Continue.".to_string() } else { self.unheard.join("\n\n") };
        self.unheard.clear();
        self.said_and_heard.push(ChatMessage::new("user", heard));
        self.said_and_heard.clone()
    }

    /// Records the agent's answer to the last [`Memory::prompt`].
    pub fn said(&mut self, text: &str) {
        self.said_and_heard.push(ChatMessage::new("assistant", text.to_string()));
    }
}
