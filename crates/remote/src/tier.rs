//! [`RemoteTier`]: the handle servers share (records, counters, the writer thread), and
//! [`RemoteKv`], its view for one model's caches (sessions and prefix chains).
//!
//! Reads run on the caller's thread, on a local miss, one pipelined round trip per batch of
//! runs, each bounded by the timeout; a value that fails any check is a miss (counted), never
//! a wrong answer. Writes go to the writer thread (`writer.rs`).
//!
//! Invariant: a sequence [`RemoteKv::fetch_kv`] returns holds exactly the KV of the tokens it
//! was asked for (a prefix of them, block-run aligned, possibly shorter), as the model and KV
//! format of the fingerprint computed them, for the salt's chain.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

use engram_kv::{EntryKind, KvPool, SeqKv};

use crate::keys::{chain_hashes, KeySpace};
use crate::link::LinkError;
use crate::links::Links;
use crate::manifest::{Manifest, Record};
use crate::stamped::StampedRecord;
use crate::stats::{RemoteStats, Stats};
use crate::writer::{self, Job, Msg, Queue};
use crate::RemoteConfig;

/// Most value bytes one fetch trip asks for: a few small runs per `MGET`, one large run (a 1B
/// model's f16 run is 16 MiB) per trip, so a long session is a handful of trips.
const BYTES_PER_TRIP: usize = 16 << 20;
/// The transfer rate a trip's read timeout allows for beyond the timeout itself: a trip that
/// moves 16 MiB may take `timeout + 16 MiB / this` (a slow store still costs at most that).
const MIN_BYTES_PER_SEC: f64 = 100e6;

struct Shared {
    config: RemoteConfig,
    stats: Stats,
    /// Reads of KV (the engine thread).
    kv_reads: Mutex<Links>,
    /// Reads of records (server threads).
    record_reads: Mutex<Links>,
    queue: Arc<Mutex<Queue>>,
    tx: Sender<Msg>,
}

/// The remote tier: cheap to clone (clones share the links, counters and writer thread, which
/// ends once the last clone is dropped, after the writes queued before).
#[derive(Clone)]
pub struct RemoteTier(Arc<Shared>);

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTier").field("url", &redact(&self.0.config.url)).finish()
    }
}

/// `url` without its password, for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

impl RemoteTier {
    /// The tier `config` describes. Nothing is connected yet (a store that is down at start
    /// is only a miss on each lookup until it is up); only a URL that does not parse fails.
    pub fn new(config: RemoteConfig) -> Result<RemoteTier, String> {
        for url in std::iter::once(&config.url).chain(config.tenant_urls.iter().map(|(_, u)| u)) {
            crate::link::client(url, config.ca_pem.as_deref()).map_err(|e| format!("--kv-remote {}: {e}", redact(url)))?;
        }
        if config.run_tokens == 0 || config.run_tokens % engram_kv::BLOCK_TOKENS != 0 {
            return Err(format!("runs of {} tokens are not whole blocks of {}", config.run_tokens, engram_kv::BLOCK_TOKENS));
        }
        let stats = Stats::default();
        let (tx, rx) = channel();
        let queue = Arc::new(Mutex::new(Queue::default()));
        let links = Links::new(config.clone(), stats.clone());
        let (q, s) = (queue.clone(), stats.clone());
        std::thread::Builder::new()
            .name("engram-remote-writer".into())
            .spawn(move || writer::run(rx, q, links, s))
            .map_err(|e| format!("remote tier writer thread: {e}"))?;
        Ok(RemoteTier(Arc::new(Shared {
            kv_reads: Mutex::new(Links::new(config.clone(), stats.clone())),
            record_reads: Mutex::new(Links::new(config.clone(), stats.clone())),
            config,
            stats,
            queue,
            tx,
        })))
    }

    /// The configuration.
    pub fn config(&self) -> &RemoteConfig {
        &self.0.config
    }

    /// The counters now.
    pub fn stats(&self) -> RemoteStats {
        self.0.stats.snapshot()
    }

    /// The view of this tier for caches with `fingerprint` (`engram_kv::cache_fingerprint`).
    pub fn for_model(&self, fingerprint: String) -> RemoteKv {
        RemoteKv { tier: self.clone(), fingerprint }
    }

    fn enqueue(&self, key: String, job: Job) {
        let number = self.0.queue.lock().expect("queue lock").push(key.clone(), job, self.0.config.max_queued);
        match number {
            Some(n) => {
                let _ = self.0.tx.send(Msg::Job(key, n));
            }
            None => self.0.stats.dropped(1),
        }
    }

    /// Waits until every write queued so far has been tried.
    pub fn flush(&self) {
        let (done, wait) = channel();
        if self.0.tx.send(Msg::Flush(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    /// Drops every queued session save not yet started (they hold blocks of the RAM pool);
    /// how many.
    pub fn shed_queued(&self) -> usize {
        let n = self.0.queue.lock().expect("queue lock").shed_sessions();
        self.0.stats.dropped(n);
        n
    }

    /// Stores `tenant`'s record `name` of kind `kind` (its JSON `body`), behind the caller; a
    /// tombstone of an earlier deletion goes.
    pub fn put_record(&self, tenant: &str, kind: &str, name: &str, body: String) {
        let space = KeySpace::new(Some(tenant), "");
        let key = space.doc(kind, name);
        let value = Record { tenant: tenant.into(), kind: kind.into(), name: name.into(), body }.seal();
        let index = (space.doc_index(kind), name.to_string());
        let unmark = space.doc_tombstone(kind, name);
        self.enqueue(key.clone(), Job::Record { tenant: tenant.into(), key, value, index, unmark });
    }

    /// Deletes `tenant`'s record `name` of kind `kind`, behind the caller, leaving a tombstone
    /// that tells replicas which still hold it ([`RemoteTier::record_state`]).
    pub fn delete_record(&self, tenant: &str, kind: &str, name: &str) {
        let space = KeySpace::new(Some(tenant), "");
        let key = space.doc(kind, name);
        let unindex = vec![(space.doc_index(kind), name.to_string())];
        let mark = vec![space.doc_tombstone(kind, name)];
        self.enqueue(key.clone(), Job::Delete { tenant: Some(tenant.into()), keys: vec![key], unindex, mark });
    }

    /// What the store says of `tenant`'s record `name` of kind `kind`, for a replica that holds
    /// it: present (its JSON body, if sound), deleted (its tombstone), or nothing known (never
    /// written, evicted, or the store unreachable: counted). One round trip, bounded by the
    /// timeout.
    pub fn record_state(&self, tenant: &str, kind: &str, name: &str) -> RecordState {
        let space = KeySpace::new(Some(tenant), "");
        let (key, mark) = (space.doc(kind, name), space.doc_tombstone(kind, name));
        let stats = &self.0.stats;
        stats.lookup();
        let got: Result<(Option<Vec<u8>>, bool), LinkError> = self
            .0
            .record_reads
            .lock()
            .expect("links lock")
            .run(Some(tenant), |c| redis::pipe().cmd("GET").arg(&key).cmd("EXISTS").arg(&mark).query(c));
        match got {
            Ok((_, true)) => {
                stats.hit(0);
                RecordState::Deleted
            }
            Ok((Some(bytes), false)) => {
                stats.read_bytes(bytes.len());
                match Record::open(&bytes, tenant, kind, name) {
                    Ok(r) => {
                        stats.hit(0);
                        RecordState::Present(r.body)
                    }
                    Err(why) => {
                        stats.bad_value();
                        tracing::warn!("remote record {key}: {why}; ignored");
                        RecordState::Unknown
                    }
                }
            }
            Ok((None, false)) => RecordState::Unknown,
            Err(e) => {
                stats.read_error();
                tracing::debug!("remote record read failed: {e}");
                RecordState::Unknown
            }
        }
    }

    /// Which of `tenant`'s records `names` of kind `kind` have tombstones (deleted on some
    /// replica): one pipelined round trip, bounded by the timeout; `None` if the store cannot
    /// be read (counted).
    pub fn tombstoned(&self, tenant: &str, kind: &str, names: &[&str]) -> Option<Vec<bool>> {
        if names.is_empty() {
            return Some(Vec::new());
        }
        let space = KeySpace::new(Some(tenant), "");
        let got: Result<Vec<bool>, LinkError> = self.0.record_reads.lock().expect("links lock").run(Some(tenant), |c| {
            let mut pipe = redis::pipe();
            for name in names {
                pipe.cmd("EXISTS").arg(space.doc_tombstone(kind, name));
            }
            pipe.query(c)
        });
        got.map_err(|e| {
            self.0.stats.read_error();
            tracing::debug!("remote tombstones read failed: {e}");
        })
        .ok()
    }

    /// Stores version `stamp` of `tenant`'s stamped record `name` of kind `kind` (its JSON
    /// `body`), behind the caller; the store keeps the highest stamp it was given
    /// (`stamped.rs`).
    pub fn put_stamped(&self, tenant: &str, kind: &str, name: &str, stamp: u64, body: String) {
        let key = KeySpace::new(Some(tenant), "").doc(kind, name);
        let value = StampedRecord { tenant: tenant.into(), kind: kind.into(), name: name.into(), stamp, body }.seal();
        self.enqueue(key.clone(), Job::Stamped { tenant: tenant.into(), key, stamp, value });
    }

    /// The newest version of each of `tenant`'s stamped records `(kind, name)` in `wanted`, in
    /// one pipelined round trip bounded by the timeout: `None` if the store cannot be read
    /// (counted); a record absent or failing a check (counted) is `None` in the list.
    pub fn get_stamped(&self, tenant: &str, wanted: &[(&str, &str)]) -> Option<Vec<Option<StampedRecord>>> {
        let space = KeySpace::new(Some(tenant), "");
        let keys: Vec<String> = wanted.iter().map(|(kind, name)| space.doc(kind, name)).collect();
        let stats = &self.0.stats;
        stats.lookup();
        let got: Result<Vec<Vec<Vec<u8>>>, LinkError> = self.0.record_reads.lock().expect("links lock").run(Some(tenant), |c| {
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.cmd("ZRANGE").arg(k).arg(-1).arg(-1);
            }
            pipe.query(c)
        });
        let values = match got {
            Ok(v) => v,
            Err(e) => {
                stats.read_error();
                tracing::debug!("remote stamped records read failed: {e}");
                return None;
            }
        };
        let mut out = Vec::with_capacity(wanted.len());
        for ((kind, name), members) in wanted.iter().zip(values) {
            let Some(bytes) = members.into_iter().next_back() else {
                out.push(None);
                continue;
            };
            stats.read_bytes(bytes.len());
            match StampedRecord::open(&bytes, tenant, kind, name) {
                Ok(r) => out.push(Some(r)),
                Err(why) => {
                    stats.bad_value();
                    tracing::warn!("remote {kind} record of tenant {tenant:?}: {why}; ignored");
                    out.push(None);
                }
            }
        }
        if out.iter().any(Option::is_some) {
            stats.hit(0);
        }
        Some(out)
    }

    /// The names of `tenant`'s records of kind `kind` in the store (at most `most`, sorted);
    /// `None` if the store cannot be read (counted). One round trip, bounded by the timeout.
    pub fn record_names(&self, tenant: &str, kind: &str, most: usize) -> Option<Vec<String>> {
        let set = KeySpace::new(Some(tenant), "").doc_index(kind);
        let got: Result<Vec<String>, LinkError> =
            self.0.record_reads.lock().expect("links lock").run(Some(tenant), |c| redis::cmd("SMEMBERS").arg(&set).query(c));
        match got {
            Ok(mut names) => {
                names.sort();
                names.truncate(most);
                Some(names)
            }
            Err(e) => {
                self.0.stats.read_error();
                tracing::debug!("remote record index read failed: {e}");
                None
            }
        }
    }

    /// `tenant`'s record `name` of kind `kind` (its JSON body), if the store has a sound one.
    /// One round trip, bounded by the timeout; a failure is `None` (counted).
    pub fn get_record(&self, tenant: &str, kind: &str, name: &str) -> Option<String> {
        let key = KeySpace::new(Some(tenant), "").doc(kind, name);
        let stats = &self.0.stats;
        stats.lookup();
        let got: Result<Option<Vec<u8>>, LinkError> =
            self.0.record_reads.lock().expect("links lock").run(Some(tenant), |c| redis::cmd("GET").arg(&key).query(c));
        match got {
            Ok(Some(bytes)) => {
                stats.read_bytes(bytes.len());
                match Record::open(&bytes, tenant, kind, name) {
                    Ok(r) => {
                        stats.hit(0);
                        Some(r.body)
                    }
                    Err(why) => {
                        stats.bad_value();
                        tracing::warn!("remote record {key}: {why}; ignored");
                        None
                    }
                }
            }
            Ok(None) => None,
            Err(e) => {
                stats.read_error();
                tracing::debug!("remote record read failed: {e}");
                None
            }
        }
    }
}

/// What the store says of a record a replica holds ([`RemoteTier::record_state`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// The record, as last written (its JSON body).
    Present(String),
    /// Deleted on some replica since it was last written.
    Deleted,
    /// Nothing known: never written, evicted, unsound (counted), or the store unreachable.
    Unknown,
}

/// The tier for one model's caches.
#[derive(Clone, Debug)]
pub struct RemoteKv {
    tier: RemoteTier,
    fingerprint: String,
}

impl RemoteKv {
    /// The shared tier.
    pub fn tier(&self) -> &RemoteTier {
        &self.tier
    }

    fn space(&self, tenant: Option<&str>) -> KeySpace {
        KeySpace::new(tenant, &self.fingerprint)
    }

    fn read<T>(&self, tenant: Option<&str>, f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>) -> Option<T> {
        self.read_bytes(tenant, 0, f)
    }

    /// [`RemoteKv::read`] of about `bytes` bytes: the trip's read timeout allows for moving them.
    fn read_bytes<T>(
        &self,
        tenant: Option<&str>,
        bytes: usize,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Option<T> {
        let timeout = self.tier.0.config.timeout + std::time::Duration::from_secs_f64(bytes as f64 / MIN_BYTES_PER_SEC);
        let result = self.tier.0.kv_reads.lock().expect("links lock").run(tenant, |c| {
            c.set_read_timeout(Some(timeout))?;
            f(c)
        });
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                self.tier.0.stats.read_error();
                tracing::debug!("remote read failed: {e}");
                None
            }
        }
    }

    /// Saves `owner`'s session `session_id` behind the caller: its KV as runs of the chain
    /// hashed under `salt` (tokens `..kv.len()`), then its manifest. `tenant` picks the keys
    /// (a chain without a salt, shared across tenants, goes under the shared keys).
    #[allow(clippy::too_many_arguments)]
    pub fn save_session(
        &self,
        tenant: Option<&str>,
        owner: &str,
        session_id: &str,
        salt: Option<&str>,
        text: &str,
        tokens: &[u32],
        token_ends: &[usize],
        kv: SeqKv,
    ) {
        let n = kv.len().min(tokens.len()).min(token_ends.len());
        if n == 0 || kv.has_moved_positions() {
            return;
        }
        let manifest = Manifest {
            fingerprint: self.fingerprint.clone(),
            owner: owner.into(),
            session_id: session_id.into(),
            salt: salt.map(str::to_string),
            run_tokens: self.tier.0.config.run_tokens,
            text: text.into(),
            tokens: tokens[..n].to_vec(),
            token_ends: token_ends[..n].to_vec(),
        };
        let space = self.space(tenant);
        let key = space.session(owner, session_id);
        let run_tenant = salt.and(tenant);
        let runs = (self.space(run_tenant), run_tenant.map(str::to_string));
        self.tier.enqueue(key, Job::Session { space, tenant: tenant.map(str::to_string), runs, manifest, kv });
    }

    /// Forgets `owner`'s sessions in the store, behind the caller: their manifests, the runs of
    /// their chains (salted by the owner; a chain shared across tenants is left to the store's
    /// eviction), and the owner's set.
    pub fn forget_owner(&self, tenant: Option<&str>, owner: &str) {
        self.tier.0.queue.lock().expect("queue lock").drop_owner(owner);
        let space = self.space(tenant);
        let key = format!("forget:{}", space.owner(owner));
        let fingerprint = self.fingerprint.clone();
        self.tier.enqueue(key, Job::ForgetOwner { space, tenant: tenant.map(str::to_string), owner: owner.into(), fingerprint });
    }

    /// The manifest of `owner`'s session `session_id`, or (no id) of the owner's session whose
    /// text shares the most characters with `text` (at least one); `None` on a miss.
    pub fn find_manifest(&self, tenant: Option<&str>, owner: &str, session_id: Option<&str>, text: &str) -> Option<Manifest> {
        let stats = &self.tier.0.stats;
        stats.lookup();
        let space = self.space(tenant);
        let values: Vec<Option<Vec<u8>>> = match session_id {
            Some(id) => vec![self.read(tenant, |c| redis::cmd("GET").arg(space.session(owner, id)).query(c))?],
            None => {
                let ids: Vec<String> = self.read(tenant, |c| redis::cmd("SMEMBERS").arg(space.owner(owner)).query(c))?;
                if ids.is_empty() {
                    return None;
                }
                let keys: Vec<String> = ids.iter().map(|id| space.session(owner, id)).collect();
                self.read(tenant, |c| redis::cmd("MGET").arg(&keys).query(c))?
            }
        };
        let mut best: Option<(usize, Manifest)> = None;
        for bytes in values.into_iter().flatten() {
            stats.read_bytes(bytes.len());
            match Manifest::open(&bytes, &self.fingerprint, owner, session_id) {
                Ok(m) => {
                    let common = common_prefix(&m.text, text);
                    if (session_id.is_some() || common > 0) && best.as_ref().is_none_or(|(c, _)| common > *c) {
                        best = Some((common, m));
                    }
                }
                Err(why) => {
                    stats.bad_value();
                    tracing::warn!("remote session manifest of {owner}: {why}; ignored");
                }
            }
        }
        best.map(|(_, m)| m)
    }

    /// The longest run-aligned prefix of `tokens` the store holds in the chain hashed under
    /// `salt`, if longer than the `have` tokens the caller already has: a lookup (counted) of
    /// [`RemoteKv::fetch_kv`] over the prompt's whole runs.
    pub fn fetch_prefix(
        &self,
        tenant: Option<&str>,
        salt: Option<&str>,
        tokens: &[u32],
        have: usize,
        pool: &KvPool,
        vocab: usize,
    ) -> Option<SeqKv> {
        let run = self.tier.0.config.run_tokens;
        let whole = tokens.len() / run * run;
        if whole <= have {
            return None;
        }
        self.tier.0.stats.lookup();
        self.fetch_kv(tenant, salt, &tokens[..whole], whole, pool, vocab).filter(|kv| kv.len() > have)
    }

    /// The KV of `tokens[..upto]` in the chain hashed under `salt`, from the store: the runs
    /// covering it, cut back to `upto`, or the longest prefix of them present and sound
    /// (`None` if not even the first is). Runs are fetched a few per round trip (one
    /// pipelined `MGET` each), checked (checksum, fingerprint, owner, tokens), decoded into
    /// blocks charged to `pool`, and put together.
    pub fn fetch_kv(
        &self,
        tenant: Option<&str>,
        salt: Option<&str>,
        tokens: &[u32],
        upto: usize,
        pool: &KvPool,
        vocab: usize,
    ) -> Option<SeqKv> {
        let run = self.tier.0.config.run_tokens;
        let upto = upto.min(tokens.len());
        if upto == 0 {
            return None;
        }
        // Whole runs up to the one holding token `upto - 1` (the last run may be partial: the
        // sequence's end); the result is cut back to `upto` below.
        let end = (upto.div_ceil(run) * run).min(tokens.len());
        let stats = &self.tier.0.stats;
        // A chain shared across tenants (no salt) lives under the shared keys.
        let tenant = salt.and(tenant);
        let space = self.space(tenant);
        let keys: Vec<String> = chain_hashes(&self.fingerprint, salt, &tokens[..end], run).iter().map(|h| space.run(h)).collect();
        let owner = writer::run_owner(salt);
        let mut parts = Vec::new();
        let run_bytes = pool.bytes_for(run).max(1);
        let per_trip = (BYTES_PER_TRIP / run_bytes).max(1);
        let timeout_for = |bytes: usize| self.tier.0.config.timeout + std::time::Duration::from_secs_f64(bytes as f64 / MIN_BYTES_PER_SEC);
        // Set once a run is missing or unusable: the rest of its trip's reply is read (the
        // connection stays in step) but not used, and no further trip is made.
        let mut stopped = false;
        for (t, batch) in keys.chunks(per_trip).enumerate() {
            // Each value is checked and decoded as it arrives, while the next waits in the socket.
            let mut each = |j: usize, value: Option<&[u8]>| {
                if stopped {
                    return;
                }
                let i = t * per_trip + j;
                let Some(bytes) = value else {
                    stopped = true;
                    return;
                };
                stats.read_bytes(bytes.len());
                let want = &tokens[i * run..((i + 1) * run).min(end)];
                match engram_kv::persist::decode_entry(&keys[i], bytes, pool, &self.fingerprint, vocab) {
                    Ok((meta, kv)) if meta.kind == EntryKind::Prefix && meta.owner == owner && meta.tokens == want => parts.push(kv),
                    Ok(_) => {
                        stats.bad_value();
                        tracing::warn!("remote run {}: another owner's or other tokens; ignored", keys[i]);
                        stopped = true;
                    }
                    // The RAM budget refused it: the value is sound, the restore is shorter.
                    Err(engram_kv::PersistError::Kv { .. }) => stopped = true,
                    Err(e) => {
                        stats.bad_value();
                        tracing::warn!("remote run: {e}; ignored");
                        stopped = true;
                    }
                }
            };
            let read =
                self.tier.0.kv_reads.lock().expect("links lock").mget_each(tenant, batch, timeout_for(batch.len() * run_bytes), &mut each);
            if let Err(e) = read {
                stats.read_error();
                tracing::debug!("remote read failed: {e}");
                break;
            }
            if stopped {
                break;
            }
        }
        let mut kv = SeqKv::concat(pool, parts)?;
        kv.truncate(upto);
        if kv.is_empty() {
            return None;
        }
        stats.hit(kv.len());
        Some(kv)
    }
}

/// The longest common prefix of `a` and `b`, in bytes, on a char boundary.
pub fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) || !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}
