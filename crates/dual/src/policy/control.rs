//! [`DualControl`]: the dual-stream policy's messages, sent through the engine's one control
//! path (`Command::Control`, `ContextPolicy::control`) and applied here. A chat turn's setup
//! (the user's anchors, its live facts, the thread's state entry) is one message, applied in
//! that order on the engine thread, so the state entry is always computed on the anchors and
//! facts the same request set.
//!
//! Invariant: a message changes only its own user's stream and threads; the next job of that
//! user sees all of it or (sent after the job) none of it.

use engram_policy::{AdmitRequest, Checkout, ContextPolicy, ControlError, ControlReply, OwnerKey, Readiness};
use engram_tokenizer::Tokenizer;

use super::{DualStream, FactSegment};

/// A message for [`DualStream`]. See the module doc.
#[derive(Clone, Debug, PartialEq)]
pub enum DualControl {
    /// Before a chat turn of `user`: its base anchors ([`DualStream::set_anchors`]), then, when
    /// given, its live facts ([`DualStream::set_facts`]), then, when given, the state entry of
    /// one of its threads (`(thread, tokens)`, empty tokens removing it;
    /// [`DualStream::set_state`]).
    Turn { user: OwnerKey, anchors: Vec<u32>, facts: Option<Vec<FactSegment>>, state: Option<(String, Vec<u32>)> },
    /// `user`'s live facts, in order (a change made through the facts API).
    Facts { user: OwnerKey, facts: Vec<FactSegment> },
}

impl DualStream {
    /// [`ContextPolicy::admit`] for a turn given as token ids (`owner`'s `thread`, `None`:
    /// `"default"`; its new turn `prompt`), as the engine admits it, for a caller that drives
    /// the policy on its own thread: when [`ContextPolicy::prepare`] asks for the user's stream
    /// first, that one job runs here through the engine's step (the job an engine would run;
    /// other background work stays queued for [`engram_engine::drain_background`]).
    pub fn admit_tokens(&mut self, owner: &str, thread: Option<&str>, prompt: &[u32], tok: &Tokenizer) -> Result<Checkout, String> {
        let owner = OwnerKey::parse(owner);
        let req =
            AdmitRequest { owner: &owner, session: thread, text: None, add_special: false, tokens: prompt, tok, long_context_after: None };
        if self.prepare(&req) == Readiness::AfterBackground {
            self.run_stream_job_here(owner.as_str());
        }
        ContextPolicy::admit(self, &req)
    }

    /// Applies `msg`. Facts may leave a summary for the idle hook (the reply wakes it); a state
    /// entry that cannot be set is an error naming its thread (the anchors and facts before it
    /// stay set).
    pub fn apply(&mut self, msg: DualControl) -> Result<ControlReply, ControlError> {
        match msg {
            DualControl::Turn { user, anchors, facts, state } => {
                self.set_anchors(user.as_str(), anchors);
                let reply = match facts {
                    Some(facts) => {
                        self.set_facts(user.as_str(), facts);
                        ControlReply::wake()
                    }
                    None => ControlReply::done(),
                };
                if let Some((thread, tokens)) = state {
                    self.set_state(user.as_str(), &thread, tokens)
                        .map_err(|e| ControlError::Failed(format!("the state entry of thread {thread:?} is not set: {e}")))?;
                }
                Ok(reply)
            }
            DualControl::Facts { user, facts } => {
                self.set_facts(user.as_str(), facts);
                Ok(ControlReply::wake())
            }
        }
    }
}
