//! The agent registry: the agents of every tenant (id, name, system prompt),
//! in memory and — when the server persists sessions — in
//! `<session dir>/agents.json`, so that agents, like their cached sessions,
//! survive a restart.
//!
//! Invariants: a create or delete that reports success is on disk (written
//! atomically: temp file, fsync, rename) before the caller answers; one that
//! cannot be saved changes nothing. A registry file that cannot be trusted
//! (unreadable, not JSON, another format or version, an invalid or repeated
//! id, over [`MAX_FILE_BYTES`]) is moved aside to `agents.json.bad-<unix
//! time>` — kept for the user, never half-used — and the server starts with no
//! agents. A change that would make the file larger than [`MAX_FILE_BYTES`] is refused
//! (507), so the registry never grows past what a restart reloads; one tenant has at most
//! [`MAX_AGENTS_PER_TENANT`] agents, with names and system prompts within
//! [`MAX_NAME_BYTES`] and [`MAX_SYSTEM_BYTES`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::api;
use crate::error::ApiError;

/// The registry file's name inside the session directory.
pub const FILE_NAME: &str = "agents.json";
/// Larger registry files are not read (a registry of thousands of agents with
/// long system prompts is a few MiB).
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// Most agents one tenant may have.
pub const MAX_AGENTS_PER_TENANT: usize = 1024;
/// Longest agent name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest agent system prompt, in bytes.
pub const MAX_SYSTEM_BYTES: usize = 32 << 10;
const FORMAT: &str = "engram-agents";
const VERSION: u32 = 1;

/// One agent, as the API shows it and the file stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    pub id: String,
    #[serde(skip_deserializing, default = "agent_object")]
    pub object: &'static str,
    pub name: Option<String>,
    pub system: Option<String>,
    pub created_at: u64,
}

fn agent_object() -> &'static str {
    "agent"
}

/// The file: every tenant's agents (by id) and the counter for generated ids.
#[derive(Serialize, Deserialize)]
struct RegistryFile {
    format: String,
    version: u32,
    next: u64,
    tenants: BTreeMap<String, Vec<Agent>>,
}

#[derive(Clone, Default)]
struct Registry {
    by_tenant: HashMap<String, BTreeMap<String, Agent>>,
    /// Kept in the file for readers of version 1 (ids were `agent-<next>`); new ids are random.
    next: u64,
}

/// Agents of every tenant, saved to `file` (if any) on every change, and to the remote tier
/// (if any) behind it, so that another replica finds them.
pub struct Agents {
    registry: Mutex<Registry>,
    file: Option<PathBuf>,
    /// Largest registry file a change may produce ([`MAX_FILE_BYTES`]; smaller in tests).
    max_bytes: u64,
    /// The tier a fleet shares: creates and deletes are written there; an agent not known
    /// here is looked up there, and one known here is checked there when used.
    remote: Option<engram_remote::RemoteTier>,
    /// Forgets the cache of `(tenant, id)`: run for an agent another replica deleted.
    forget: Option<Forget>,
}

/// How the registry forgets a deleted agent's cache (the engine's `forget` of its owner key).
pub type Forget = Box<dyn Fn(&str, &str) + Send + Sync>;

/// The record kind of agents in the remote tier.
const REMOTE_KIND: &str = "agent";

impl Agents {
    /// A registry kept in memory only (the server does not persist sessions).
    pub fn in_memory() -> Agents {
        Agents { registry: Mutex::new(Registry::default()), file: None, max_bytes: MAX_FILE_BYTES, remote: None, forget: None }
    }

    /// The registry saved in `dir` (created on the first save), loaded if the
    /// file exists; a file that cannot be trusted is moved aside with a warning.
    pub fn open(dir: &Path) -> Agents {
        let file = dir.join(FILE_NAME);
        let registry = match load(&file) {
            Ok(r) => {
                let n: usize = r.by_tenant.values().map(BTreeMap::len).sum();
                if n > 0 {
                    tracing::info!("{n} agents restored from {}", file.display());
                }
                r
            }
            Err(why) => {
                let aside = dir.join(format!("{FILE_NAME}.bad-{}", api::now_s()));
                match std::fs::rename(&file, &aside) {
                    Ok(()) => tracing::warn!("{}: {why}; moved to {} and starting with no agents", file.display(), aside.display()),
                    Err(e) => tracing::warn!("{}: {why}; could not move it aside ({e}); starting with no agents", file.display()),
                }
                Registry::default()
            }
        };
        Agents { registry: Mutex::new(registry), file: Some(file), max_bytes: MAX_FILE_BYTES, remote: None, forget: None }
    }

    /// Shares agents through the remote tier: every create and delete is also written there
    /// (behind the caller; a delete leaves a tombstone), and [`Agents::get`] looks there for an
    /// agent it does not know (created on another replica), keeping what it finds, and checks
    /// an agent it knows (one round trip): deleted on another replica, it is removed here too
    /// and `forget` drops its cache; written anew there, the tier's definition is taken.
    /// [`Agents::list`] adds the agents the tier's index names and drops the ones known here
    /// that the tier has tombstones of.
    pub fn with_remote(mut self, remote: engram_remote::RemoteTier, forget: Forget) -> Agents {
        self.remote = Some(remote);
        self.forget = Some(forget);
        self
    }

    /// Applies `change` and saves; if saving fails the registry is left as it
    /// was and the error is returned.
    fn update<R>(&self, change: impl FnOnce(&mut Registry) -> Result<R, ApiError>) -> Result<R, ApiError> {
        self.update_then(change, || {})
    }

    /// [`Agents::update`], then `then` once the change is made, before any other
    /// change or [`Agents::while_current`] can run.
    fn update_then<R>(&self, change: impl FnOnce(&mut Registry) -> Result<R, ApiError>, then: impl FnOnce()) -> Result<R, ApiError> {
        let mut current = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = current.clone();
        let out = change(&mut next)?;
        let bytes = encode(&next).map_err(|e| ApiError::internal(format!("the agent registry could not be encoded: {e}")))?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(ApiError {
                status: axum::http::StatusCode::INSUFFICIENT_STORAGE,
                code: Some("agent_registry_full"),
                ..ApiError::bad_request(format!(
                    "the agent registry would grow past {} bytes, more than a restart reloads; delete agents first",
                    self.max_bytes
                ))
            });
        }
        if let Some(file) = &self.file {
            // The path goes to the log, not to the client: a path names the server's files.
            save(file, &bytes).map_err(|e| {
                tracing::error!("the agent registry could not be saved to {}: {e}", file.display());
                ApiError::internal(format!("the agent registry could not be saved ({})", e.kind()))
            })?;
        }
        *current = next;
        then();
        Ok(out)
    }

    /// Runs `then` if `tenant`'s agent `agent.id` is still `agent` (neither deleted nor
    /// deleted and created anew since it was read), with no create or delete running
    /// meanwhile; `None` if it is not. With [`Agents::remove_then`] this orders a
    /// generate's submit against a delete's forget: no session is checked in for a deleted agent.
    pub fn while_current<R>(&self, tenant: &str, agent: &Agent, then: impl FnOnce() -> R) -> Option<R> {
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let current = r.by_tenant.get(tenant).and_then(|a| a.get(&agent.id));
        (current == Some(agent)).then(then)
    }

    /// Adds an agent for `tenant`: `id` if given (409 if taken), else the next
    /// free `agent-N`.
    pub fn create(&self, tenant: &str, id: Option<String>, name: Option<String>, system: Option<String>) -> Result<Agent, ApiError> {
        for (param, value, most) in [("name", &name, MAX_NAME_BYTES), ("system", &system, MAX_SYSTEM_BYTES)] {
            if let Some(v) = value.as_ref().filter(|v| v.len() > most) {
                return Err(ApiError::bad_param(param, format!("{param} is {} bytes; at most {most}", v.len())));
            }
        }
        // An id another replica created is taken too (a 409 below once it is known here).
        if let Some(id) = &id {
            let _ = self.get(tenant, id);
        }
        let agent = self.create_here(tenant, id, name, system)?;
        if let Some(r) = &self.remote {
            r.put_record(tenant, REMOTE_KIND, &agent.id, serde_json::to_string(&agent).expect("an agent serializes"));
        }
        Ok(agent)
    }

    fn create_here(&self, tenant: &str, id: Option<String>, name: Option<String>, system: Option<String>) -> Result<Agent, ApiError> {
        self.update(|r| {
            if r.by_tenant.get(tenant).is_some_and(|a| a.len() >= MAX_AGENTS_PER_TENANT) {
                return Err(ApiError::conflict(format!(
                    "this tenant has {MAX_AGENTS_PER_TENANT} agents, the most one tenant may have; delete one first"
                )));
            }
            let id = match id {
                Some(id) => id,
                // Random, not `agent-<count>`: a count would tell a tenant how many agents
                // other tenants made. (`next` stays in the file for older readers.)
                None => loop {
                    let id = api::new_id("agent");
                    if !r.by_tenant.get(tenant).is_some_and(|a| a.contains_key(&id)) {
                        break id;
                    }
                },
            };
            let mine = r.by_tenant.entry(tenant.to_string()).or_default();
            if mine.contains_key(&id) {
                return Err(ApiError::conflict(format!("agent {id:?} already exists")));
            }
            let agent = Agent { id: id.clone(), object: "agent", name, system, created_at: api::now_s() };
            mine.insert(id, agent.clone());
            Ok(agent)
        })
    }

    /// `tenant`'s agents, by id: those known here and (with a remote tier) those other
    /// replicas created, found in the tier's index and kept here.
    pub fn list(&self, tenant: &str) -> Vec<Agent> {
        if let Some(names) = self.remote.as_ref().and_then(|r| r.record_names(tenant, REMOTE_KIND, MAX_AGENTS_PER_TENANT)) {
            let (unknown, unindexed): (Vec<String>, Vec<Agent>) = {
                let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
                let mine = r.by_tenant.get(tenant);
                let unknown = names.iter().filter(|n| !mine.is_some_and(|a| a.contains_key(*n))).cloned().collect();
                let unindexed = mine.map(|a| a.values().filter(|a| !names.contains(&a.id)).cloned().collect()).unwrap_or_default();
                (unknown, unindexed)
            };
            for id in unknown {
                self.adopt_remote(tenant, &id);
            }
            // Known here but not in the index: deleted elsewhere if the tier has a tombstone
            // (one pipelined trip), else kept (the store may have lost its index).
            let ids: Vec<&str> = unindexed.iter().map(|a| a.id.as_str()).collect();
            let gone = self.remote.as_ref().and_then(|r| r.tombstoned(tenant, REMOTE_KIND, &ids)).unwrap_or_default();
            for (agent, gone) in unindexed.iter().zip(gone) {
                if gone {
                    self.drop_deleted_elsewhere(tenant, agent);
                }
            }
        }
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.by_tenant.get(tenant).map(|a| a.values().cloned().collect()).unwrap_or_default()
    }

    /// One of `tenant`'s agents: known here, or (with a remote tier) found there and kept. With
    /// a remote tier an agent known here is checked there first (one round trip): deleted on
    /// another replica, it is removed here (its cache forgotten) and this is `None`; written
    /// anew, the tier's definition replaces this one; nothing known there, it is kept.
    pub fn get(&self, tenant: &str, id: &str) -> Option<Agent> {
        let known = {
            let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
            r.by_tenant.get(tenant).and_then(|a| a.get(id)).cloned()
        };
        let Some(agent) = known else { return self.adopt_remote(tenant, id) };
        let Some(remote) = &self.remote else { return Some(agent) };
        match remote.record_state(tenant, REMOTE_KIND, id) {
            engram_remote::RecordState::Deleted => {
                self.drop_deleted_elsewhere(tenant, &agent);
                None
            }
            engram_remote::RecordState::Present(body) => match parse_remote(tenant, id, &body) {
                Some(there) if there != agent => {
                    let replaced = self.update(|r| {
                        let mine = r.by_tenant.entry(tenant.to_string()).or_default();
                        mine.insert(id.to_string(), there.clone());
                        Ok(there)
                    });
                    Some(replaced.unwrap_or(agent))
                }
                _ => Some(agent),
            },
            engram_remote::RecordState::Unknown => Some(agent),
        }
    }

    /// Removes `agent` (deleted on another replica) here and forgets its cache, unless it
    /// changed meanwhile. Nothing is written to the tier: the deletion is already there.
    fn drop_deleted_elsewhere(&self, tenant: &str, agent: &Agent) {
        let change = |r: &mut Registry| {
            if r.by_tenant.get(tenant).and_then(|a| a.get(&agent.id)) != Some(agent) {
                return Err(ApiError::conflict("changed meanwhile"));
            }
            if let Some(a) = r.by_tenant.get_mut(tenant) {
                a.remove(&agent.id);
            }
            r.by_tenant.retain(|_, a| !a.is_empty());
            Ok(())
        };
        let forget = || {
            if let Some(f) = &self.forget {
                f(tenant, &agent.id);
            }
        };
        if self.update_then(change, forget).is_ok() {
            tracing::info!("agent {:?} of tenant {tenant:?} was deleted on another replica; removed here", agent.id);
        }
    }

    /// `tenant`'s agent `id` from the remote tier, added here (and to the file) if it is sound.
    fn adopt_remote(&self, tenant: &str, id: &str) -> Option<Agent> {
        let body = self.remote.as_ref()?.get_record(tenant, REMOTE_KIND, id)?;
        let agent = parse_remote(tenant, id, &body)?;
        self.update(|r| {
            let mine = r.by_tenant.entry(tenant.to_string()).or_default();
            Ok(mine.entry(id.to_string()).or_insert(agent).clone())
        })
        .ok()
    }

    /// Removes one of `tenant`'s agents (404 if there is none), then runs `then`
    /// (forgetting the agent's cache) before any [`Agents::while_current`] can run: a
    /// generate that found the agent before the removal either submitted its job
    /// before `then` or is refused.
    pub fn remove_then(&self, tenant: &str, id: &str, then: impl FnOnce()) -> Result<(), ApiError> {
        let change = |r: &mut Registry| {
            let mine = r.by_tenant.get_mut(tenant);
            match mine.and_then(|a| a.remove(id)) {
                Some(_) => {
                    r.by_tenant.retain(|_, a| !a.is_empty());
                    Ok(())
                }
                None => Err(ApiError::not_found(format!("no agent {id:?}"))),
            }
        };
        self.update_then(change, then)?;
        if let Some(r) = &self.remote {
            r.delete_record(tenant, REMOTE_KIND, id);
        }
        Ok(())
    }
}

/// The agent in a remote record's `body`, if it is `id` and within the bounds.
fn parse_remote(tenant: &str, id: &str, body: &str) -> Option<Agent> {
    let mut agent: Agent = match serde_json::from_str(body) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("remote agent record of tenant {tenant:?}: {e}; ignored");
            return None;
        }
    };
    agent.object = "agent";
    let bounded = agent.id == id
        && agent.name.as_ref().is_none_or(|n| n.len() <= MAX_NAME_BYTES)
        && agent.system.as_ref().is_none_or(|s| s.len() <= MAX_SYSTEM_BYTES);
    if !bounded {
        tracing::warn!("remote agent record {id:?} of tenant {tenant:?} is out of bounds; ignored");
        return None;
    }
    Some(agent)
}

/// Reads and checks the registry at `file`; a missing file is an empty registry.
fn load(file: &Path) -> Result<Registry, String> {
    let size = match std::fs::metadata(file) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Registry::default()),
        Err(e) => return Err(e.to_string()),
    };
    if size > MAX_FILE_BYTES {
        return Err(format!("{size} bytes, over the {MAX_FILE_BYTES}-byte limit for an agent registry"));
    }
    let bytes = std::fs::read(file).map_err(|e| e.to_string())?;
    let f: RegistryFile = serde_json::from_slice(&bytes).map_err(|e| format!("not an agent registry: {e}"))?;
    if f.format != FORMAT || f.version != VERSION {
        return Err(format!("format {:?} version {}, expected {FORMAT:?} version {VERSION}", f.format, f.version));
    }
    let mut r = Registry { by_tenant: HashMap::new(), next: f.next };
    for (tenant, agents) in f.tenants {
        let mine = r.by_tenant.entry(tenant).or_default();
        for a in agents {
            api::check_id("id", &a.id).map_err(|e| e.message)?;
            if mine.contains_key(&a.id) {
                return Err(format!("agent {:?} listed twice", a.id));
            }
            mine.insert(a.id.clone(), a);
        }
    }
    Ok(r)
}

/// The registry file's bytes.
fn encode(r: &Registry) -> serde_json::Result<Vec<u8>> {
    let tenants = r.by_tenant.iter().map(|(t, a)| (t.clone(), a.values().cloned().collect())).collect();
    serde_json::to_vec_pretty(&RegistryFile { format: FORMAT.into(), version: VERSION, next: r.next, tenants })
}

fn save(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    engram_kv::persist::atomic_write(file, |w| std::io::Write::write_all(w, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad_files(dir: &Path) -> Vec<Vec<u8>> {
        let mut found: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("agents.json.bad-"))
            .collect();
        found.sort();
        found.iter().map(|p| std::fs::read(p).unwrap()).collect()
    }

    /// `while_current` runs its closure only for the agent as read: not once it is
    /// removed, nor for an agent created anew under the same id.
    #[test]
    fn while_current_runs_only_for_the_agent_as_read() {
        let a = Agents::in_memory();
        let first = a.create("t", Some("x".into()), None, Some("one".into())).unwrap();
        assert_eq!(a.while_current("t", &first, || 7), Some(7));
        let mut forgot = false;
        a.remove_then("t", "x", || forgot = true).unwrap();
        assert!(forgot);
        assert_eq!(a.while_current("t", &first, || unreachable!("ran for a deleted agent")), None::<()>);
        a.create("t", Some("x".into()), None, Some("two".into())).unwrap();
        assert_eq!(a.while_current("t", &first, || unreachable!("ran for another agent")), None::<()>);
    }

    #[test]
    fn agents_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = Agents::open(dir.path());
        a.create("t1", Some("planner".into()), Some("Planner".into()), Some("You plan.".into())).unwrap();
        let gen = a.create("t1", None, None, None).unwrap();
        a.create("t2", Some("planner".into()), None, None).unwrap();
        assert_eq!(a.create("t1", Some("planner".into()), None, None).unwrap_err().status, 409);
        a.remove_then("t2", "planner", || {}).unwrap();
        assert_eq!(a.remove_then("t2", "planner", || {}).unwrap_err().status, 404);

        let b = Agents::open(dir.path());
        let ids: Vec<String> = b.list("t1").into_iter().map(|x| x.id).collect();
        assert_eq!(ids, vec![gen.id.clone(), "planner".to_string()]);
        assert_eq!(b.get("t1", "planner").unwrap().system.as_deref(), Some("You plan."));
        assert!(b.list("t2").is_empty());
        // Generated ids keep counting after a restart.
        assert_ne!(b.create("t1", None, None, None).unwrap().id, gen.id);
        assert!(bad_files(dir.path()).is_empty());
    }

    #[test]
    fn untrusted_registry_files_are_moved_aside_not_used() {
        let good = {
            let dir = tempfile::tempdir().unwrap();
            Agents::open(dir.path()).create("t", Some("a".into()), None, Some("sys".into())).unwrap();
            std::fs::read(dir.path().join(FILE_NAME)).unwrap()
        };
        let text = String::from_utf8(good.clone()).unwrap();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("garbage", b"\x00\x01not json at all".to_vec()),
            ("truncated", good[..good.len() / 2].to_vec()),
            ("foreign JSON", br#"{"entries": {}, "version": 1}"#.to_vec()),
            ("other version", text.replace("\"version\": 1", "\"version\": 9").into_bytes()),
            ("bad id", text.replace("\"id\": \"a\"", "\"id\": \"../a\"").into_bytes()),
            ("repeated id", {
                let one = text.split("\"t\": [").nth(1).unwrap().rsplit_once(']').unwrap().0.trim().to_string();
                text.replace(&one, &format!("{one}, {one}")).into_bytes()
            }),
        ];
        for (what, bytes) in cases {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(FILE_NAME), &bytes).unwrap();
            let a = Agents::open(dir.path());
            assert!(a.list("t").is_empty(), "{what}: nothing trusted");
            assert_eq!(bad_files(dir.path()), vec![bytes.clone()], "{what}: kept aside unchanged");
            // The registry works from empty and saves a sound file again.
            a.create("t", Some("b".into()), None, None).unwrap();
            assert_eq!(Agents::open(dir.path()).list("t").len(), 1, "{what}");
        }
        // Oversized (sparse, so the test stays cheap): refused before reading.
        let dir = tempfile::tempdir().unwrap();
        std::fs::File::create(dir.path().join(FILE_NAME)).unwrap().set_len(MAX_FILE_BYTES + 1).unwrap();
        assert!(Agents::open(dir.path()).list("t").is_empty());
        assert_eq!(bad_files(dir.path()).len(), 1);
    }

    #[test]
    fn agents_names_prompts_and_the_file_are_bounded() {
        let a = Agents::in_memory();
        let e = a.create("t", None, Some("n".repeat(MAX_NAME_BYTES + 1)), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("name"));
        let e = a.create("t", None, None, Some("s".repeat(MAX_SYSTEM_BYTES + 1))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("system"));
        for _ in 0..MAX_AGENTS_PER_TENANT {
            a.create("t", None, None, None).unwrap();
        }
        let e = a.create("t", None, None, None).unwrap_err();
        assert_eq!(e.status.as_u16(), 409, "{}", e.message);
        assert!(a.create("u", None, None, None).is_ok(), "another tenant is unaffected");
        // A registry whose file would pass the limit refuses the change and stays reloadable.
        let dir = tempfile::tempdir().unwrap();
        let mut a = Agents::open(dir.path());
        a.max_bytes = 64 << 10;
        let mut made = 0;
        let refused = loop {
            match a.create("t", None, None, Some("s".repeat(8 << 10))) {
                Ok(_) => made += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(refused.status.as_u16(), 507, "{}", refused.message);
        assert!(std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len() <= 64 << 10);
        assert_eq!(Agents::open(dir.path()).list("t").len(), made, "what was accepted reloads");
    }

    #[test]
    fn a_failed_save_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let a = Agents::open(dir.path());
        a.create("t", Some("kept".into()), None, None).unwrap();
        // A directory where the file should be: every save fails.
        std::fs::remove_file(dir.path().join(FILE_NAME)).unwrap();
        std::fs::create_dir(dir.path().join(FILE_NAME)).unwrap();
        let e = a.create("t", Some("new".into()), None, None).unwrap_err();
        assert_eq!(e.status, 500, "{}", e.message);
        assert!(a.get("t", "new").is_none());
        let e = a.remove_then("t", "kept", || {}).unwrap_err();
        assert_eq!(e.status, 500);
        assert!(!e.message.contains(&dir.path().display().to_string()), "a path in {:?}", e.message);
        assert!(a.get("t", "kept").is_some());
    }
}
