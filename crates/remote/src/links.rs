//! The links one user of the tier (the engine thread, the writer thread, the record readers)
//! holds: one per store URL, made on first use.
//!
//! Invariant: a tenant's keys only ever travel through the link of the URL
//! [`RemoteConfig::url_for`] gives that tenant.

use std::collections::HashMap;

use crate::link::{Link, LinkError};
use crate::stats::Stats;
use crate::RemoteConfig;

/// Links by URL.
pub struct Links {
    config: RemoteConfig,
    stats: Stats,
    by_url: HashMap<String, Link>,
}

impl Links {
    /// No links yet.
    pub fn new(config: RemoteConfig, stats: Stats) -> Links {
        Links { config, stats, by_url: HashMap::new() }
    }

    /// The configured timeout of a round trip.
    pub fn timeout(&self) -> std::time::Duration {
        self.config.timeout
    }

    /// Runs `f` on the connection for `tenant`'s keys (`None`: keys shared across tenants).
    pub fn run<T>(
        &mut self,
        tenant: Option<&str>,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, LinkError> {
        self.link(tenant)?.run(f)
    }

    /// [`Link::mget_each`] on the link for `tenant`'s keys.
    pub fn mget_each(
        &mut self,
        tenant: Option<&str>,
        keys: &[String],
        timeout: std::time::Duration,
        each: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<(), LinkError> {
        self.link(tenant)?.mget_each(keys, timeout, each)
    }

    fn link(&mut self, tenant: Option<&str>) -> Result<&mut Link, LinkError> {
        let url = self.config.url_for(tenant).to_string();
        if !self.by_url.contains_key(&url) {
            let link = Link::new(&url, self.config.timeout, self.config.ca_pem.as_deref(), self.stats.clone())?;
            self.by_url.insert(url.clone(), link);
        }
        Ok(self.by_url.get_mut(&url).expect("inserted above"))
    }
}
