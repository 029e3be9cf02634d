//! `/metrics` lines of the RAG routes' idle-time population (PerCache in the engine's idle
//! hook): units by kind, predictions, what they stored, compute, and how fast they yield to
//! requests (interruptions, the longest step, arrival-to-let-go times), and the idle budget
//! that load and battery set.
//!
//! Invariant: every line is read from `engram_rag::IdleCounters` (relaxed loads); rendering
//! changes nothing.

use std::sync::atomic::Ordering::Relaxed;

use engram_rag::{IdleCounters, UNIT_KINDS};

/// Prometheus lines of idle-time population (all tenants).
pub(crate) fn render_idle(c: &IdleCounters) -> String {
    let mut out = String::from(
        "# HELP engram_rag_idle_units_total Idle-time RAG units run (PerCache), by kind.\n# TYPE engram_rag_idle_units_total counter\n",
    );
    for (k, n) in UNIT_KINDS.iter().zip(&c.units) {
        let kind = serde_json::to_value(k).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        out.push_str(&format!("engram_rag_idle_units_total{{kind=\"{kind}\"}} {}\n", n.load(Relaxed)));
    }
    let lines: [(&str, &str, &str, f64); 13] = [
        (
            "engram_rag_idle_budget",
            "gauge",
            "Share of wall time idle units may take now, from CPU load and battery (1: no adjustment).",
            c.budget_share(),
        ),
        (
            "engram_rag_idle_rest_ms_total",
            "counter",
            "Milliseconds idle work rested to stay within its budget.",
            c.rest_us.load(Relaxed) as f64 / 1e3,
        ),
        ("engram_rag_idle_predicted_queries_total", "counter", "Questions predicted in idle time.", c.predicted.load(Relaxed) as f64),
        ("engram_rag_idle_qa_populated_total", "counter", "QA bank entries stored by idle units.", c.qa_populated.load(Relaxed) as f64),
        (
            "engram_rag_idle_kv_populated_total",
            "counter",
            "Predicted prompts prefilled into the chunk KV tree by idle units.",
            c.kv_populated.load(Relaxed) as f64,
        ),
        ("engram_rag_idle_prefill_tokens_total", "counter", "Prompt tokens idle units prefilled.", c.prefill_tokens.load(Relaxed) as f64),
        ("engram_rag_idle_compute_ms_total", "counter", "Milliseconds spent in idle units.", c.compute_us.load(Relaxed) as f64 / 1e3),
        (
            "engram_rag_idle_longest_unit_ms",
            "gauge",
            "The longest idle unit (a request waits at most this long for one).",
            c.longest_unit_us.load(Relaxed) as f64 / 1e3,
        ),
        ("engram_rag_idle_errors_total", "counter", "Idle units that failed (logged).", c.errors.load(Relaxed) as f64),
        (
            "engram_rag_idle_interrupted_total",
            "counter",
            "Idle units stopped at a model step because a request waited (nothing stored; run again later).",
            c.interrupted.load(Relaxed) as f64,
        ),
        (
            "engram_rag_idle_longest_step_ms",
            "gauge",
            "The longest stretch between two interrupt checks in an idle unit (a request waits at most about this long).",
            c.longest_step_us.load(Relaxed) as f64 / 1e3,
        ),
        (
            "engram_rag_idle_yield_ms_total",
            "counter",
            "Milliseconds from a RAG request's arrival to the idle unit it interrupted letting go, summed over interrupted units.",
            c.yield_us.load(Relaxed) as f64 / 1e3,
        ),
        (
            "engram_rag_idle_longest_yield_ms",
            "gauge",
            "The longest a RAG request waited for an interrupted idle unit to let go.",
            c.longest_yield_us.load(Relaxed) as f64 / 1e3,
        ),
    ];
    for (name, kind, help, v) in lines {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"));
    }
    out
}
