//! Long conversations served over DynaKV: [`LongContext`], a layer over the context policy
//! (sessions, dual-stream) that moves a conversation whose history and prompt pass a threshold
//! from exact paged KV to a sparse cache ([`LongKv`]: the sinks and recent window in RAM, the
//! older KV offloaded to a file per sequence in the configured folder, clustered per (layer,
//! KV head)), and keeps that cache between turns so the next turn extends it.
//!
//! ```text
//!  admit ─► a kept sparse session this prompt extends?  yes ─► Checkout { cache: LongKv, reused: its tokens }
//!             │ no
//!             ▼
//!           inner.admit ─► history + prompt > threshold?  no ─► the inner checkout, unchanged (exact)
//!                              │ yes
//!                              ▼
//!                           switch: the exact rows copied into a LongKv (bounded prefill to its file)
//!  retire ─► a LongKv comes back: kept (per owner and session, least recently used dropped first),
//!            and its save queued when there is a disk store (`disk.rs`, written by `writer.rs`)
//!            anything else: the inner policy
//! ```
//!
//! With a disk store ([`LongContext::with_disk`]) a session kept at a turn's end is also saved
//! there (its DynaKV state, offload file and history, one folder entry counted against the
//! disk budget and its tenant's share) by the layer's writer thread: the engine thread only
//! takes a snapshot (`SparseKv::snapshot_state`: the RAM tail copied, the index and row tables
//! shared copy on write). A prompt that no session in RAM extends is matched against the
//! saved ones before the inner policy (after waiting for its owner's pending saves): a
//! restarted process resumes the next turn from the file, reusing the whole history. A saved
//! state that fails a check (damaged, truncated, another model or configuration) is never
//! used: the turn is recomputed. The idle hook waits for pending saves (a job arriving
//! meanwhile interrupts it), and dropping the layer writes every queued save first.
//!
//! The threshold is the configuration's `after_tokens`, or the request's own
//! ([`AdmitRequest::long_context_after`]) where it names one.
//!
//! Invariant: below the threshold the layer changes nothing (every call reaches the inner
//! policy as it came); a kept sparse session is reused only by a prompt that extends it by at
//! least one token: one whose cold tokenization starts with every token it holds, else (a
//! text prompt) one whose text starts with the session's text, the rest tokenized after it;
//! its RAM stays
//! charged to the KV pool while it is kept, and [`LongContext::make_room`] drops kept sessions
//! (least recently used first) once the inner policy cannot free enough.

mod disk;
mod history;
mod seq;
mod switch;
mod writer;

use std::any::Any;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use engram_kv::{DiskStore, KvPool, SeqCache, SeqKv};
use engram_model::ModelConfig;
use engram_policy::{
    AdmitRequest, Checkout, ContextPolicy, GaugeKind, IdleInterrupt, MatchKind, OwnerKey, OwnerKind, PolicyGauge, PolicyLayer, PolicyStats,
    Retired,
};

pub use seq::LongKv;
pub use writer::{SaveCounters, SaveHold, SaveMonitor};

use disk::LongDisk;
use history::{monotonic, History};

use crate::offload::OffloadConfig;
use crate::SparseConfig;

/// How long conversations are served (module doc).
#[derive(Clone, Debug)]
pub struct LongContextConfig {
    /// A conversation whose history and prompt hold more tokens than this goes sparse.
    pub after_tokens: usize,
    /// The method, retrieval budget, sinks and recent window of every sparse step.
    pub sparse: SparseConfig,
    /// Where each sparse sequence's offload file lives (the server's cache folder).
    pub dir: PathBuf,
    /// KV bytes (f16) a sparse sequence keeps in RAM before its older KV goes to its file.
    pub ram_budget: usize,
    /// Bytes of each sparse sequence's cluster cache.
    pub cache_bytes: usize,
    /// Sparse sessions kept between turns (least recently used dropped past it).
    pub max_sessions: usize,
}

impl LongContextConfig {
    /// DynaKV (retrieval budget 2,048, 4 sinks, a recent window of 64) past `after_tokens`,
    /// files in `dir`, 64 MiB of KV in RAM and a 16 MiB cluster cache per sequence, 4
    /// sessions kept.
    pub fn new(after_tokens: usize, dir: PathBuf) -> LongContextConfig {
        LongContextConfig {
            after_tokens,
            sparse: SparseConfig::new(crate::Method::DYNAKV),
            dir,
            ram_budget: 64 << 20,
            cache_bytes: 16 << 20,
            max_sessions: 4,
        }
    }

    /// The most pool bytes a sparse sequence of `tokens` tokens charges (its RAM budget and
    /// cluster cache, sinks, slot tables and index), for admission.
    pub fn sequence_bytes(&self, model: &ModelConfig, tokens: usize) -> usize {
        let heads = model.num_layers * model.num_kv_heads;
        let token = heads * model.head_dim * 4;
        // The RAM tail holds its budget plus one flush and a prefill chunk at most.
        let tail = self.ram_budget.min(tokens * token) + 2 * 256 * token;
        tail + self.cache_bytes + tokens * heads * (4 + 8) + self.sparse.sinks * token
    }
}

/// A sparse session kept between turns.
struct Kept {
    owner: OwnerKey,
    session_id: String,
    /// What `cache` holds, as the next turn must extend it.
    history: History,
    cache: Box<LongKv>,
    last_used: u64,
}

/// The long-context layer (module doc).
pub struct LongContext {
    inner: Box<dyn ContextPolicy>,
    cfg: LongContextConfig,
    model: ModelConfig,
    fingerprint: u64,
    pool: KvPool,
    /// Where kept sessions are saved for a restart (`None`: RAM only). Declared before `kept`
    /// so that it drops first: its writer finishes the queued saves while their live offload
    /// files still have their names (linked, not copied).
    disk: Option<LongDisk>,
    kept: Vec<Kept>,
    clock: u64,
    switches: u64,
    resumes: u64,
    /// Turns resumed from a saved session.
    disk_resumes: u64,
}

impl LongContext {
    /// `inner` with conversations past `cfg.after_tokens` served sparse, for a model of
    /// `model`'s shape and weights `fingerprint`, RAM charged to `pool`.
    pub fn new(inner: Box<dyn ContextPolicy>, cfg: LongContextConfig, model: ModelConfig, fingerprint: u64, pool: KvPool) -> LongContext {
        LongContext {
            inner,
            cfg,
            model,
            fingerprint,
            pool,
            kept: Vec::new(),
            clock: 0,
            switches: 0,
            resumes: 0,
            disk: None,
            disk_resumes: 0,
        }
    }

    /// Saves every session kept at a turn's end to `store` (the session store's disk tier,
    /// sharing its budget, tenant shares and eviction) and resumes saved ones there made for
    /// `cache_fingerprint` (`engram_kv::cache_fingerprint` of the model and the f16 format).
    /// Where the writer thread cannot start, nothing is saved (a warning says so).
    pub fn with_disk(mut self, store: Arc<Mutex<DiskStore>>, cache_fingerprint: &str) -> LongContext {
        match LongDisk::open(store, format!("{cache_fingerprint}-dynakv")) {
            Ok(disk) => {
                tracing::info!("{} saved long conversations found", disk.len());
                self.disk = Some(disk);
            }
            Err(e) => tracing::warn!("long conversations are not saved for a restart: the writer thread did not start: {e}"),
        }
        self
    }

    /// The disk writer's monitor (`None` without a disk store).
    pub fn save_monitor(&self) -> Option<SaveMonitor> {
        self.disk.as_ref().map(LongDisk::monitor)
    }

    /// Sessions saved on disk (0 without a disk store).
    pub fn saved_sessions(&self) -> usize {
        self.disk.as_ref().map_or(0, LongDisk::len)
    }

    /// Sparse sessions kept now.
    pub fn kept_sessions(&self) -> usize {
        self.kept.len()
    }

    /// Whether `owner`'s requests may go sparse (a RAG job's view is spans of chunks: never).
    fn eligible(owner: &OwnerKey) -> bool {
        *owner.kind() != OwnerKind::Rag
    }

    fn offload_config(&self) -> OffloadConfig {
        OffloadConfig {
            ram_budget: self.cfg.ram_budget,
            cache_bytes: self.cfg.cache_bytes,
            ..OffloadConfig::new(self.cfg.dir.clone(), self.fingerprint)
        }
    }

    /// The kept session `req` extends, checked out; a named session it no longer extends is
    /// dropped (its file with it).
    fn resume(&mut self, req: &AdmitRequest<'_>) -> Result<Option<Checkout>, String> {
        let candidates: Vec<usize> = (0..self.kept.len())
            .filter(|&i| &self.kept[i].owner == req.owner && req.session.is_none_or(|s| s == self.kept[i].session_id))
            .collect();
        let saved = self.disk.as_ref().is_some_and(|d| d.has(req.owner, req.session));
        if candidates.is_empty() && !saved {
            return Ok(None);
        }
        // The cold tokenization of the whole prompt, preferred where it agrees with a session.
        let cold = match req.text {
            Some(text) => {
                let enc = req.tok.encode(text, req.add_special).map_err(|e| e.to_string())?;
                let mut ends: Vec<usize> = enc.offsets.iter().map(|o| o.1).collect();
                monotonic(&mut ends);
                (enc.ids, ends)
            }
            None => (req.tokens.to_vec(), vec![0; req.tokens.len()]),
        };
        let found = candidates
            .iter()
            .filter_map(|&i| self.kept[i].history.extended_by(req, &cold).map(|t| (i, t)))
            .max_by_key(|(i, _)| self.kept[*i].history.tokens.len());
        let Some((i, (tokens, token_ends))) = found else {
            if let Some(c) = self.resume_saved(req, &cold) {
                return Ok(Some(c));
            }
            if let Some(session) = req.session {
                // The named conversation went another way: its sparse cache cannot be cut back.
                for &i in candidates.iter().rev() {
                    self.kept.remove(i);
                }
                if let Some(d) = self.disk.as_ref() {
                    d.remove(req.owner.as_str(), session);
                }
            }
            return Ok(None);
        };
        let k = self.kept.remove(i);
        self.resumes += 1;
        let reused = k.history.tokens.len();
        Ok(Some(Checkout {
            cache: Some(k.cache),
            ..Checkout::own(k.session_id, MatchKind::Extend, tokens, token_ends, reused, SeqKv::new(&self.pool))
        }))
    }

    /// The saved session `req` extends, resumed from disk and checked out; `None` (the turn is
    /// recomputed, the reason logged) when none does or its state fails a check.
    fn resume_saved(&mut self, req: &AdmitRequest<'_>, cold: &(Vec<u32>, Vec<usize>)) -> Option<Checkout> {
        let off = self.offload_config();
        let disk = self.disk.as_ref()?;
        let (id, session_id, (tokens, token_ends), held) = disk.extended_by(req.owner, req.session, req, cold)?;
        let kv = match disk.resume(&id, &self.model, self.cfg.sparse, off.clone()) {
            Ok(kv) => kv,
            Err(e) => {
                tracing::warn!("a saved long conversation is not resumed, its turn is recomputed: {e}");
                return None;
            }
        };
        let charged = LongKv::resumed(kv, off, &self.pool).and_then(|mut c| {
            let need = c.ram_bytes();
            if self.free() < need {
                PolicyLayer::make_room(self, need);
            }
            c.charge_held().map(|()| c)
        });
        let cache = match charged {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("a saved long conversation is not resumed, its turn is recomputed: its RAM does not fit the KV budget: {e}");
                return None;
            }
        };
        self.resumes += 1;
        self.disk_resumes += 1;
        tracing::info!("resumed a saved long conversation of {held} tokens from disk");
        Some(Checkout {
            cache: Some(Box::new(cache)),
            ..Checkout::own(session_id, MatchKind::Extend, tokens, token_ends, held, SeqKv::new(&self.pool))
        })
    }

    /// Drops the least recently used kept session; whether there was one.
    fn drop_oldest(&mut self) -> bool {
        let Some(i) = (0..self.kept.len()).min_by_key(|&i| self.kept[i].last_used) else { return false };
        self.kept.remove(i);
        true
    }

    fn free(&self) -> usize {
        self.pool.budget().saturating_sub(self.pool.used())
    }
}

impl PolicyLayer for LongContext {
    fn inner(&self) -> &dyn ContextPolicy {
        &*self.inner
    }

    fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
        &mut *self.inner
    }

    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        if Self::eligible(req.owner) {
            if let Some(c) = self.resume(req)? {
                return Ok(c);
            }
        }
        let c = self.inner.admit(req)?;
        let exact_only = c.tokens.len() <= req.long_context_after.unwrap_or(self.cfg.after_tokens)
            || !Self::eligible(req.owner)
            || !c.spans.is_empty()
            || c.own_first.is_some()
            || c.restore.is_some()
            || c.cache.is_some();
        if exact_only {
            return Ok(c);
        }
        match switch::switch(&self.model, self.cfg.sparse, self.offload_config(), &self.pool, &c.kv, c.reused, c.tokens.len()) {
            Ok((cache, copied)) => {
                self.switches += 1;
                Ok(Checkout { reused: copied, kv: SeqKv::new(&self.pool), cache: Some(Box::new(cache)), ..c })
            }
            Err(e) => {
                tracing::warn!("a long conversation stays on exact KV: {e}");
                Ok(c)
            }
        }
    }

    fn admission_bytes(&self, owner: &OwnerKey, prompt_tokens: usize, long_context_after: Option<usize>) -> Option<usize> {
        if prompt_tokens > long_context_after.unwrap_or(self.cfg.after_tokens) && Self::eligible(owner) {
            return Some(self.cfg.sequence_bytes(&self.model, prompt_tokens));
        }
        self.inner.admission_bytes(owner, prompt_tokens, long_context_after)
    }

    fn make_room(&mut self, bytes: usize) -> bool {
        if self.inner.make_room(bytes) {
            return true;
        }
        while self.free() < bytes && self.drop_oldest() {}
        self.free() >= bytes
    }

    fn retire(&mut self, mut retired: Retired) {
        let Some(cache) = retired.cache.take() else { return self.inner.retire(retired) };
        if !(&*cache as &dyn Any).is::<LongKv>() {
            // Not a cache of this layer: the policy that made it takes it back.
            retired.cache = Some(cache);
            return self.inner.retire(retired);
        }
        let cache = cache.into_any().downcast::<LongKv>().expect("checked above");
        if cache.sparse().len() != retired.tokens.len() || cache.sparse().offload_failure().is_some() {
            return; // not a sound cache of these tokens: nothing kept
        }
        self.kept.retain(|k| !(k.owner == retired.owner && k.session_id == retired.session_id));
        self.clock += 1;
        let history = History { text: retired.text, token_ends: retired.token_ends, tokens: retired.tokens, unfed: retired.unfed };
        if let Some(d) = self.disk.as_ref() {
            if let Err(e) = d.save(&retired.owner, &retired.session_id, &history, cache.sparse(), &self.pool) {
                tracing::warn!("a long conversation is not saved for a restart: {e}");
            }
        }
        self.kept.push(Kept { owner: retired.owner, session_id: retired.session_id, history, cache, last_used: self.clock });
        while self.kept.len() > self.cfg.max_sessions.max(1) {
            self.drop_oldest();
        }
    }

    /// The inner policy's work first; then, while saves are pending, up to 20 ms of waiting
    /// for the writer (none once a job waits), so the gauges refreshed after the idle hook
    /// show them written.
    fn idle_slice(&mut self, interrupt: &IdleInterrupt) -> bool {
        if self.inner.idle_slice(interrupt) {
            return true;
        }
        let Some(d) = self.disk.as_ref() else { return false };
        if interrupt.requested() {
            return d.pending() > 0;
        }
        d.wait_idle(std::time::Duration::from_millis(20))
    }

    fn forget_owner(&mut self, owner: &OwnerKey) {
        self.kept.retain(|k| &k.owner != owner);
        if let Some(d) = self.disk.as_ref() {
            d.remove_owner(owner.as_str());
        }
        self.inner.forget_owner(owner)
    }

    fn stats(&self) -> PolicyStats {
        let mut st = self.inner.stats();
        let saves = self.disk.as_ref().map(LongDisk::counters).unwrap_or_default();
        let ram: usize = self.kept.iter().map(|k| k.cache.charged_bytes()).sum();
        let disk: u64 = self
            .kept
            .iter()
            .filter_map(|k| k.cache.sparse().offload_path())
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        st.named.extend([
            PolicyGauge {
                name: "engram_long_context_sessions",
                help: "Sparse (DynaKV) sessions kept between turns",
                kind: GaugeKind::Gauge,
                value: self.kept.len() as u64,
            },
            PolicyGauge {
                name: "engram_long_context_ram_bytes",
                help: "KV pool bytes charged by kept sparse sessions (index, sinks, recent window, cluster cache)",
                kind: GaugeKind::Gauge,
                value: ram as u64,
            },
            PolicyGauge {
                name: "engram_long_context_offload_bytes",
                help: "Bytes of kept sparse sessions' offload files",
                kind: GaugeKind::Gauge,
                value: disk,
            },
            PolicyGauge {
                name: "engram_long_context_saved_sessions",
                help: "Sparse (DynaKV) sessions saved on disk for a restart",
                kind: GaugeKind::Gauge,
                value: self.saved_sessions() as u64,
            },
            PolicyGauge {
                name: "engram_long_context_saved_bytes",
                help: "Bytes of saved sparse sessions in the disk store (counted against the disk budget)",
                kind: GaugeKind::Gauge,
                value: self.disk.as_ref().map_or(0, LongDisk::bytes),
            },
            PolicyGauge {
                name: "engram_long_context_disk_resumes_total",
                help: "Turns resumed from a saved sparse session without a re-prefill",
                kind: GaugeKind::Counter,
                value: self.disk_resumes,
            },
            PolicyGauge {
                name: "engram_long_context_save_failures_total",
                help: "Sparse sessions not saved for a restart (disk budget, share or I/O)",
                kind: GaugeKind::Counter,
                value: saves.failed,
            },
            PolicyGauge {
                name: "engram_long_context_saves_total",
                help: "Saves of sparse sessions asked for at turn ends (written, skipped, failed or pending)",
                kind: GaugeKind::Counter,
                value: saves.asked,
            },
            PolicyGauge {
                name: "engram_long_context_saves_pending",
                help: "Saves and removals of saved sparse sessions queued or being written by the writer thread",
                kind: GaugeKind::Gauge,
                value: self.disk.as_ref().map_or(0, LongDisk::pending) as u64,
            },
            PolicyGauge {
                name: "engram_long_context_saves_skipped_total",
                help: "Saves of sparse sessions skipped unwritten because a newer save or a removal replaced them",
                kind: GaugeKind::Counter,
                value: saves.skipped,
            },
            PolicyGauge {
                name: "engram_long_context_save_waits_total",
                help: "Turns that waited for a save of their owner's sparse sessions to be written before resuming from disk",
                kind: GaugeKind::Counter,
                value: saves.waits,
            },
            PolicyGauge {
                name: "engram_long_context_switches_total",
                help: "Conversations switched from exact KV to a sparse cache",
                kind: GaugeKind::Counter,
                value: self.switches,
            },
            PolicyGauge {
                name: "engram_long_context_resumes_total",
                help: "Turns that extended a kept sparse session without a re-prefill",
                kind: GaugeKind::Counter,
                value: self.resumes,
            },
        ]);
        st
    }
}
