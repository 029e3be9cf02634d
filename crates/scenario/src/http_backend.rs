//! Turns run by a server through its agents API: each agent is a server agent
//! (`POST /v1/agents`) whose id is its [`AgentKey`]; a turn is
//! `POST /v1/agents/{id}/generate` with the agent's messages, and a round's turns are sent
//! at once (a thread each) so the server's scheduler batches them.
//!
//! Invariant: the runner's state is all on this side, the agents' caches all on the
//! server's: a server restarted between phases (agents and pinned sessions persisted) is
//! waited for and the run goes on warm. A connection refused is retried for
//! [`HttpBackend::reconnect_for`]; an HTTP error is not retried.
//!
//! NOTE: the agents API does not stream, so `ttft` is unknown here (`None`); `total` is the
//! request's round trip.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::backend::{AgentKey, Backend, Turn, TurnOutcome};

/// A server's agents API. See the module doc.
pub struct HttpBackend {
    base: String,
    http: ureq::Agent,
    /// How long a refused connection is retried (a server restarting).
    pub reconnect_for: Duration,
}

impl HttpBackend {
    /// A client for the server at `base` (`http://127.0.0.1:8080`).
    pub fn new(base: &str) -> HttpBackend {
        let http = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(3600))).build().into();
        HttpBackend { base: base.trim_end_matches('/').to_string(), http, reconnect_for: Duration::from_secs(120) }
    }

    /// Sends one request, retrying refused connections; (status, JSON body).
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.base);
        let deadline = Instant::now() + self.reconnect_for;
        loop {
            let sent = match (method, body) {
                ("POST", Some(b)) => self.http.post(&url).header("content-type", "application/json").send(b.to_string()),
                ("DELETE", _) => self.http.delete(&url).call(),
                _ => self.http.get(&url).call(),
            };
            match sent {
                Ok(mut r) => {
                    let status = r.status().as_u16();
                    let text = r.body_mut().read_to_string().map_err(|e| format!("{method} {url}: {e}"))?;
                    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
                    return Ok((status, v));
                }
                Err(ureq::Error::Io(_) | ureq::Error::ConnectionFailed) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err(format!("{method} {url}: {e}")),
            }
        }
    }

    fn generate(&self, turn: &Turn, max_tokens: usize) -> Result<TurnOutcome, String> {
        let body = json!({"messages": turn.messages, "max_tokens": max_tokens, "temperature": 0});
        let at = Instant::now();
        let (status, v) = self.call("POST", &format!("/v1/agents/{}/generate", turn.agent.key), Some(&body))?;
        if status != 200 {
            return Err(format!("agent {}: HTTP {status}: {v}", turn.agent.key));
        }
        let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0) as usize;
        Ok(TurnOutcome {
            text: v["text"].as_str().unwrap_or_default().to_string(),
            prompt_text: String::new(),
            prompt_tokens: n("/usage/prompt_tokens"),
            cached_tokens: n("/usage/prompt_tokens_details/cached_tokens"),
            completion_tokens: n("/usage/completion_tokens"),
            ttft: None,
            total: at.elapsed(),
        })
    }
}

impl Backend for HttpBackend {
    fn register(&mut self, agent: &AgentKey, name: &str, system: Option<&str>) -> Result<(), String> {
        let body = json!({"id": agent.key, "name": name, "system": system});
        match self.call("POST", "/v1/agents", Some(&body))? {
            (201, _) => Ok(()),
            // A permanent agent from an earlier run (or before a restart): its cache is kept.
            (409, _) if agent.permanent => Ok(()),
            (s, v) => Err(format!("creating agent {}: HTTP {s}: {v}", agent.key)),
        }
    }

    fn run_round(&mut self, turns: &[Turn], max_tokens: usize) -> Result<Vec<TurnOutcome>, String> {
        let this = &*self;
        std::thread::scope(|s| {
            let handles: Vec<_> = turns.iter().map(|t| s.spawn(move || this.generate(t, max_tokens))).collect();
            handles.into_iter().map(|h| h.join().map_err(|_| "a request thread panicked".to_string())?).collect()
        })
    }

    fn release(&mut self, agent: &AgentKey) -> Result<(), String> {
        match self.call("DELETE", &format!("/v1/agents/{}", agent.key), None)? {
            (200 | 404, _) => Ok(()),
            (s, v) => Err(format!("deleting agent {}: HTTP {s}: {v}", agent.key)),
        }
    }

    fn restart(&mut self) -> Result<(), String> {
        Err("a remote server restarts on its own; the run waits for it".into())
    }
}
