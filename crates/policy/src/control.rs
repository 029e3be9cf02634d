//! [`PolicyControl`]: a message only some policy understands (a dual-stream user's anchors and
//! facts, a thread's state entry), carried through the engine as an opaque value of the
//! policy's own type. The engine has one command for all of them; each policy takes the
//! messages of its types ([`PolicyControl::take`]) and hands the rest on, and the last one
//! refuses ([`PolicyControl::refuse`]) with an error that names the message.
//!
//! Invariant: a message reaches at most one policy, the first in the stack that takes its type;
//! messages sent one after another are applied in that order.

use std::any::Any;
use std::fmt;

/// A policy-specific message. See the module doc.
pub struct PolicyControl {
    msg: Box<dyn Any + Send>,
    type_name: &'static str,
}

impl PolicyControl {
    /// Wraps `msg`, a policy's own message type.
    pub fn new<M: Any + Send>(msg: M) -> PolicyControl {
        PolicyControl { msg: Box::new(msg), type_name: std::any::type_name::<M>() }
    }

    /// Whether it carries an `M`.
    pub fn is<M: Any>(&self) -> bool {
        self.msg.is::<M>()
    }

    /// The message as an `M`, or handed back whole when it is another type.
    pub fn take<M: Any>(self) -> Result<M, PolicyControl> {
        let type_name = self.type_name;
        match self.msg.downcast::<M>() {
            Ok(m) => Ok(*m),
            Err(msg) => Err(PolicyControl { msg, type_name }),
        }
    }

    /// The Rust type name of the message (for errors and logs).
    pub fn type_name(&self) -> &'static str {
        self.type_name
    }

    /// What a policy that does not take the message answers when nothing is below it.
    pub fn refuse(self) -> ControlError {
        ControlError::NotAccepted { message: self.type_name }
    }
}

impl fmt::Debug for PolicyControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PolicyControl({})", self.type_name)
    }
}

/// What a policy that applied a message answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlReply {
    /// The message may have left background work (the engine runs its idle hook).
    pub wake: bool,
}

impl ControlReply {
    /// Applied; nothing new to do in the background.
    pub fn done() -> ControlReply {
        ControlReply { wake: false }
    }

    /// Applied; background work may be due.
    pub fn wake() -> ControlReply {
        ControlReply { wake: true }
    }
}

/// Why a message was not applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlError {
    /// No policy in the stack takes messages of this type (e.g. a dual-stream message sent
    /// to an engine running the session store).
    NotAccepted { message: &'static str },
    /// The policy that took it could not apply it.
    Failed(String),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::NotAccepted { message } => {
                write!(f, "no context policy of this engine takes {message} messages (is the policy that defines them configured?)")
            }
            ControlError::Failed(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for ControlError {}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mine(u32);

    #[test]
    fn a_message_is_taken_by_its_type_and_refused_by_name() {
        let m = PolicyControl::new(Mine(3));
        assert!(m.is::<Mine>());
        let m = m.take::<String>().unwrap_err();
        assert_eq!(m.take::<Mine>().unwrap().0, 3);
        let e = PolicyControl::new(Mine(1)).refuse();
        assert!(e.to_string().contains("Mine"), "{e}");
    }
}
