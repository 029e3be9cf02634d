//! The write-behind thread: sessions' runs and manifests, records and deletions reach the store
//! from here, never from a request's path.
//!
//! ```text
//!  engine thread ── save (a fork of the cache: shares blocks, no copy) ──> queue ──> writer thread
//!                                                                                   EXISTS runs (one trip)
//!                                                                                   SET missing runs, manifest, SADD owner
//!  server threads ── records (agents), stamped records (facts, state entries) ──> queue ──> SET / ZADD
//! ```
//! Invariant: jobs run in the order they were queued, and a newer save of a session replaces
//! its queued older one; a queue past `max_queued` drops new saves (counted), and
//! [`Queue::shed_sessions`] drops every save not yet started (they hold blocks of the RAM
//! pool). Runs are written before the manifest that names them, so a manifest read finds its
//! runs unless the store evicted them since (a shorter restore, never a wrong one).

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use engram_kv::{EntryKind, EntryMeta, SeqKv};

use crate::keys::{chain_hashes, KeySpace};
use crate::links::Links;
use crate::manifest::Manifest;
use crate::stats::Stats;

/// Bytes of run values sent in one pipeline (keeps the writer's memory bounded).
const PIPELINE_BYTES: usize = 32 << 20;
/// The transfer rate a write trip's timeouts allow for beyond the timeout itself.
const MIN_BYTES_PER_SEC: f64 = 100e6;

/// Sends `pipe` (about `bytes` bytes) with timeouts that allow for moving them.
fn send(links: &mut Links, tenant: Option<&str>, pipe: &redis::Pipeline, bytes: usize) -> Result<(), crate::link::LinkError> {
    let t = links.timeout() + std::time::Duration::from_secs_f64(bytes as f64 / MIN_BYTES_PER_SEC);
    links.run(tenant, |c| {
        c.set_read_timeout(Some(t))?;
        c.set_write_timeout(Some(t))?;
        pipe.query::<()>(c)
    })
}

/// A write waiting for the thread.
pub(crate) enum Job {
    /// A session's KV (runs, under `runs`: the tenant's keys, or the shared ones for a chain
    /// shared across tenants) and manifest (under `space`, the tenant's).
    Session { space: KeySpace, tenant: Option<String>, runs: (KeySpace, Option<String>), manifest: Manifest, kv: SeqKv },
    /// A record's sealed value, and its name added to its kind's index set; its tombstone
    /// (`unmark`) removed.
    Record { tenant: String, key: String, value: Vec<u8>, index: (String, String), unmark: String },
    /// Keys to delete, names to take out of index sets, and tombstones to set.
    Delete { tenant: Option<String>, keys: Vec<String>, unindex: Vec<(String, String)>, mark: Vec<String> },
    /// A stamped record's new version (`stamped.rs`): added under its stamp, every lower one
    /// removed.
    Stamped { tenant: String, key: String, stamp: u64, value: Vec<u8> },
    /// Every session of an owner (manifests for caches with `fingerprint`, the runs of their
    /// salted chains), and the owner's set.
    ForgetOwner { space: KeySpace, tenant: Option<String>, owner: String, fingerprint: String },
}

/// What the channel carries: a job's key and number in [`Queue`], or a flush.
pub(crate) enum Msg {
    Job(String, u64),
    Flush(Sender<()>),
}

/// Jobs not yet started, newest of each key only.
#[derive(Default)]
pub(crate) struct Queue {
    jobs: HashMap<String, (u64, Job)>,
    next: u64,
}

impl Queue {
    /// Queues `job` under `key` (replacing a queued one); its number, or `None` when the queue
    /// is full and the job is a session save (dropped).
    pub(crate) fn push(&mut self, key: String, job: Job, max_queued: usize) -> Option<u64> {
        if matches!(job, Job::Session { .. }) && !self.jobs.contains_key(&key) && self.jobs.len() >= max_queued {
            return None;
        }
        self.next += 1;
        self.jobs.insert(key, (self.next, job));
        Some(self.next)
    }

    /// Takes job `key` if `number` is still the one queued there.
    fn take(&mut self, key: &str, number: u64) -> Option<Job> {
        match self.jobs.get(key) {
            Some((n, _)) if *n == number => self.jobs.remove(key).map(|(_, j)| j),
            _ => None,
        }
    }

    /// Drops every queued session save (they hold the RAM pool's blocks); how many.
    pub(crate) fn shed_sessions(&mut self) -> usize {
        let before = self.jobs.len();
        self.jobs.retain(|_, (_, j)| !matches!(j, Job::Session { .. }));
        before - self.jobs.len()
    }

    /// Drops queued session saves of `owner` (about to be forgotten).
    pub(crate) fn drop_owner(&mut self, owner: &str) {
        self.jobs.retain(|_, (_, j)| !matches!(j, Job::Session { manifest, .. } if manifest.owner == owner));
    }
}

/// The thread's loop: until the channel closes.
pub(crate) fn run(rx: Receiver<Msg>, queue: Arc<Mutex<Queue>>, mut links: Links, stats: Stats) {
    for msg in rx {
        match msg {
            Msg::Flush(done) => {
                let _ = done.send(());
            }
            Msg::Job(key, number) => {
                let Some(job) = queue.lock().expect("queue lock").take(&key, number) else { continue };
                let result = match job {
                    Job::Session { space, tenant, runs, manifest, kv } => {
                        write_session(&mut links, &stats, (&space, tenant.as_deref()), (&runs.0, runs.1.as_deref()), &manifest, &kv)
                    }
                    Job::Record { tenant, key, value, index, unmark } => {
                        let n = value.len();
                        let mut pipe = redis::pipe();
                        pipe.cmd("SET").arg(&key).arg(value).ignore().cmd("SADD").arg(&index.0).arg(&index.1).ignore();
                        pipe.cmd("DEL").arg(&unmark).ignore();
                        links.run(Some(&tenant), |c| pipe.query::<()>(c)).map(|()| n)
                    }
                    Job::Delete { tenant, keys, unindex, mark } => {
                        let mut pipe = redis::pipe();
                        pipe.cmd("DEL").arg(&keys).ignore();
                        for (set, name) in &unindex {
                            pipe.cmd("SREM").arg(set).arg(name).ignore();
                        }
                        for key in &mark {
                            pipe.cmd("SET").arg(key).arg(1).ignore();
                        }
                        links.run(tenant.as_deref(), |c| pipe.query::<()>(c)).map(|()| 0)
                    }
                    Job::Stamped { tenant, key, stamp, value } => {
                        let n = value.len();
                        let mut pipe = redis::pipe();
                        // Each write keeps the highest stamp: the order writes arrive in does
                        // not matter.
                        pipe.cmd("ZADD").arg(&key).arg(stamp).arg(value).ignore();
                        pipe.cmd("ZREMRANGEBYRANK").arg(&key).arg(0).arg(-2).ignore();
                        links.run(Some(&tenant), |c| pipe.query::<()>(c)).map(|()| n)
                    }
                    Job::ForgetOwner { space, tenant, owner, fingerprint } => {
                        forget_owner(&mut links, &space, tenant.as_deref(), &owner, &fingerprint)
                    }
                };
                match result {
                    Ok(bytes) => stats.wrote(bytes),
                    Err(crate::link::LinkError::Backoff(_)) => stats.dropped(1),
                    Err(e) => {
                        stats.write_error();
                        tracing::debug!("remote write failed: {e}");
                    }
                }
            }
        }
    }
}

/// Writes the runs the store lacks, then the manifest and the owner's set entry; bytes written.
fn write_session(
    links: &mut Links,
    stats: &Stats,
    (space, tenant): (&KeySpace, Option<&str>),
    (run_space, run_tenant): (&KeySpace, Option<&str>),
    m: &Manifest,
    kv: &SeqKv,
) -> Result<usize, crate::link::LinkError> {
    let n = kv.len().min(m.tokens.len());
    let hashes = chain_hashes(&m.fingerprint, m.salt.as_deref(), &m.tokens[..n], m.run_tokens);
    let keys: Vec<String> = hashes.iter().map(|h| run_space.run(h)).collect();
    let present: Vec<bool> = links.run(run_tenant, |c| {
        let mut p = redis::pipe();
        for k in &keys {
            p.cmd("EXISTS").arg(k);
        }
        p.query(c)
    })?;
    let owner = run_owner(m.salt.as_deref());
    let mut written = 0;
    let mut pipe = redis::pipe();
    let mut pending = 0;
    for (i, key) in keys.iter().enumerate() {
        if present.get(i).copied().unwrap_or(false) {
            continue;
        }
        let range = i * m.run_tokens..((i + 1) * m.run_tokens).min(n);
        let meta = EntryMeta {
            fingerprint: m.fingerprint.clone(),
            kind: EntryKind::Prefix,
            owner: owner.clone(),
            tokens: m.tokens[range.clone()].to_vec(),
            text: String::new(),
            offsets: Vec::new(),
            created_unix: 0,
        };
        let value = match engram_kv::persist::encode_entry_range(&meta, kv, range) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("remote tier: a run of {} cannot be written: {e}", m.session_id);
                return Ok(written);
            }
        };
        pending += value.len();
        written += value.len();
        pipe.cmd("SET").arg(key).arg(value).ignore();
        if pending >= PIPELINE_BYTES {
            send(links, run_tenant, &pipe, pending)?;
            pipe = redis::pipe();
            pending = 0;
        }
    }
    if run_tenant != tenant && pending > 0 {
        send(links, run_tenant, &pipe, pending)?;
        pipe = redis::pipe();
        pending = 0;
    }
    let skipped = present.iter().filter(|&&p| p).count();
    let value = m.seal();
    let value_len = value.len();
    written += value_len;
    pipe.cmd("SET").arg(space.session(&m.owner, &m.session_id)).arg(value).ignore();
    pipe.cmd("SADD").arg(space.owner(&m.owner)).arg(&m.session_id).ignore();
    send(links, tenant, &pipe, pending + value_len)?;
    stats.runs_skipped(skipped);
    Ok(written)
}

/// The owner metadata of a run value: the salt its chain is hashed under, as a persisted
/// prefix chain's (`salt/<salt>`, or empty for a chain shared across tenants).
pub(crate) fn run_owner(salt: Option<&str>) -> String {
    salt.map_or_else(String::new, |s| format!("salt/{s}"))
}

/// Deletes `owner`'s manifests, the runs of their salted chains (an owner's own: a chain
/// shared across tenants is left to the store's eviction) and the owner's set; bytes written
/// (none). A manifest that does not open names no runs to delete.
fn forget_owner(
    links: &mut Links,
    space: &KeySpace,
    tenant: Option<&str>,
    owner: &str,
    fingerprint: &str,
) -> Result<usize, crate::link::LinkError> {
    let set = space.owner(owner);
    let ids: Vec<String> = links.run(tenant, |c| redis::cmd("SMEMBERS").arg(&set).query(c))?;
    let mut keys: Vec<String> = ids.iter().map(|id| space.session(owner, id)).collect();
    if !keys.is_empty() {
        let manifests: Vec<Option<Vec<u8>>> = links.run(tenant, |c| redis::cmd("MGET").arg(&keys).query(c))?;
        for bytes in manifests.into_iter().flatten() {
            let Ok(m) = Manifest::open(&bytes, fingerprint, owner, None) else { continue };
            if m.salt.is_some() {
                keys.extend(chain_hashes(fingerprint, m.salt.as_deref(), &m.tokens, m.run_tokens).iter().map(|h| space.run(h)));
            }
        }
    }
    keys.push(set);
    links.run(tenant, |c| redis::cmd("DEL").arg(&keys).query::<()>(c))?;
    Ok(0)
}
