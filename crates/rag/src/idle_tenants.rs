//! [`IdleTenants`]: the users whose idle-time population ([`crate::PerCache`]) the engine
//! thread runs while no request waits (`engram serve --rag-idle on`).
//!
//! ```text
//!  handlers (blocking pool):  Library::ingest_text / remove / plan / record ─► after_ingest / after_query
//!                             IdleTenants::wake(tenant) ─► engine Command::Wake
//!  engine thread:             TreePolicy::next_background ─► IdleTenants::next (round robin over woken
//!                             tenants) ─► try_lock(Library) ─► Library::idle_unit_in_engine(pool, tenant's
//!                             tree): ONE unit, its model work a Low background job of the engine
//!                             (nothing left: the tenant sleeps until its next wake)
//! ```
//! The library is held only while a unit plans or stores, never while the model runs, so a
//! handler never waits for a unit's model work; the unit's job yields to requests step by step
//! (the engine's background share). [`IdleTenants::waiting`] counts the handlers waiting for
//! or using a library, for callers that run units on their own thread
//! ([`crate::PerCache::idle_unit_over`] with an interrupt that reads it).
//!
//! Invariants: the engine thread never blocks on a library (a library a handler holds is
//! skipped until the next ask); a unit's
//! KV goes into the same per-tenant chunk KV tree the tenant's RAG jobs start from, and its
//! answers into the same QA bank they consult, so what idle time stores is what a query
//! would have stored (`crates/server/tests/it/rag_idle.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use crate::idle::budget::{LoadSource, SystemLoad, Throttle};
use crate::idle::{UnitKind, UnitReport};
use crate::library::Library;

/// Unit kinds in the order [`IdleCounters::units`] counts them.
pub const UNIT_KINDS: [UnitKind; 8] = [
    UnitKind::Answer,
    UnitKind::Prefill,
    UnitKind::Skip,
    UnitKind::Regenerate,
    UnitKind::KvToQa,
    UnitKind::QaToKv,
    UnitKind::Predict,
    UnitKind::RealAnswer,
];

/// Idle-time counters over every tenant (the server renders them in `/metrics`).
#[derive(Default, Debug)]
pub struct IdleCounters {
    /// Units run, by kind (indices of [`UNIT_KINDS`]).
    pub units: [AtomicU64; 8],
    /// Questions predicted.
    pub predicted: AtomicU64,
    /// QA entries stored by idle units (answers, regenerations, KV→QA conversions).
    pub qa_populated: AtomicU64,
    /// Units that prefilled chunk KV into the tree without answering (prefill, QA→KV).
    pub kv_populated: AtomicU64,
    /// Prompt tokens idle units prefilled.
    pub prefill_tokens: AtomicU64,
    /// Microseconds spent in units, and the longest unit.
    pub compute_us: AtomicU64,
    pub longest_unit_us: AtomicU64,
    /// Units that failed (logged; the tenant sleeps until its next wake).
    pub errors: AtomicU64,
    /// Units stopped at a step boundary because a request waited (nothing stored; run again).
    pub interrupted: AtomicU64,
    /// The longest stretch, in microseconds, between two asks of the interrupt in any unit:
    /// the longest a request waited for idle work to yield.
    pub longest_step_us: AtomicU64,
    /// For interrupted units: microseconds from the first waiting handler's arrival
    /// ([`IdleTenants::waiting`]) to the unit's return (it has let go of its work) — summed,
    /// and the longest.
    pub yield_us: AtomicU64,
    pub longest_yield_us: AtomicU64,
    /// The idle budget now: the share of wall time idle units may take, in thousandths
    /// (`idle/budget.rs`; 0 until first read, which [`IdleCounters::budget_share`] shows as 1).
    pub budget_permille: AtomicU64,
    /// Microseconds idle work rested after units to stay within the budget.
    pub rest_us: AtomicU64,
}

impl IdleCounters {
    /// Counts one unit's report; `predicted` questions were made during it.
    pub fn count(&self, r: &UnitReport, predicted: u64) {
        self.predicted.fetch_add(predicted, Relaxed);
        self.longest_step_us.fetch_max((r.longest_step_ms * 1e3) as u64, Relaxed);
        let us = (r.ms * 1e3) as u64;
        self.compute_us.fetch_add(us, Relaxed);
        if r.interrupted {
            self.interrupted.fetch_add(1, Relaxed);
            return;
        }
        self.longest_unit_us.fetch_max(us, Relaxed);
        let i = UNIT_KINDS.iter().position(|k| *k == r.kind).expect("every kind is listed");
        self.units[i].fetch_add(1, Relaxed);
        if matches!(r.kind, UnitKind::Answer | UnitKind::Regenerate | UnitKind::KvToQa | UnitKind::RealAnswer) {
            self.qa_populated.fetch_add(1, Relaxed);
        }
        if matches!(r.kind, UnitKind::Prefill | UnitKind::QaToKv) && r.prefill_tokens > 0 {
            self.kv_populated.fetch_add(1, Relaxed);
        }
        self.prefill_tokens.fetch_add(r.prefill_tokens as u64, Relaxed);
    }

    /// The idle budget as a share in `(0, 1]` (1 before the first reading).
    pub fn budget_share(&self) -> f64 {
        match self.budget_permille.load(Relaxed) {
            0 => 1.0,
            v => v as f64 / 1e3,
        }
    }

    /// Units finished, all kinds (interrupted ones are counted in `interrupted`).
    pub fn total_units(&self) -> u64 {
        self.units.iter().map(|u| u.load(Relaxed)).sum()
    }
}

struct Tenant {
    library: Arc<Mutex<Library>>,
    /// Where the tenant's chunk KV tree persists (see [`crate::PromptSegments::tree_dir`]).
    tree_dir: Option<PathBuf>,
    /// Woken and not yet found without work.
    pending: bool,
}

#[derive(Default)]
struct Inner {
    tenants: BTreeMap<String, Tenant>,
    /// The tenant after which the next search starts (round robin).
    last: Option<String>,
}

/// A tenant to run one unit for.
pub(crate) struct Next {
    pub tenant: String,
    pub library: Arc<Mutex<Library>>,
    pub tree_dir: Option<PathBuf>,
}

/// Shared by the handlers (which add and wake tenants) and the engine thread's
/// [`crate::TreePolicy`] (which runs their units). See the module doc.
#[derive(Clone)]
pub struct IdleTenants {
    inner: Arc<Mutex<Inner>>,
    counters: Arc<IdleCounters>,
    /// Handlers waiting for or using a library (see [`IdleTenants::waiting`]), and since when
    /// the count has been above zero.
    waiters: Arc<AtomicUsize>,
    since: Arc<Mutex<Option<std::time::Instant>>>,
    /// The idle budget (CPU load, battery) the engine thread keeps units within.
    throttle: Arc<Mutex<Throttle>>,
}

impl Default for IdleTenants {
    /// The system's load and battery as the budget's inputs (`/proc/loadavg`,
    /// `/sys/class/power_supply`); units run on the kernels' threads.
    fn default() -> Self {
        IdleTenants::with_load_source(Box::new(SystemLoad::default()))
    }
}

/// A handler counted as waiting while this lives (see [`IdleTenants::waiting`]).
#[must_use = "the handler counts as waiting only while the guard lives"]
pub struct Waiting {
    waiters: Arc<AtomicUsize>,
    since: Arc<Mutex<Option<std::time::Instant>>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if self.waiters.fetch_sub(1, Relaxed) == 1 {
            *since = None;
        }
    }
}

impl IdleTenants {
    /// Tenants whose idle budget reads `source` (tests feed fixed values).
    pub fn with_load_source(source: Box<dyn LoadSource>) -> IdleTenants {
        IdleTenants {
            inner: Arc::default(),
            counters: Arc::default(),
            waiters: Arc::default(),
            since: Arc::default(),
            throttle: Arc::new(Mutex::new(Throttle::new(source, engram_kernels::num_threads() as f64))),
        }
    }

    /// The budget's state (the engine thread's [`crate::TreePolicy`] keeps units within it).
    pub(crate) fn throttle(&self) -> MutexGuard<'_, Throttle> {
        self.throttle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters (shared).
    pub fn counters(&self) -> Arc<IdleCounters> {
        self.counters.clone()
    }

    /// Counts the caller as a request waiting for (or using) a library until the guard drops:
    /// the idle unit running meanwhile stops at its next model step. Take it before locking.
    pub fn waiting(&self) -> Waiting {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if self.waiters.fetch_add(1, Relaxed) == 0 {
            *since = Some(std::time::Instant::now());
        }
        Waiting { waiters: self.waiters.clone(), since: self.since.clone() }
    }

    /// Since when some handler has been waiting (`None`: none is).
    pub(crate) fn waiting_since(&self) -> Option<std::time::Instant> {
        *self.since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The count [`IdleTenants::waiting`] keeps (for `IdleInterrupt::or_while`).
    pub fn waiters(&self) -> Arc<AtomicUsize> {
        self.waiters.clone()
    }

    /// Registers `tenant`'s library (its idle population enabled) and wakes it.
    pub fn add(&self, tenant: &str, library: Arc<Mutex<Library>>, tree_dir: Option<PathBuf>) {
        self.lock().tenants.insert(tenant.to_string(), Tenant { library, tree_dir, pending: true });
    }

    /// Marks `tenant` as having idle work (after an ingest, removal or query); unknown
    /// tenants are ignored.
    pub fn wake(&self, tenant: &str) {
        if let Some(t) = self.lock().tenants.get_mut(tenant) {
            t.pending = true;
        }
    }

    /// Whether some tenant has idle work.
    pub fn any_pending(&self) -> bool {
        self.lock().tenants.values().any(|t| t.pending)
    }

    /// The next woken tenant after the last one served (round robin).
    pub(crate) fn next(&self) -> Option<Next> {
        let mut g = self.lock();
        let after = g.last.clone();
        let pick = {
            let mut later = g.tenants.iter().filter(|(k, t)| t.pending && after.as_ref().is_none_or(|a| *k > a));
            let first = later.next().map(|(k, _)| k.clone());
            first.or_else(|| g.tenants.iter().find(|(_, t)| t.pending).map(|(k, _)| k.clone()))
        }?;
        g.last = Some(pick.clone());
        let t = &g.tenants[&pick];
        Some(Next { tenant: pick.clone(), library: t.library.clone(), tree_dir: t.tree_dir.clone() })
    }

    /// `tenant`'s library, if registered.
    pub(crate) fn library(&self, tenant: &str) -> Option<Arc<Mutex<Library>>> {
        self.lock().tenants.get(tenant).map(|t| t.library.clone())
    }

    /// `tenant` has nothing left to do until its next wake.
    pub(crate) fn sleep(&self, tenant: &str) {
        if let Some(t) = self.lock().tenants.get_mut(tenant) {
            t.pending = false;
        }
    }
}

/// The library if no one holds it (a poisoned lock is taken over: the library's state is
/// whole after every call); `None` while a handler uses it.
pub(crate) fn try_library(library: &Mutex<Library>) -> Option<MutexGuard<'_, Library>> {
    match library.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}
