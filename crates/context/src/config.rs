//! [`SessionsConfig`]: what the session policy is built from (how many idle sessions stay in
//! RAM, the disk tier, prefix sharing across tenants), and [`SessionStore::from_config`], the
//! one place a configuration becomes a store.
//!
//! Invariant: a store built from a configuration with a disk tier that cannot be opened still
//! serves from RAM (the failure is logged), so a bad data directory never stops the engine.

use engram_kv::{EvictionPolicy, KvPool};
use engram_model::Model;

use crate::{PersistedSessions, SessionStore};

/// The disk tier: where sessions (and, beside them, other policies' files) persist across
/// restarts, under a byte budget.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// The directory of the KV store (`<data dir>/kv`).
    pub dir: std::path::PathBuf,
    /// Most bytes the entries take on disk.
    pub budget_bytes: u64,
    /// Which entries go first when the budget is passed.
    pub policy: EvictionPolicy,
    /// Most bytes one account's entries (its sessions, agents' pinned ones, prefix chains)
    /// take of the budget; past it the account's own entries are evicted first (`None`: the
    /// whole budget).
    pub tenant_share_bytes: Option<u64>,
}

/// How the session policy is built.
#[derive(Clone, Debug)]
pub struct SessionsConfig {
    /// Most idle sessions kept in RAM.
    pub max_sessions: usize,
    /// Where sessions persist across restarts (`None`: RAM only).
    pub disk: Option<DiskConfig>,
    /// Let every tenant reuse every tenant's shared prefix blocks (default false: chains are
    /// salted per tenant, so `cached_tokens` never reveal another tenant's text).
    pub share_prefixes_across_tenants: bool,
    /// The remote tier under RAM and disk that a fleet of servers shares (`None`: none).
    pub remote: Option<engram_remote::RemoteTier>,
    /// Most prompt tokens the engine writes in one step (its prefill chunk): a model with
    /// sliding layers releases their rows between steps, so admission sizes a prompt by it
    /// ([`SessionStore::bytes_for`]).
    pub prefill_step: usize,
    /// Whether sessions of a model with sliding layers also keep those layers' window before
    /// spaced points of their history (default true: an edit anywhere resumes near it, for at
    /// most `3·log2(len / spacing)` more windows; false: only the windows before the last
    /// turns, so an edit before them recomputes from further back). See
    /// [`SessionStore::with_spaced_windows`].
    pub spaced_windows: bool,
}

/// The engine's default prefill chunk (`engram_engine::SchedulerConfig::prefill_chunk`).
pub const DEFAULT_PREFILL_STEP: usize = 256;

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            max_sessions: 256,
            disk: None,
            share_prefixes_across_tenants: false,
            remote: None,
            prefill_step: DEFAULT_PREFILL_STEP,
            spaced_windows: true,
        }
    }
}

impl SessionStore {
    /// The session store `config` describes for `model`'s caches in `pool`: sessions matched by
    /// characters, the shared prefix index, and persistence to `config.disk` when given (RAM
    /// only, with a warning, if its directory cannot be opened).
    pub fn from_config(model: &Model, pool: &KvPool, config: &SessionsConfig) -> SessionStore {
        let mut sessions = SessionStore::new(pool.clone(), model.fingerprint)
            .with_max_sessions(config.max_sessions)
            .with_shared_prefixes_across_tenants(config.share_prefixes_across_tenants)
            .with_sliding(engram_kv::SlidingLayers::of(&model.config))
            .with_prefill_step(config.prefill_step)
            .with_spaced_windows(config.spaced_windows);
        if let Some(d) = &config.disk {
            let fp = engram_kv::cache_fingerprint(model.fingerprint, pool.format());
            match PersistedSessions::open(&d.dir, d.budget_bytes, d.policy, fp) {
                Ok(p) => {
                    p.set_tenant_share(d.tenant_share_bytes);
                    sessions = sessions.with_disk(p, model.config.vocab);
                    tracing::info!("{} persisted sessions found in {}", sessions.on_disk_count(), d.dir.display());
                }
                Err(e) => tracing::warn!("sessions will not persist: {e}"),
            }
        }
        if let Some(r) = &config.remote {
            let fp = engram_kv::cache_fingerprint(model.fingerprint, pool.format());
            sessions = sessions.with_remote(r.for_model(fp));
        }
        sessions
    }
}
