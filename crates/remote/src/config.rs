//! [`RemoteConfig`]: where the tier is and how it is used.

use std::time::Duration;

/// Tokens per run by default: 16 blocks. One value per run (not per block), so a 4K-token
/// session is 8 values, fetched with one pipelined `MGET`.
pub const DEFAULT_RUN_TOKENS: usize = 16 * engram_kv::BLOCK_TOKENS;
/// The default timeout of every round trip (connecting included).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);
/// Writes waiting for the writer thread by default; past it new writes are dropped (counted).
pub const DEFAULT_MAX_QUEUED: usize = 64;

/// How the remote tier is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    /// `redis://[user:password@]host:port[/db]` (Redis or Valkey), or `rediss://…` for TLS:
    /// every tenant's keys unless `tenant_urls` names the tenant.
    pub url: String,
    /// Per tenant, the URL whose user (a Redis ACL user allowed only that tenant's key
    /// pattern, [`crate::tenant_key_pattern`]) reads and writes that tenant's keys.
    pub tenant_urls: Vec<(String, String)>,
    /// Timeout of every round trip: a slow store costs a request at most about this per trip.
    pub timeout: Duration,
    /// Tokens per run value (a multiple of the block size).
    pub run_tokens: usize,
    /// Most writes waiting for the writer thread.
    pub max_queued: usize,
    /// For `rediss://` URLs: the PEM certificate(s) of the authority that signed the store's
    /// certificate (`None`: the system's trusted roots).
    pub ca_pem: Option<Vec<u8>>,
}

impl RemoteConfig {
    /// The defaults for the store at `url`.
    pub fn new(url: impl Into<String>) -> RemoteConfig {
        RemoteConfig {
            url: url.into(),
            tenant_urls: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            run_tokens: DEFAULT_RUN_TOKENS,
            max_queued: DEFAULT_MAX_QUEUED,
            ca_pem: None,
        }
    }

    /// The URL `tenant`'s keys go through (`None`: chains shared across tenants).
    pub fn url_for(&self, tenant: Option<&str>) -> &str {
        tenant.and_then(|t| self.tenant_urls.iter().find(|(name, _)| name == t)).map_or(&self.url, |(_, url)| url)
    }
}
