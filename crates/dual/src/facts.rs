//! `FactStore` (the dual-stream design's persistent facts): per owner (a tenant's user) an append-only log
//! of facts — text, id, what it replaces, and a tombstone once superseded or deleted — kept in
//! memory and, with a directory, one file per owner that survives a restart.
//!
//! ```text
//!  <dir>/facts-<blake3(owner), 32 hex>.json:
//!    engram-facts v1 <body bytes> <blake3 of body, hex>\n          (`engram_kv::envelope`)
//!    {"format": "engram-facts", "version": 1, "owner": ..., "next_id": n, "facts": [...]}
//! ```
//! Every change stamps the log ([`FactLog::stamp`]); another replica's version of a log
//! ([`FactStore::import`]) replaces this store's only if its stamp is higher, so replicas
//! sharing logs through a remote tier agree on the newest.
//!
//! Invariants: a change that reports success is on disk (temp file, fsync, rename) before the
//! caller answers; a change that fails — bad input, a full log, a failed write — changes
//! nothing, in memory or on disk. A file is used only after its header, length, checksum,
//! format, version, owner and every fact check out; an untrusted file (damaged, truncated,
//! another owner's, another version, over [`FactLimits::max_file_bytes`]) is moved aside to
//! `<name>.bad-<unix time>`, never half-used, and the owner starts with no facts. Logs are
//! bounded: at most [`FactLimits::max_facts`] facts (tombstones included) of at most
//! [`FactLimits::max_text_bytes`] each (`tests/it/facts.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

const MAGIC: &str = "engram-facts";
const FORMAT: &str = "engram-facts";
const VERSION: u32 = 1;

/// One fact as the API lists it and the file stores it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fact {
    /// Unique within its owner's log, increasing in the order facts were added.
    pub id: u64,
    pub text: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The fact this one superseded.
    pub replaces: Option<u64>,
    /// Set once the fact is superseded or deleted: no longer attended.
    pub tombstoned: bool,
    /// The fact that superseded this one.
    pub replaced_by: Option<u64>,
}

/// Bounds on one owner's log.
#[derive(Clone, Copy, Debug)]
pub struct FactLimits {
    /// Facts in a log, tombstones included.
    pub max_facts: usize,
    /// Bytes of one fact's text.
    pub max_text_bytes: usize,
    /// Bytes of a log file (a larger one is not read).
    pub max_file_bytes: u64,
}

impl Default for FactLimits {
    fn default() -> Self {
        FactLimits { max_facts: 256, max_text_bytes: 4096, max_file_bytes: 4 << 20 }
    }
}

/// Why a change was refused (nothing was changed).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FactError {
    #[error("the fact's text is empty")]
    Empty,
    #[error("the fact is {bytes} bytes; at most {max}")]
    TooLong { bytes: usize, max: usize },
    #[error("this user has {max} facts (tombstones included), the most a log keeps; delete the user's facts first")]
    Full { max: usize },
    #[error("this user has no fact {0}")]
    UnknownFact(u64),
    #[error("fact {0} is already tombstoned")]
    Tombstoned(u64),
    #[error("this user has no facts")]
    UnknownOwner,
    #[error("the facts could not be saved ({0})")]
    Io(String),
}

#[derive(Clone, Default, Serialize, Deserialize)]
struct Log {
    /// Which version of the log this is ([`FactLog::stamp`]; 0 in files written before stamps).
    stamp: u64,
    next_id: u64,
    facts: Vec<Fact>,
}

#[derive(Serialize, Deserialize)]
struct LogFile {
    format: String,
    version: u32,
    owner: String,
    #[serde(default)]
    stamp: u64,
    next_id: u64,
    facts: Vec<Fact>,
}

/// One version of an owner's log as replicas exchange it ([`FactStore::export`],
/// [`FactStore::import`]): no facts means the log was forgotten.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FactLog {
    /// Which version: every change stamps the log past the version it changed (microseconds
    /// since the epoch, or one past the old stamp), so a higher stamp is a later change.
    pub stamp: u64,
    pub next_id: u64,
    pub facts: Vec<Fact>,
}

/// Every owner's fact log. See the module doc.
pub struct FactStore {
    dir: Option<PathBuf>,
    limits: FactLimits,
    /// Loaded logs; an owner absent here is read from its file on first use.
    logs: Mutex<HashMap<String, Option<Log>>>,
    /// The stamps of logs forgotten since start ([`FactStore::clear`], or a forgotten log
    /// imported): an older version of them is not imported again.
    forgotten: Mutex<HashMap<String, u64>>,
}

impl FactStore {
    /// Logs kept in memory only.
    pub fn in_memory(limits: FactLimits) -> FactStore {
        FactStore { dir: None, limits, logs: Mutex::new(HashMap::new()), forgotten: Mutex::new(HashMap::new()) }
    }

    /// Logs saved under `dir` (created on the first save), each read on its owner's first use.
    pub fn open(dir: &Path, limits: FactLimits) -> FactStore {
        FactStore { dir: Some(dir.to_path_buf()), limits, logs: Mutex::new(HashMap::new()), forgotten: Mutex::new(HashMap::new()) }
    }

    /// The limits this store enforces.
    pub fn limits(&self) -> FactLimits {
        self.limits
    }

    /// `owner`'s facts, tombstones included, oldest first; `None` for an owner with no log.
    pub fn list(&self, owner: &str) -> Option<Vec<Fact>> {
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        self.loaded(&mut logs, owner).as_ref().map(|l| l.facts.clone())
    }

    /// `owner`'s live facts (not tombstoned), oldest first; empty for an owner with no log.
    pub fn live(&self, owner: &str) -> Vec<Fact> {
        self.list(owner).unwrap_or_default().into_iter().filter(|f| !f.tombstoned).collect()
    }

    /// Checks a fact's text against the limits (no store needed).
    pub fn check_text(&self, text: &str) -> Result<(), FactError> {
        if text.trim().is_empty() {
            return Err(FactError::Empty);
        }
        if text.len() > self.limits.max_text_bytes {
            return Err(FactError::TooLong { bytes: text.len(), max: self.limits.max_text_bytes });
        }
        Ok(())
    }

    /// Appends a fact to `owner`'s log (created if need be), tombstoning `replaces` if given;
    /// then runs `then` with the live facts before any other change of the store. Returns the
    /// new fact.
    pub fn append(&self, owner: &str, text: &str, replaces: Option<u64>, then: impl FnOnce(&[Fact])) -> Result<Fact, FactError> {
        self.check_text(text)?;
        self.change(owner, true, then, |log| {
            if log.facts.len() >= self.limits.max_facts {
                return Err(FactError::Full { max: self.limits.max_facts });
            }
            log.next_id += 1;
            let id = log.next_id;
            if let Some(old) = replaces {
                let f = tombstone(log, old)?;
                f.replaced_by = Some(id);
            }
            let fact = Fact { id, text: text.to_string(), created_at: now_s(), replaces, tombstoned: false, replaced_by: None };
            log.facts.push(fact.clone());
            Ok(fact)
        })
    }

    /// Tombstones fact `id` of `owner`; then runs `then` with the live facts.
    pub fn tombstone(&self, owner: &str, id: u64, then: impl FnOnce(&[Fact])) -> Result<(), FactError> {
        self.change(owner, false, then, |log| tombstone(log, id).map(|_| ()))
    }

    /// Forgets `owner`'s whole log (its file removed); then runs `then` with no facts.
    pub fn clear(&self, owner: &str, then: impl FnOnce(&[Fact])) -> Result<(), FactError> {
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(log) = self.loaded(&mut logs, owner) else { return Err(FactError::UnknownOwner) };
        let stamp = next_stamp(log.stamp);
        self.forget(&mut logs, owner, stamp)?;
        then(&[]);
        Ok(())
    }

    /// Removes `owner`'s file and log, remembering `stamp` as the forgetting's version.
    fn forget(&self, logs: &mut HashMap<String, Option<Log>>, owner: &str, stamp: u64) -> Result<(), FactError> {
        if let Some(file) = self.file(owner) {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(FactError::Io(e.kind().to_string())),
            }
        }
        logs.insert(owner.to_string(), None);
        self.forgotten.lock().unwrap_or_else(|e| e.into_inner()).insert(owner.to_string(), stamp);
        Ok(())
    }

    /// `owner`'s log as it is here: the log, or (forgotten since start) no facts with the
    /// forgetting's stamp; `None` if this store knows nothing of `owner`.
    pub fn export(&self, owner: &str) -> Option<FactLog> {
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        match self.loaded(&mut logs, owner) {
            Some(log) => Some(FactLog { stamp: log.stamp, next_id: log.next_id, facts: log.facts.clone() }),
            None => {
                let forgotten = self.forgotten.lock().unwrap_or_else(|e| e.into_inner());
                forgotten.get(owner).map(|&stamp| FactLog { stamp, next_id: 0, facts: Vec::new() })
            }
        }
    }

    /// Makes `log` (another replica's version) `owner`'s log if its stamp is higher than this
    /// store's (a log without facts forgets the owner's), saved as a change is; then runs
    /// `then` with the live facts. `Ok(false)`: this store's version is as new, nothing
    /// changed. A log that breaks the limits or the ids' order is refused (nothing changed).
    pub fn import(&self, owner: &str, log: FactLog, then: impl FnOnce(&[Fact])) -> Result<bool, FactError> {
        check_log(&log.facts, log.next_id, &self.limits).map_err(FactError::Io)?;
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        let here = match self.loaded(&mut logs, owner) {
            Some(l) => l.stamp,
            None => self.forgotten.lock().unwrap_or_else(|e| e.into_inner()).get(owner).copied().unwrap_or(0),
        };
        if log.stamp <= here {
            return Ok(false);
        }
        if log.facts.is_empty() {
            self.forget(&mut logs, owner, log.stamp)?;
            then(&[]);
            return Ok(true);
        }
        let new = Log { stamp: log.stamp, next_id: log.next_id, facts: log.facts };
        if let Some(file) = self.file(owner) {
            save(&file, owner, &new).map_err(|e| FactError::Io(e.kind().to_string()))?;
        }
        let live: Vec<Fact> = new.facts.iter().filter(|f| !f.tombstoned).cloned().collect();
        logs.insert(owner.to_string(), Some(new));
        then(&live);
        Ok(true)
    }

    /// Applies `apply` to a copy of `owner`'s log, saves it, then makes it current and runs
    /// `then`; on any error nothing changes.
    fn change<R>(
        &self,
        owner: &str,
        create: bool,
        then: impl FnOnce(&[Fact]),
        apply: impl FnOnce(&mut Log) -> Result<R, FactError>,
    ) -> Result<R, FactError> {
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        let mut log = match (self.loaded(&mut logs, owner).clone(), create) {
            (Some(log), _) => log,
            (None, true) => Log::default(),
            (None, false) => return Err(FactError::UnknownOwner),
        };
        let out = apply(&mut log)?;
        let forgotten = self.forgotten.lock().unwrap_or_else(|e| e.into_inner()).get(owner).copied().unwrap_or(0);
        log.stamp = next_stamp(log.stamp.max(forgotten));
        if let Some(file) = self.file(owner) {
            save(&file, owner, &log).map_err(|e| {
                tracing::error!("facts could not be saved to {}: {e}", file.display());
                FactError::Io(e.kind().to_string())
            })?;
        }
        let live: Vec<Fact> = log.facts.iter().filter(|f| !f.tombstoned).cloned().collect();
        logs.insert(owner.to_string(), Some(log));
        then(&live);
        Ok(out)
    }

    /// `owner`'s log, read from its file on first use.
    fn loaded<'a>(&self, logs: &'a mut HashMap<String, Option<Log>>, owner: &str) -> &'a Option<Log> {
        if !logs.contains_key(owner) {
            let log = match self.file(owner) {
                None => None,
                Some(file) => match load(&file, owner, &self.limits) {
                    Ok(log) => log,
                    Err(why) => {
                        let aside = file.with_extension(format!("json.bad-{}", now_s()));
                        match std::fs::rename(&file, &aside) {
                            Ok(()) => {
                                tracing::warn!("{}: {why}; moved to {}; the user starts with no facts", file.display(), aside.display())
                            }
                            Err(e) => {
                                tracing::warn!("{}: {why}; could not move it aside ({e}); the user starts with no facts", file.display())
                            }
                        }
                        None
                    }
                },
            };
            logs.insert(owner.to_string(), log);
        }
        &logs[owner]
    }

    /// Where `owner`'s log lives (the owner hashed: no user text in file names).
    pub fn file(&self, owner: &str) -> Option<PathBuf> {
        let hash = blake3::hash(owner.as_bytes()).to_hex();
        self.dir.as_ref().map(|d| d.join(format!("facts-{}.json", &hash[..32])))
    }
}

fn tombstone(log: &mut Log, id: u64) -> Result<&mut Fact, FactError> {
    let f = log.facts.iter_mut().find(|f| f.id == id).ok_or(FactError::UnknownFact(id))?;
    if f.tombstoned {
        return Err(FactError::Tombstoned(id));
    }
    f.tombstoned = true;
    Ok(f)
}

/// A change's stamp: microseconds since the epoch, or one past `after` (the version it
/// changes) when the clock is not past it.
fn next_stamp(after: u64) -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    now.max(after.saturating_add(1))
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn save(file: &Path, owner: &str, log: &Log) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let body = serde_json::to_vec(&LogFile {
        format: FORMAT.into(),
        version: VERSION,
        owner: owner.to_string(),
        stamp: log.stamp,
        next_id: log.next_id,
        facts: log.facts.clone(),
    })?;
    engram_kv::envelope::write_sealed(file, MAGIC, VERSION, &body)
}

/// The log in `file` for `owner`: `Ok(None)` if there is no file, an error saying what is
/// wrong if it cannot be trusted.
fn load(file: &Path, owner: &str, limits: &FactLimits) -> Result<Option<Log>, String> {
    let size = match std::fs::metadata(file) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if size > limits.max_file_bytes {
        return Err(format!("{size} bytes, over the {}-byte limit for a fact log", limits.max_file_bytes));
    }
    let bytes = std::fs::read(file).map_err(|e| e.to_string())?;
    let body = engram_kv::envelope::open(&bytes, MAGIC, VERSION).map_err(|e| format!("not a sound fact log: {e}"))?;
    let f: LogFile = serde_json::from_slice(body).map_err(|e| format!("not a fact log: {e}"))?;
    if f.format != FORMAT || f.version != VERSION {
        return Err(format!("format {:?} version {}, expected {FORMAT:?} version {VERSION}", f.format, f.version));
    }
    if f.owner != owner {
        return Err("another user's fact log".into());
    }
    check_log(&f.facts, f.next_id, limits)?;
    Ok(Some(Log { stamp: f.stamp, next_id: f.next_id, facts: f.facts }))
}

/// Whether `facts` can be a log under `limits`: not too many, ids increasing up to `next_id`,
/// every text non-empty and bounded.
fn check_log(facts: &[Fact], next_id: u64, limits: &FactLimits) -> Result<(), String> {
    if facts.len() > limits.max_facts {
        return Err(format!("{} facts, more than the {} a log keeps", facts.len(), limits.max_facts));
    }
    let mut last = 0;
    for fact in facts {
        if fact.id <= last || fact.id > next_id {
            return Err(format!("fact ids out of order or past next_id at {}", fact.id));
        }
        if fact.text.trim().is_empty() || fact.text.len() > limits.max_text_bytes {
            return Err(format!("fact {} has an empty or oversized text", fact.id));
        }
        last = fact.id;
    }
    Ok(())
}
