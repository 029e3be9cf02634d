//! `/metrics` lines of the remote KV tier (`--kv-remote`): lookups, hits, tokens restored,
//! errors and bad values, bytes each way, writes done, failed, dropped and skipped.
//!
//! Invariant: every line is read from one [`RemoteStats`] snapshot; rendering changes nothing.

use engram_remote::RemoteStats;

/// Prometheus lines of the remote tier's counters.
pub(crate) fn render(s: &RemoteStats) -> String {
    let lines: [(&str, &str, &str, u64); 12] = [
        ("engram_remote_lookups_total", "counter", "Lookups in the remote tier on a local miss.", s.lookups),
        ("engram_remote_hits_total", "counter", "Remote lookups that found something usable.", s.hits),
        ("engram_remote_tokens_restored_total", "counter", "Tokens of KV restored from the remote tier.", s.tokens_restored),
        (
            "engram_remote_read_errors_total",
            "counter",
            "Remote reads that failed (down, timed out, refused) or were skipped during a backoff.",
            s.read_errors,
        ),
        (
            "engram_remote_bad_values_total",
            "counter",
            "Remote values that failed a check (checksum, fingerprint, owner, tokens): misses.",
            s.bad_values,
        ),
        ("engram_remote_read_bytes_total", "counter", "Bytes of values read from the remote tier.", s.bytes_read),
        ("engram_remote_writes_total", "counter", "Writes to the remote tier completed.", s.writes),
        ("engram_remote_write_errors_total", "counter", "Writes the remote tier failed.", s.write_errors),
        (
            "engram_remote_writes_dropped_total",
            "counter",
            "Writes dropped before the remote tier (queue full, shed to free RAM, backoff).",
            s.writes_dropped,
        ),
        ("engram_remote_written_bytes_total", "counter", "Bytes of values written to the remote tier.", s.bytes_written),
        ("engram_remote_runs_skipped_total", "counter", "Runs not written because the remote tier held them.", s.runs_skipped),
        ("engram_remote_connected", "gauge", "1 while the last attempt to reach the remote tier succeeded.", s.connected as u64),
    ];
    let mut out = String::new();
    for (name, kind, help, v) in lines {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"));
    }
    out
}
