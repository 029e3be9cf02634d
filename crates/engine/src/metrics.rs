//! Engine and server metrics, rendered as Prometheus text (the server serves it at
//! `GET /metrics`).
//!
//! Counters are atomics written by request handlers and the engine thread; the
//! histograms have fixed buckets (seconds). Gauges that belong to the engine
//! (KV bytes in use, sessions, queue) are read at render time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use engram_policy::{GaugeKind, PolicyGauge};

const BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A latency histogram.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, seconds: f64) {
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            if seconds <= *b {
                c.fetch_add(1, Relaxed);
            }
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_us.fetch_add((seconds * 1e6) as u64, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", c.load(Relaxed));
        }
        let n = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {n}");
    }
}

/// Everything `/metrics` reports.
#[derive(Default)]
pub struct Metrics {
    /// `(route, status) -> count`.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Cache lookups by how they matched (exact, extend, diverge, prefix, miss).
    lookups: Mutex<BTreeMap<String, u64>>,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub tokens_reused: AtomicU64,
    pub tokens_computed: AtomicU64,
    pub tokens_generated: AtomicU64,
    pub cancelled: AtomicU64,
    pub steps: AtomicU64,
    /// Sessions restored from disk whose checksum then failed (recomputed cold).
    pub restores_failed: AtomicU64,
    /// Steps whose forward pass or sampling panicked (their sequences failed; the engine went on).
    pub step_faults: AtomicU64,
    /// Draft tokens verified by speculative decoding, and those accepted (`speculate.rs`).
    pub draft_tokens: AtomicU64,
    pub draft_tokens_accepted: AtomicU64,
    /// Forward work run for the context policy (`ContextPolicy::next_background`): jobs
    /// ended, those that failed, and the rows (prompt and generated tokens) they computed.
    pub background_jobs: AtomicU64,
    pub background_failed: AtomicU64,
    pub background_rows: AtomicU64,
    pub ttft: Histogram,
    pub inter_token: Histogram,
    /// Gauges the engine thread refreshes after each step.
    pub kv_bytes_used: AtomicU64,
    pub kv_bytes_budget: AtomicU64,
    pub sessions_idle: AtomicU64,
    pub sessions_on_disk: AtomicU64,
    pub sessions_restored: AtomicU64,
    pub disk_bytes_used: AtomicU64,
    pub sequences_running: AtomicU64,
    pub requests_waiting: AtomicU64,
    /// The context policy's own gauges and counters (`PolicyStats::named`), as last reported.
    policy: Mutex<Vec<PolicyGauge>>,
}

impl Metrics {
    /// Counts one finished HTTP request.
    pub fn count_request(&self, route: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((route.to_string(), status)).or_insert(0) += 1;
    }

    /// Counts one cache lookup by its match kind.
    pub fn count_match(&self, kind: &str) {
        let mut m = self.lookups.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(kind.to_string()).or_insert(0) += 1;
    }

    /// Takes back one [`Metrics::count_match`] of `kind` (a request admitted
    /// again after its restore failed is counted once).
    pub fn uncount_match(&self, kind: &str) {
        let mut m = self.lookups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(kind) {
            *n = n.saturating_sub(1);
        }
    }

    /// Replaces the context policy's named gauges (the engine thread, after each step).
    pub fn set_policy_gauges(&self, gauges: Vec<PolicyGauge>) {
        *self.policy.lock().unwrap_or_else(|e| e.into_inner()) = gauges;
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP engram_requests_total HTTP requests by route and status.\n# TYPE engram_requests_total counter");
        for ((route, status), n) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "engram_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
        }
        let _ = writeln!(out, "# HELP engram_cache_lookups_total Cache lookups by match path.\n# TYPE engram_cache_lookups_total counter");
        for (kind, n) in self.lookups.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "engram_cache_lookups_total{{path=\"{kind}\"}} {n}");
        }
        let counters: [(&str, &str, &AtomicU64); 14] = [
            ("engram_cache_hits_total", "Requests that reused cached tokens.", &self.cache_hits),
            ("engram_cache_misses_total", "Requests that reused nothing.", &self.cache_misses),
            ("engram_prompt_tokens_reused_total", "Prompt tokens served from the KV cache.", &self.tokens_reused),
            ("engram_prompt_tokens_computed_total", "Prompt tokens prefilled.", &self.tokens_computed),
            ("engram_generated_tokens_total", "Tokens sampled.", &self.tokens_generated),
            ("engram_cancelled_total", "Sequences cancelled because the client went away.", &self.cancelled),
            ("engram_steps_total", "Batched forward steps.", &self.steps),
            ("engram_restores_failed_total", "Restored sessions whose file failed its checksum (recomputed cold).", &self.restores_failed),
            ("engram_step_faults_total", "Steps that panicked (their sequences failed with an engine fault).", &self.step_faults),
            (
                "engram_background_jobs_total",
                "Forward work run for the context policy (state entries, summaries), ended.",
                &self.background_jobs,
            ),
            ("engram_background_failed_total", "Background jobs that ended without a result.", &self.background_failed),
            ("engram_background_rows_total", "Rows (tokens) computed by background jobs.", &self.background_rows),
            ("engram_draft_tokens_total", "Draft tokens verified by speculative decoding (prompt lookup).", &self.draft_tokens),
            (
                "engram_draft_tokens_accepted_total",
                "Draft tokens accepted (the acceptance rate is their ratio).",
                &self.draft_tokens_accepted,
            ),
        ];
        let gauges: [(&str, &str, &AtomicU64); 8] = [
            ("engram_sessions_on_disk", "Persisted sessions not loaded in RAM.", &self.sessions_on_disk),
            ("engram_sessions_restored", "Sessions restored from disk since start (warm hits).", &self.sessions_restored),
            ("engram_kv_disk_bytes_used", "Persisted KV cache on disk (bytes).", &self.disk_bytes_used),
            ("engram_kv_bytes_used", "KV cache RAM in use (bytes).", &self.kv_bytes_used),
            ("engram_kv_bytes_budget", "KV cache RAM budget (bytes).", &self.kv_bytes_budget),
            ("engram_sessions_idle", "Cached sessions not in use.", &self.sessions_idle),
            ("engram_sequences_running", "Sequences in the batch.", &self.sequences_running),
            ("engram_requests_waiting", "Requests queued for admission.", &self.requests_waiting),
        ];
        // The policy's own numbers follow the engine's of their kind.
        let policy = self.policy.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (kind, family, policy_kind) in [("counter", &counters[..], GaugeKind::Counter), ("gauge", &gauges[..], GaugeKind::Gauge)] {
            let own = policy.iter().filter(|g| g.kind == policy_kind).map(|g| (g.name, g.help, g.value));
            for (name, help, v) in family.iter().map(|(n, h, v)| (*n, *h, v.load(Relaxed))).chain(own) {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
            }
        }
        self.ttft.render(&mut out, "engram_time_to_first_token_seconds", "From submission to the first sampled token.");
        self.inter_token.render(&mut out, "engram_inter_token_seconds", "Between consecutive tokens of a sequence.");
        out
    }
}
