//! `Agent` and `Session`: conversations whose KV cache the engine keeps between turns, so each
//! turn prefills only its new message.
//!
//! An agent is the server's agent (`/v1/agents`): registered in `<data>/kv/agents.json`, its
//! turns run under the owner `OwnerKey::agent("default", id)` on its one pinned session, which
//! persists on disk; its conversation is kept in `<data>/agents/<id>.history` (a sealed
//! `engram_kv::envelope` record), so after a restart the next turn's prompt extends the cached
//! one and only the new message is prefilled. A session is the same in RAM only: a named
//! session of the default tenant, gone with the engine.
//!
//! Invariant: a turn joins the history only once its answer is complete; a failed or
//! interrupted turn leaves the history as it was (its computed tokens may stay cached: a later
//! turn reuses only what matches its own prompt).

use std::sync::{Arc, Mutex};

use engram_engine::{Job, OwnerKey};
use engram_server::agent_registry::Agent as Record;
use engram_tokenizer::ChatMessage;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::core::{Core, TENANT};
use crate::errors::{from_api, value, EngramError};
use crate::request::Options;

const HISTORY_MAGIC: &str = "engram-agent-history";
const HISTORY_VERSION: u32 = 1;

/// A conversation's turns and what the last one reused.
#[derive(Default)]
struct Conversation {
    history: Vec<ChatMessage>,
    cached_tokens: usize,
    prompt_tokens: usize,
}

/// Whose cache a conversation's turns use.
enum Owner {
    Agent(Record),
    Session(String),
}

/// The state both kinds share: the engine, the system prompt, the turns.
struct Thread {
    core: Arc<Core>,
    system: Option<String>,
    owner: Owner,
    conv: Mutex<Conversation>,
}

impl Thread {
    /// Runs one user turn: the system prompt, the history and `message` rendered with the chat
    /// template, on the conversation's own session; returns the answer.
    fn turn(&self, py: Python<'_>, method: &str, message: String, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
        let opts = Options::parse(method, kwargs)?;
        let mut messages: Vec<ChatMessage> = self.system.iter().map(|s| ChatMessage::new("system", s.clone())).collect();
        messages.extend(self.conv.lock().unwrap_or_else(|e| e.into_inner()).history.iter().cloned());
        let user = ChatMessage::new("user", message);
        messages.push(user.clone());
        let (text, prompt) = self.core.render(&messages)?;
        let grammar = crate::request::response_format(opts.response_format.clone(), || self.core.grammars())?;
        let params = opts.params(prompt.len(), self.core.context_length(), None, grammar)?;
        let pending = match &self.owner {
            Owner::Agent(record) => {
                let job = Job {
                    session: Some("main".into()),
                    text: Some(text),
                    pinned: true,
                    ..Job::from_tokens(OwnerKey::agent(TENANT, &record.id), prompt, params)
                };
                // Submitted only while the agent is registered (a delete forgets its cache
                // under the same lock: no session is saved for a deleted agent).
                self.core
                    .agents
                    .while_current(TENANT, record, || self.core.submit(job))
                    .ok_or_else(|| EngramError::new_err(format!("no agent {:?} (it was deleted)", record.id)))??
            }
            Owner::Session(id) => {
                self.core.submit(Job { session: Some(id.clone()), text: Some(text), ..Job::from_tokens(TENANT.into(), prompt, params) })?
            }
        };
        let done = pending.collect(py)?;
        let mut conv = self.conv.lock().unwrap_or_else(|e| e.into_inner());
        conv.history.push(user);
        conv.history.push(ChatMessage::new("assistant", done.text.clone()));
        conv.cached_tokens = done.cached_tokens;
        conv.prompt_tokens = done.prompt_tokens;
        if let Owner::Agent(record) = &self.owner {
            save_history(&self.core, &record.id, &conv.history)?;
        }
        Ok(done.text)
    }

    fn history(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let conv = self.conv.lock().unwrap_or_else(|e| e.into_inner());
        crate::convert::to_py(py, &messages_json(&conv.history))
    }
}

fn messages_json(history: &[ChatMessage]) -> serde_json::Value {
    serde_json::Value::Array(history.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect())
}

fn save_history(core: &Core, id: &str, history: &[ChatMessage]) -> PyResult<()> {
    let path = core.history_path(id);
    let body = serde_json::to_vec(&serde_json::json!({"agent": id, "messages": messages_json(history)}))
        .map_err(|e| EngramError::new_err(e.to_string()))?;
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(path.parent().expect("a history file is inside a folder"))?;
        engram_kv::envelope::write_sealed(&path, HISTORY_MAGIC, HISTORY_VERSION, &body)
    };
    write().map_err(|e| EngramError::new_err(format!("saving the agent's conversation to {}: {e}", path.display())))
}

/// The agent's saved conversation; none if there is no file. A file that cannot be trusted is
/// an error naming it (the agent's cache stays; delete the file to start the conversation anew).
fn load_history(core: &Core, id: &str) -> PyResult<Vec<ChatMessage>> {
    let path = core.history_path(id);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(EngramError::new_err(format!("reading {}: {e}", path.display()))),
    };
    let bad = |why: String| EngramError::new_err(format!("{}: {why}", path.display()));
    let body = engram_kv::envelope::open(&bytes, HISTORY_MAGIC, HISTORY_VERSION).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let msgs = v.get("messages").and_then(|m| m.as_array()).ok_or_else(|| bad("no messages".into()))?;
    msgs.iter()
        .map(|m| match (m.get("role").and_then(|r| r.as_str()), m.get("content").and_then(|c| c.as_str())) {
            (Some(r), Some(c)) => Ok(ChatMessage::new(r, c)),
            _ => Err(bad("a message without role or content".into())),
        })
        .collect()
}

/// A named agent whose KV cache persists in the engine's data directory across calls and
/// processes.
#[pyclass(frozen, module = "engram._engram")]
pub struct Agent {
    thread: Thread,
}

impl Agent {
    /// `id`'s agent: created with `system` if new; if it exists, `system` must be `None` or its
    /// own.
    pub fn open(core: Arc<Core>, id: String, system: Option<String>) -> PyResult<Agent> {
        engram_server::check_id("id", &id).map_err(from_api)?;
        let record = match core.agents.get(TENANT, &id) {
            Some(r) if system.is_some() && r.system != system => {
                return Err(value(format!(
                    "agent {id:?} exists with another system prompt; pass system=None to use it, or delete it first"
                )))
            }
            Some(r) => r,
            None => core.agents.create(TENANT, Some(id.clone()), None, system).map_err(from_api)?,
        };
        let history = load_history(&core, &id)?;
        let system = record.system.clone();
        Ok(Agent {
            thread: Thread { core, system, owner: Owner::Agent(record), conv: Mutex::new(Conversation { history, ..Default::default() }) },
        })
    }

    fn record(&self) -> &Record {
        match &self.thread.owner {
            Owner::Agent(r) => r,
            Owner::Session(_) => unreachable!("an Agent's owner is an agent"),
        }
    }
}

#[pymethods]
impl Agent {
    /// Sends `message` as the next user turn and returns the answer's text.
    #[pyo3(signature = (message, **options))]
    fn chat(&self, py: Python<'_>, message: String, options: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
        self.thread.turn(py, "Agent.chat", message, options)
    }

    /// Deletes the agent: its registry entry, its cache (RAM and disk) and its conversation.
    fn delete(&self) -> PyResult<()> {
        let id = self.record().id.clone();
        let handle = self.thread.core.handle()?;
        self.thread.core.agents.remove_then(TENANT, &id, || handle.forget(OwnerKey::agent(TENANT, &id))).map_err(from_api)?;
        match std::fs::remove_file(self.thread.core.history_path(&id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(EngramError::new_err(format!("removing {}: {e}", self.thread.core.history_path(&id).display())))
            }
            _ => {
                self.thread.conv.lock().unwrap_or_else(|e| e.into_inner()).history.clear();
                Ok(())
            }
        }
    }

    /// The agent's id.
    #[getter]
    fn id(&self) -> String {
        self.record().id.clone()
    }

    /// The agent's system prompt.
    #[getter]
    fn system(&self) -> Option<String> {
        self.thread.system.clone()
    }

    /// Prompt tokens the last turn took from the cache (0 before the first turn).
    #[getter]
    fn cached_tokens(&self) -> usize {
        self.thread.conv.lock().unwrap_or_else(|e| e.into_inner()).cached_tokens
    }

    /// The last turn's prompt, in tokens.
    #[getter]
    fn prompt_tokens(&self) -> usize {
        self.thread.conv.lock().unwrap_or_else(|e| e.into_inner()).prompt_tokens
    }

    /// The conversation so far (user and assistant turns, without the system prompt).
    #[getter]
    fn history(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.thread.history(py)
    }

    fn __repr__(&self) -> String {
        format!("Agent(id={:?}, turns={})", self.record().id, self.thread.conv.lock().unwrap_or_else(|e| e.into_inner()).history.len() / 2)
    }
}

/// A conversation whose cache the engine keeps between turns, in RAM only (no registry, no
/// files): gone with the engine.
#[pyclass(frozen, module = "engram._engram")]
pub struct Session {
    thread: Thread,
}

impl Session {
    /// A new session with `system` as its system prompt.
    pub fn new(core: Arc<Core>, system: Option<String>) -> Session {
        let id = engram_server::new_id("session");
        Session { thread: Thread { core, system, owner: Owner::Session(id), conv: Mutex::new(Conversation::default()) } }
    }
}

#[pymethods]
impl Session {
    /// Sends `message` as the next user turn and returns the answer's text.
    #[pyo3(signature = (message, **options))]
    fn chat(&self, py: Python<'_>, message: String, options: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
        self.thread.turn(py, "Session.chat", message, options)
    }

    /// The session's id (its cache's name in the engine).
    #[getter]
    fn id(&self) -> String {
        match &self.thread.owner {
            Owner::Session(id) => id.clone(),
            Owner::Agent(r) => r.id.clone(),
        }
    }

    /// Prompt tokens the last turn took from the cache (0 before the first turn).
    #[getter]
    fn cached_tokens(&self) -> usize {
        self.thread.conv.lock().unwrap_or_else(|e| e.into_inner()).cached_tokens
    }

    /// The conversation so far (user and assistant turns, without the system prompt).
    #[getter]
    fn history(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.thread.history(py)
    }
}
