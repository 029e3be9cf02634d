//! [`PolicyStats`]: the gauges every policy reports (sessions idle, on disk, restored, disk
//! bytes) and, by name, any of its own ([`PolicyGauge`]: a dual-stream ring's evicted turns,
//! say), which the server's `/metrics` renders as they come.
//!
//! Invariant: a named gauge's `name` is its full Prometheus name, the same on every report.

/// Whether a named gauge only grows (a counter since start) or goes up and down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GaugeKind {
    Counter,
    Gauge,
}

/// One policy-specific number for `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyGauge {
    /// Its Prometheus name (`engram_…`).
    pub name: &'static str,
    /// Its `# HELP` text.
    pub help: &'static str,
    pub kind: GaugeKind,
    pub value: u64,
}

/// Gauges a policy reports (the server's `/metrics`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyStats {
    pub sessions_idle: u64,
    pub sessions_on_disk: u64,
    pub sessions_restored: u64,
    pub disk_bytes_used: u64,
    /// The policy's own numbers, in the order they are rendered.
    pub named: Vec<PolicyGauge>,
}

impl PolicyStats {
    /// The named gauge `name`'s value, if the policy reports it.
    pub fn named(&self, name: &str) -> Option<u64> {
        self.named.iter().find(|g| g.name == name).map(|g| g.value)
    }
}
