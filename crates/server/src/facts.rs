//! `/v1/users/{id}/facts` (`--context dual` only; kept across restarts): a user's facts,
//! appended to the persistent stream every thread of that user attends.
//!
//! ```text
//!  POST   /v1/users/{id}/facts            {"text"}               → 201 the fact ({"id", ...})
//!  POST   /v1/users/{id}/facts            {"text", "replaces"}   → 201; the old fact tombstoned
//!  GET    /v1/users/{id}/facts                                   → {"data": [facts, tombstones shown]}
//!  DELETE /v1/users/{id}/facts/{fact_id}                         → the fact tombstoned
//!  DELETE /v1/users/{id}/facts                                   → the user's whole log forgotten
//! ```
//! A user is scoped to the API key's account exactly as a chat request's `user` is (owner
//! `<tenant>␟user:<id>`). A fact enters the stream as its own system message, rendered by the
//! chat template (`Fact about the user: <text>`), tokenized alone: its tokens are a segment
//! of the stream (`engram_dual::PersistentStream`) that can be masked without touching the
//! others. The log is kept by `engram_dual::FactStore` (under `<session dir>/facts/` when
//! the server persists sessions). With `--kv-remote` every change is also queued to the tier
//! and every request first takes the tier's newer version of the user's log
//! (`dual_sync.rs`), so a user's facts follow them to any replica.
//!
//! Invariants: a change reaches the engine (`DualControl::Facts`) under the store's lock, in
//! the order the changes were made, and a chat request sends the newest list it can see, so the
//! engine never goes back to an older list; a refused request (empty text, a fact over the
//! persistent cap on its own, an unknown or tombstoned `replaces`, an unknown user) changes
//! nothing stored (`tests/it/facts.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use engram_dual::{DualControl, FactSegment};
use engram_dual::{Fact, FactError, FactLimits, FactStore};
use engram_engine::PolicyControl;
use engram_model::Model;
use serde::Deserialize;
use serde_json::json;

use crate::api;
use crate::dual_sync::DualSync;
use crate::error::ApiError;
use crate::AppState;

pub use engram_dual::{FACT_PREFIX, SUMMARY_PREFIX};

/// The facts of every user, and each user's rendered segments as last sent to the engine.
pub(crate) struct Facts {
    store: FactStore,
    segments: Mutex<HashMap<String, Vec<FactSegment>>>,
    /// With a remote tier: logs and state entries shared with the other replicas.
    sync: Option<DualSync>,
}

impl Facts {
    /// Facts under `dir` (or in memory), bounded by `limits`, shared through `remote` if given.
    pub fn new(dir: Option<&std::path::Path>, limits: FactLimits, remote: Option<engram_remote::RemoteTier>) -> Facts {
        let store = match dir {
            Some(d) => FactStore::open(d, limits),
            None => FactStore::in_memory(limits),
        };
        Facts { store, segments: Mutex::new(HashMap::new()), sync: remote.map(DualSync::new) }
    }

    /// Before a turn of `owner`'s `thread`: with a remote tier, takes the tier's newer log of
    /// `owner` (sent to the engine) and returns the thread's state entry to set — the
    /// request's own `state` (queued to the tier as the newest), else the tier's if newer than
    /// the one set here (its text and tokens; one that does not fit this replica is skipped).
    pub fn sync_turn(
        &self,
        s: &AppState,
        tenant: &str,
        owner: &str,
        thread: &str,
        state: Option<(&str, Vec<u32>)>,
    ) -> Result<Option<Vec<u32>>, ApiError> {
        let Some(sync) = &self.sync else { return Ok(state.map(|(_, tokens)| tokens)) };
        let pulled = sync.pull(tenant, owner, Some(thread));
        if let Some(log) = pulled.facts {
            self.import(s, owner, log)?;
        }
        let seen = pulled.state.as_ref().map(|(_, stamp)| *stamp);
        if let Some((text, tokens)) = state {
            sync.push_state(tenant, owner, thread, text, seen);
            return Ok(Some(tokens));
        }
        let Some((text, stamp)) = pulled.state else { return Ok(None) };
        let tokens = if text.is_empty() {
            Vec::new()
        } else {
            match crate::dual::state_tokens(s, &text) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!("a thread's state entry from the remote tier does not fit here: {}; ignored", e.message);
                    return Ok(None);
                }
            }
        };
        Ok(sync.take_newer_state(owner, thread, stamp).then_some(tokens))
    }

    /// With a remote tier: takes the tier's log of `owner` if newer than this replica's.
    fn pull(&self, s: &AppState, tenant: &str, owner: &str) -> Result<(), ApiError> {
        let Some(sync) = &self.sync else { return Ok(()) };
        match sync.pull(tenant, owner, None).facts {
            Some(log) => self.import(s, owner, log),
            None => Ok(()),
        }
    }

    /// Makes `log` `owner`'s if newer, and sends its live facts to the engine.
    fn import(&self, s: &AppState, owner: &str, log: engram_dual::FactLog) -> Result<(), ApiError> {
        let mut published = Ok(());
        let imported = self.store.import(owner, log, |live| match segments(&s.model, live) {
            Ok(segs) => self.publish(s, owner, segs),
            Err(e) => published = Err(e),
        });
        if let Err(e) = imported {
            tracing::warn!("a fact log from the remote tier was not taken: {e}");
        }
        published
    }

    /// With a remote tier: queues `owner`'s log as it is now.
    fn push(&self, tenant: &str, owner: &str) {
        if let (Some(sync), Some(log)) = (&self.sync, self.store.export(owner)) {
            sync.push_facts(tenant, owner, &log);
        }
    }

    /// Sends a chat turn's setup to the engine before its job, as one message: `owner`'s
    /// anchors, its live facts (the newest list this store has sent, so the engine never goes
    /// back to an older one), then the thread's state entry if one is given.
    pub fn send_turn(&self, s: &AppState, owner: &str, anchors: Vec<u32>, state: Option<(String, Vec<u32>)>) -> Result<(), ApiError> {
        let known = self.segments.lock().unwrap_or_else(|e| e.into_inner()).contains_key(owner);
        let fresh = if known { None } else { Some(segments(&s.model, &self.store.live(owner))?) };
        let mut cache = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        // A change made meanwhile put its newer list here first: keep it.
        let list = cache.entry(owner.to_string()).or_insert_with(|| fresh.unwrap_or_default()).clone();
        // Sent under the lock, so a change published meanwhile reaches the engine after it.
        s.engine.control(PolicyControl::new(DualControl::Turn { user: owner.into(), anchors, facts: Some(list), state }));
        Ok(())
    }

    /// Records and sends `owner`'s new live facts (called under the store's lock).
    fn publish(&self, s: &AppState, owner: &str, live: Vec<FactSegment>) {
        let mut cache = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        cache.insert(owner.to_string(), live.clone());
        s.engine.control(PolicyControl::new(DualControl::Facts { user: owner.into(), facts: live }));
    }
}

/// The system message a fact (or a summary) becomes, rendered after whatever precedes it: the
/// template's text for that message alone, tokenized alone (`engram_dual::segment_tokens`).
pub(crate) fn render_segment(model: &Model, content: &str) -> Result<Vec<u32>, ApiError> {
    Ok(engram_dual::segment_tokens(&model.tokenizer, content)?)
}

/// The engine's segments for `live` facts.
fn segments(model: &Model, live: &[Fact]) -> Result<Vec<FactSegment>, ApiError> {
    live.iter()
        .map(|f| {
            let tokens = render_segment(model, &format!("{FACT_PREFIX}{}", f.text))?;
            Ok(FactSegment { id: f.id, text: f.text.clone(), tokens })
        })
        .collect()
}

/// The facts of a server in `--context dual`, or a 404 saying facts need it.
fn facts(s: &AppState) -> Result<&Facts, ApiError> {
    s.facts.as_ref().ok_or_else(|| {
        ApiError::not_found("user facts belong to the dual-stream contexts; start the server with `engram serve --context dual`")
    })
}

/// The request's tenant and `user`'s owner key.
fn owner(s: &AppState, headers: &HeaderMap, user: &str) -> Result<(String, String), ApiError> {
    let tenant = api::tenant(s, headers)?;
    api::check_id("user", user)?;
    let owner = crate::dual::owner(&tenant, user);
    Ok((tenant, owner))
}

fn to_api(e: FactError) -> ApiError {
    match e {
        FactError::Empty | FactError::TooLong { .. } => ApiError::bad_param("text", e.to_string()),
        FactError::UnknownFact(_) | FactError::UnknownOwner => ApiError::not_found(e.to_string()),
        FactError::Tombstoned(_) => ApiError::conflict(e.to_string()),
        FactError::Full { .. } => {
            ApiError { status: StatusCode::INSUFFICIENT_STORAGE, code: Some("facts_full"), ..ApiError::bad_request(e.to_string()) }
        }
        FactError::Io(_) => ApiError::internal(e.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddRequest {
    text: String,
    replaces: Option<u64>,
}

/// `POST /v1/users/{id}/facts`.
pub(crate) async fn add(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(user): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    facts(&s)?;
    let (tenant, owner) = owner(&s, &headers, &user)?;
    let req: AddRequest = api::parse(&body)?;
    let state = s.clone();
    let fact = api::off_runtime(move || {
        let f = facts(&state)?;
        f.store.check_text(&req.text).map_err(to_api)?;
        f.pull(&state, &tenant, &owner)?;
        let tokens = render_segment(&state.model, &format!("{FACT_PREFIX}{}", req.text))?;
        let cap = state.config.context.persistent_cap();
        if tokens.len() > cap {
            return Err(ApiError::bad_param(
                "text",
                format!("the fact is {} tokens on its own; the persistent stream's cap is {cap} tokens", tokens.len()),
            ));
        }
        let mut published = Ok(());
        let fact = f
            .store
            .append(&owner, &req.text, req.replaces, |live| match segments(&state.model, live) {
                Ok(segs) => f.publish(&state, &owner, segs),
                Err(e) => published = Err(e),
            })
            .map_err(to_api)?;
        published?;
        f.push(&tenant, &owner);
        Ok(fact)
    })
    .await?;
    Ok((StatusCode::CREATED, axum::Json(json!({"object": "fact", "user": user, "fact": fact, "id": fact.id}))).into_response())
}

/// `GET /v1/users/{id}/facts`.
pub(crate) async fn list(State(s): State<AppState>, headers: HeaderMap, Path(user): Path<String>) -> Result<Response, ApiError> {
    facts(&s)?;
    let (tenant, owner) = owner(&s, &headers, &user)?;
    let state = s.clone();
    let data = api::off_runtime(move || {
        let f = facts(&state)?;
        f.pull(&state, &tenant, &owner)?;
        Ok(f.store.list(&owner))
    })
    .await?
    .ok_or_else(|| ApiError::not_found(format!("user {user:?} has no facts")))?;
    let live = data.iter().filter(|f| !f.tombstoned).count();
    Ok(axum::Json(json!({"object": "list", "user": user, "live": live, "data": data})).into_response())
}

/// `DELETE /v1/users/{id}/facts/{fact_id}`: tombstones one fact.
pub(crate) async fn delete_one(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path((user, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    facts(&s)?;
    let (tenant, owner) = owner(&s, &headers, &user)?;
    let id: u64 = id.parse().map_err(|_| ApiError::bad_param("fact_id", format!("fact ids are numbers, got {id:?}")))?;
    let state = s.clone();
    api::off_runtime(move || {
        let f = facts(&state)?;
        f.pull(&state, &tenant, &owner)?;
        let mut published = Ok(());
        f.store
            .tombstone(&owner, id, |live| match segments(&state.model, live) {
                Ok(segs) => f.publish(&state, &owner, segs),
                Err(e) => published = Err(e),
            })
            .map_err(to_api)?;
        f.push(&tenant, &owner);
        published
    })
    .await?;
    Ok(axum::Json(json!({"object": "fact", "id": id, "tombstoned": true})).into_response())
}

/// `DELETE /v1/users/{id}/facts`: forgets the user's whole log.
pub(crate) async fn delete_all(State(s): State<AppState>, headers: HeaderMap, Path(user): Path<String>) -> Result<Response, ApiError> {
    facts(&s)?;
    let (tenant, owner) = owner(&s, &headers, &user)?;
    let state = s.clone();
    api::off_runtime(move || {
        let f = facts(&state)?;
        f.pull(&state, &tenant, &owner)?;
        f.store.clear(&owner, |_| f.publish(&state, &owner, Vec::new())).map_err(to_api)?;
        f.push(&tenant, &owner);
        Ok(())
    })
    .await?;
    Ok(axum::Json(json!({"object": "list", "user": user, "deleted": true})).into_response())
}

/// The summarizer's output rendered as the main model's segment (`engram_dual::Summarizer`).
pub(crate) fn summary_renderer(model: Arc<Model>) -> engram_dual::RenderSegment {
    Arc::new(move |text: &str| render_segment(&model, &format!("{SUMMARY_PREFIX}{text}")).map_err(|e| e.message))
}
