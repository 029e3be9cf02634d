//! `engram bench facts`, second part: the stall a request sees when it arrives while its user's
//! facts are being summarized, through the real engine thread.
//!
//! Three engines per round, side by side, each with the same user (a system prompt, facts just
//! under the cap) and thread (`--turns` turns); then a fact past the cap, and a one-token
//! request on the thread submitted `--stall-delay-ms` after the summary's first idle slice
//! begins:
//! - `no summary`: no summarizer (the stream stays over its cap): the request's own time, the
//!   baseline;
//! - `one slice`: the summary and the new stream's prefill in one uninterruptible slice (the
//!   behaviour before the summary became a resumable job): the request waits for all of it;
//! - `preemptible`: the summary's steps check the engine's interrupt, so the request waits for
//!   at most one step; the summary resumes after it and is swapped in later;
//! - `in the engine`: the summarizer is the engine's model, so the summary is the engine's
//!   low-priority background jobs (`engram_dual`'s `summary_in_engine.rs`): the request is
//!   admitted at the next step and the summary goes on beside it within the background share.
//!
//! The first three run a summarizer model of its own (a second copy of the model: the idle
//! hook's loop), the last the engine's model.
//!
//! The stall is a mode's submission-to-first-token time less the baseline's, medians over
//! `--stall-reps` rounds (the modes interleaved, so they see the same machine load).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use engram_dual::{DualControl, DualStats, DualStream, FactSegment, Summarizer};
use engram_engine::scheduler::Job;
use engram_engine::{ContextPolicy, IdleInterrupt, PolicyControl, PolicyLayer, SamplingParams};
use engram_kv::KvPool;
use engram_model::Model;

use crate::engine_thread::EngineThread;

/// Where the summary runs: on the idle hook (a summarizer model of its own), or in the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    NoSummary,
    OneSlice,
    Preemptible,
    InEngine,
}

impl Mode {
    const ALL: [Mode; 4] = [Mode::NoSummary, Mode::OneSlice, Mode::Preemptible, Mode::InEngine];

    fn name(self) -> &'static str {
        match self {
            Mode::NoSummary => "no summary",
            Mode::OneSlice => "idle hook, one slice",
            Mode::Preemptible => "idle hook, preemptible",
            Mode::InEngine => "in the engine (background jobs)",
        }
    }
}

/// What the probe reads of the policy it wraps (a [`DualStream`] in the bench).
trait Watched: ContextPolicy {
    fn summary_pending(&self, user: &str) -> bool;
    fn dual_stats(&self) -> DualStats;
}

impl Watched for DualStream {
    fn summary_pending(&self, user: &str) -> bool {
        DualStream::summary_pending(self, user)
    }
    fn dual_stats(&self) -> DualStats {
        DualStream::dual_stats(self)
    }
}

/// The policy as a mode runs it, publishing what the bench watches: that the summary began (its
/// first idle slice, or its first job taken by the engine), and the policy's counters after
/// each slice and job. Every other seam method reaches the wrapped policy unchanged (a
/// [`PolicyLayer`]).
struct Probe<P: Watched = DualStream> {
    inner: P,
    mode: Mode,
    user: String,
    summary_began: Arc<AtomicBool>,
    stats: Arc<Mutex<DualStats>>,
}

impl<P: Watched> PolicyLayer for Probe<P> {
    fn inner(&self) -> &dyn ContextPolicy {
        &self.inner
    }
    fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
        &mut self.inner
    }
    fn idle_slice(&mut self, interrupt: &IdleInterrupt) -> bool {
        if self.inner.summary_pending(&self.user) {
            self.summary_began.store(true, Relaxed);
        }
        let more = match self.mode {
            Mode::OneSlice => self.inner.idle_slice(&IdleInterrupt::never()),
            Mode::NoSummary | Mode::Preemptible | Mode::InEngine => self.inner.idle_slice(interrupt),
        };
        *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = self.inner.dual_stats();
        more
    }
    fn next_background(&mut self) -> Option<engram_engine::BackgroundJob> {
        let job = self.inner.next_background();
        if job.is_some() && self.inner.summary_pending(&self.user) {
            self.summary_began.store(true, Relaxed);
        }
        job
    }
    fn background_done(&mut self, done: engram_engine::BackgroundDone) {
        self.inner.background_done(done);
        *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = self.inner.dual_stats();
    }
}

/// What one mode measured in one round.
#[derive(Clone, Copy, Debug, Default)]
pub struct Round {
    /// Submission to first token of the request arriving mid-summary, and of the first turn
    /// after the swap.
    pub first_token_ms: f64,
    pub after_swap_ms: f64,
    pub stats: DualStats,
}

/// What a round needs: the model, the user's setup, and each mode's policy.
pub struct Setup<'a> {
    pub model: &'a Arc<Model>,
    pub pool: &'a KvPool,
    pub anchors: &'a [u32],
    pub facts: &'a [FactSegment],
    /// The facts appended at once, the last passing the cap.
    pub extra: &'a [FactSegment],
    pub messages: &'a [Vec<u32>],
    pub probe: &'a [u32],
    pub answer_tokens: usize,
    pub delay: Duration,
    /// A fresh policy for a mode (with its summarizer or none).
    pub policy: &'a dyn Fn(Option<Summarizer>) -> DualStream,
    /// A summarizer over a model of its own (the idle hook's modes), and one over the engine's
    /// model (the summary as the engine's background jobs).
    pub own_summarizer: &'a dyn Fn() -> Summarizer,
    pub engine_summarizer: &'a dyn Fn() -> Summarizer,
}

/// Submits `prompt` on thread `a` of `user`; returns milliseconds from submission to its first
/// token, once it ended.
fn turn(engine: &EngineThread, user: &str, prompt: &[u32], max_tokens: usize) -> Result<f64> {
    let params = SamplingParams { max_tokens, ignore_eos: true, ..Default::default() };
    let job = Job {
        owner: user.into(),
        session: Some("a".into()),
        text: None,
        add_special: false,
        prompt: prompt.to_vec(),
        params,
        pinned: false,
        long_context_after: None,
    };
    let (submitted, t) = engine.run(job)?;
    let end = t.end.expect("run returns ended jobs");
    Ok(t.first_token.unwrap_or(end).duration_since(submitted).as_secs_f64() * 1e3)
}

/// One round of `mode`: the setup, the fact past the cap, the request mid-summary, the summary
/// to its end, the first turn after the swap.
pub fn round(s: &Setup, mode: Mode) -> Result<Round> {
    let user = "user";
    let summarizer = match mode {
        Mode::NoSummary => None,
        Mode::OneSlice | Mode::Preemptible => Some((s.own_summarizer)()),
        Mode::InEngine => Some((s.engine_summarizer)()),
    };
    let mut dual = (s.policy)(summarizer);
    if mode == Mode::OneSlice {
        dual = dual.with_idle_steps(usize::MAX);
    }
    dual.set_anchors(user, s.anchors.to_vec());
    dual.set_facts(user, s.facts.to_vec());
    let (began, stats) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(DualStats::default())));
    let probe = Probe { inner: dual, mode, user: user.into(), summary_began: began.clone(), stats: stats.clone() };
    let engine = EngineThread::start(&s.model, &s.pool, Box::new(probe));
    for m in s.messages {
        turn(&engine, user, m, s.answer_tokens)?;
    }
    let mut facts = s.facts.to_vec();
    facts.extend_from_slice(s.extra);
    anyhow::ensure!(engine.handle().is_alive(), "the engine stopped");
    engine.handle().control(PolicyControl::new(DualControl::Facts { user: user.into(), facts }));
    let t0 = Instant::now();
    if mode != Mode::NoSummary {
        while !began.load(Relaxed) {
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("the summary never began");
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    std::thread::sleep(s.delay);
    let first_token_ms = turn(&engine, user, s.probe, 1)?;
    if mode != Mode::NoSummary {
        let t0 = Instant::now();
        while stats.lock().unwrap_or_else(|e| e.into_inner()).summaries == 0 {
            if t0.elapsed() > Duration::from_secs(600) {
                bail!("the summary never finished (see the log)");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let after_swap_ms = turn(&engine, user, s.probe, 1)?;
    let stats = *stats.lock().unwrap_or_else(|e| e.into_inner());
    Ok(Round { first_token_ms, after_swap_ms, stats })
}

/// The median of `v` (0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Every mode's rounds, interleaved `reps` times.
pub fn run(s: &Setup, reps: usize) -> Result<Vec<(Mode, Vec<Round>)>> {
    let mut out: Vec<(Mode, Vec<Round>)> = Mode::ALL.iter().map(|&m| (m, Vec::new())).collect();
    for _ in 0..reps {
        for (mode, rounds) in out.iter_mut() {
            rounds.push(round(s, *mode)?);
        }
    }
    Ok(out)
}

/// Prints the table (or one JSON line) of `results`.
pub fn report(results: &[(Mode, Vec<Round>)], model: &str, delay: Duration, json: bool) {
    let base =
        results.iter().find(|(m, _)| *m == Mode::NoSummary).map_or(0.0, |(_, r)| median(r.iter().map(|r| r.first_token_ms).collect()));
    let rows: Vec<serde_json::Value> = results
        .iter()
        .map(|(mode, rounds)| {
            let med = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
            let ttft = med(&|r| r.first_token_ms);
            serde_json::json!({"mode": mode.name(), "first_token_ms": ttft, "stall_ms": ttft - base,
                "after_swap_ms": med(&|r| r.after_swap_ms), "summary_ms": med(&|r| r.stats.last_summary_us as f64 / 1e3),
                "new_stream_prefill_ms": med(&|r| r.stats.last_summary_prefill_us as f64 / 1e3),
                "swap_us": med(&|r| r.stats.last_swap_us as f64), "slices": med(&|r| r.stats.summary_slices as f64),
                "slices_interrupted": med(&|r| r.stats.summary_slices_interrupted as f64), "rounds": rounds.len()})
        })
        .collect();
    if json {
        println!("{}", serde_json::json!({"model": model, "stall_delay_ms": delay.as_secs_f64() * 1e3, "modes": rows}));
        return;
    }
    println!(
        "\nthrough the engine: a request arriving {} ms after the summary began (medians of {} rounds)\n",
        delay.as_millis(),
        results.first().map_or(0, |r| r.1.len())
    );
    println!("| the summary | submission → first token ms | stall ms | summary ms | new stream prefill ms | swap µs | slices (interrupted) | first turn after the swap ms |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} ({:.0}) | {:.1} |",
            r["mode"].as_str().unwrap_or(""),
            r["first_token_ms"].as_f64().unwrap_or(0.0),
            r["stall_ms"].as_f64().unwrap_or(0.0),
            r["summary_ms"].as_f64().unwrap_or(0.0),
            r["new_stream_prefill_ms"].as_f64().unwrap_or(0.0),
            r["swap_us"].as_f64().unwrap_or(0.0),
            r["slices"].as_f64().unwrap_or(0.0),
            r["slices_interrupted"].as_f64().unwrap_or(0.0),
            r["after_swap_ms"].as_f64().unwrap_or(0.0),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recording policy seen as the probe's target (nothing pending, no counters).
    struct Recorded(Box<dyn ContextPolicy>);

    impl PolicyLayer for Recorded {
        fn inner(&self) -> &dyn ContextPolicy {
            &*self.0
        }
        fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
            &mut *self.0
        }
    }

    impl Watched for Recorded {
        fn summary_pending(&self, _user: &str) -> bool {
            false
        }
        fn dual_stats(&self) -> DualStats {
            DualStats::default()
        }
    }

    #[test]
    fn every_seam_method_reaches_the_wrapped_policy() {
        for mode in Mode::ALL {
            engram_policy::testing::exercise_every_method(|inner| {
                let (began, stats) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(DualStats::default())));
                Box::new(Probe { inner: Recorded(inner), mode, user: "user".into(), summary_began: began, stats })
            });
        }
    }
}
