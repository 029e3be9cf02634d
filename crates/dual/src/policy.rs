//! `DualStream` (the dual-stream design): a [`ContextPolicy`] that keeps, per user, a persistent stream of
//! anchors (system prompt, profile facts) prefilled once and shared read-only by every thread
//! of that user, and per thread a [`TurnRing`] of whole turns within a capacity in tokens.
//!
//! ```text
//!  job (owner = user, session = thread, prompt = the new turn's tokens)
//!    admit:  view = anchors + the ring's kept turns (spans) → the new turn prefills after them
//!    retire: the turn's tokens (prompt + answer) and KV join the ring → oldest whole turns
//!            evicted past the capacity, later ones moved down (no recomputation)
//! ```
//! A request sends only its new turn; the thread's earlier turns are the policy's, not the
//! client's. An answer cut at its length leaves its last token unfed; the thread's next turn
//! starts with it, so the ring holds the answer whole. With a sentence encoder, each turn keeps the embedding of its prompt text, and a
//! new prompt attends only the turns at least `threshold` similar to it plus the last
//! `keep_last` (at least 1, so the new turn always starts right after the ring's last token).
//!
//! The persistent stream ([`PersistentStream`]) is the user's base anchors (the
//! system prompt) then facts ([`DualStream::set_facts`]), or a summary of them: append-only —
//! a new fact prefills only its tokens after the stream's last, a dropped one is masked at
//! once — and compacted (tombstones dropped) when it passes its cap; when the live facts
//! alone pass it, the [`Summarizer`] condenses them (at the session's start, else on the idle
//! hook or as the engine's job). The policy never runs the main model: a stream's KV is the
//! engine's background job (`policy/stream_job.rs`), which a request whose stream lacks it waits
//! on ([`ContextPolicy::prepare`]). A change makes a new generation of the stream; each thread moves its ring onto it
//! at its next admission (turns moved, not recomputed), so a running turn keeps the view it
//! started with and never sees a swap mid-turn.
//!
//! Files (with [`DualStream::with_dir`]): `policy/files.rs` — streams written by a background
//! writer and mapped back, rings saved as turns retire and restored with their checksums settled
//! by [`ContextPolicy::verify_restore`]; `policy/budget.rs` — the files (masked turns' too) under
//! the disk budget; `policy/masked.rs` — masked turns' KV on disk; `policy/pressure.rs` —
//! [`ContextPolicy::make_room`]: masked-out turns of idle threads leave RAM before a request is
//! refused.
//!
//! Invariant: a thread's RAM is its ring (at most `capacity` tokens plus the newest turn and
//! pinned ones) plus a share of its user's anchors, however long the conversation; a request
//! attends exactly `TurnRing::view` (`crates/dual/tests/it/ring_fuzz.rs`), and with nothing
//! forgotten its answer equals a cold run over anchors + every turn
//! (`crates/dual/tests/it/dual.rs`).

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use crate::{PersistentStream, RingStore, SegmentId, StreamWriter, TurnMask, TurnRing};
use engram_embed::TextEncoder;
use engram_kv::{KvPool, SeqKv};
use engram_model::Model;

use engram_policy::{
    AdmitRequest, Checkout, ContextPolicy, ControlError, ControlReply, GaugeKind, IdleInterrupt, MatchKind, OwnerKey, PendingRestore,
    PolicyControl, PolicyGauge, PolicyStats, Readiness, Retired,
};

use crate::summarize::Summarizer;

mod budget;
mod control;
mod files;
mod masked;
mod pressure;
mod state;
mod stream_job;
mod summary;
mod summary_in_engine;

pub use control::DualControl;

/// Relevance masks: an encoder, the similarity a turn needs, and how many last turns are
/// always attended.
pub struct Relevance {
    pub encoder: Arc<dyn TextEncoder>,
    pub threshold: f32,
    pub keep_last: usize,
}

/// Counts of what the policy did (for `/metrics` and the bench).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DualStats {
    pub turns_evicted: u64,
    pub turns_masked: u64,
    /// Persistent streams (re)prefilled, wholly or their new tail.
    pub anchors_prefilled: u64,
    /// Rings moved onto a new generation of their user's stream.
    pub rebases: u64,
    /// Streams compacted (tombstoned facts dropped from the KV).
    pub compactions: u64,
    /// Streams condensed by the summarizer.
    pub summaries: u64,
    /// The last summary's time: generating it (summed over the slices it ran in), prefilling
    /// the new stream beside the old one, and the swap itself (the new stream put in place).
    pub last_summary_us: u64,
    pub last_summary_prefill_us: u64,
    pub last_swap_us: u64,
    /// Idle slices that advanced a summary, those cut short by a submitted job, and summaries
    /// dropped mid-flight because the user's facts or anchors changed (started again).
    pub summary_slices: u64,
    pub summary_slices_interrupted: u64,
    pub summaries_restarted: u64,
    /// State entries set or replaced (the hybrid mode), and the tokens prefilled for them.
    pub states_set: u64,
    pub state_tokens_prefilled: u64,
    /// Persistent streams written to their file (and mapped back), restored from one (wholly
    /// or a prefix), and files refused (damaged, foreign, another model: prefilled instead).
    pub streams_saved: u64,
    /// Stream files queued for the writer, and the bytes of those written and mapped back.
    pub streams_queued: u64,
    pub stream_bytes_written: u64,
    pub streams_restored: u64,
    pub stream_tokens_restored: u64,
    pub stream_files_refused: u64,
    /// Rings queued for writing (after a turn retired or a state entry changed), rings restored
    /// after a restart (their turns), and rings refused (damaged, foreign: started empty).
    pub rings_saved: u64,
    pub rings_restored: u64,
    pub turns_restored: u64,
    pub ring_files_refused: u64,
    /// Rings and stream files deleted from disk to keep the files within the disk budget
    /// (least recently used; a stream is prefilled again from its anchors and facts).
    pub rings_evicted_for_disk: u64,
    pub streams_evicted_for_disk: u64,
    /// Masked turns whose KV left RAM for a file, and the bytes written
    /// (`DualStream::with_masked_turns`).
    pub turns_offloaded: u64,
    pub masked_bytes_written: u64,
    /// Masked turns read back when a message wanted them: how many, their files' bytes, the
    /// time it took (summed), and files that could not be read (the turn dropped).
    pub masked_turns_restored: u64,
    pub masked_bytes_restored: u64,
    pub masked_restore_us: u64,
    pub masked_restore_failures: u64,
    /// Masked turns dropped from their ring because their file was deleted to keep the files
    /// within the disk budget (least recently used, as rings and streams are).
    pub masked_turns_evicted_for_disk: u64,
    /// Masked turns of idle threads written to disk to make room in RAM (`make_room`), and
    /// the bytes of KV they held in RAM.
    pub turns_offloaded_for_ram: u64,
    pub ram_bytes_offloaded: u64,
}

/// A fact of a user's persistent stream: its id in the user's log, its text (what a
/// summarizer reads) and its tokens as the stream holds them (rendered by the caller).
#[derive(Clone, Debug, PartialEq)]
pub struct FactSegment {
    pub id: u64,
    pub text: String,
    pub tokens: Vec<u32>,
}

/// A summary in a user's stream: the facts it condenses and its tokens.
pub(crate) struct Summary {
    id: u64,
    covers: Vec<u64>,
    tokens: Vec<u32>,
}

/// One user's wanted persistent stream and the stream built from it.
#[derive(Default)]
struct User {
    base: Vec<u32>,
    facts: Vec<FactSegment>,
    summary: Option<Summary>,
    /// Over the cap with a summarizer: summarize (at the session's start, or when idle).
    summary_due: bool,
    /// The summary in flight on the idle hook (`policy/summary.rs`), dropped when the facts or
    /// anchors change.
    job: Option<summary::InFlight>,
    /// The tag of the engine's summary job in flight (`policy/summary_in_engine.rs`); a result
    /// with another tag is dropped.
    engine_summary: Option<u64>,
    /// The engine's prefill of the stream in flight: its job's tag and the generation it
    /// prefills (`policy/stream_job.rs`).
    stream_job: Option<(u64, u64)>,
    stream: PersistentStream,
    /// The stream's generation its file holds (`None`: not written by this process).
    saved: Option<u64>,
    /// Its file was read (restored or refused) by this process: it is read at most once.
    file_read: bool,
    /// The write queued last (its id, the generation it writes), until its result is taken;
    /// kept after a failed write so that generation is not queued again.
    writing: Option<(u64, u64)>,
}

impl User {
    /// The live segments: the base, then the summary if it still covers only live facts,
    /// then the facts it does not cover.
    fn wanted(&self) -> Vec<(SegmentId, Vec<u32>)> {
        self.wanted_with(self.summary.as_ref())
    }

    /// [`User::wanted`] with `summary` in place of the user's.
    fn wanted_with(&self, summary: Option<&Summary>) -> Vec<(SegmentId, Vec<u32>)> {
        let mut out = Vec::new();
        if !self.base.is_empty() {
            out.push((SegmentId::Base, self.base.clone()));
        }
        let summary = summary.filter(|s| s.covers.iter().all(|id| self.facts.iter().any(|f| f.id == *id)));
        if let Some(s) = summary {
            out.push((SegmentId::Summary(s.id), s.tokens.clone()));
        }
        for f in &self.facts {
            if !summary.is_some_and(|s| s.covers.contains(&f.id)) {
                out.push((SegmentId::Fact(f.id), f.tokens.clone()));
            }
        }
        out
    }
}

/// A thread: its ring, the generation of its user's stream the ring sits on, and its state
/// entry's id in the ring (the hybrid mode).
struct Thread {
    ring: TurnRing,
    generation: u64,
    state: Option<u64>,
    /// A restore from disk whose checksums are still unverified: its id and turns.
    pending: Option<(u64, usize)>,
    /// The state entry set last while the restore was unverified (empty: removed): re-applied
    /// to the fresh ring if the restored one proves damaged, so the update is not lost.
    state_while_pending: Option<Vec<u32>>,
    /// The state entry being prefilled by the engine (its job's tag): only the newest one's
    /// result is kept (`policy/state.rs`).
    state_job: Option<u64>,
    /// The turns the last admission's mask left out (what RAM pressure may write to disk).
    last_masked: Vec<u64>,
    /// When the thread was last admitted (the policy's clock): pressure offloads the least
    /// recently admitted threads first.
    admitted: u64,
}

/// The dual-stream policy. See the module doc.
pub struct DualStream {
    model: Arc<Model>,
    pool: KvPool,
    capacity: usize,
    relevance: Option<Relevance>,
    /// Most tokens a persistent stream may hold (masked ones included) before it is
    /// compacted, or summarized when its live tokens alone pass it.
    persistent_cap: usize,
    summarizer: Option<Summarizer>,
    users: HashMap<String, User>,
    threads: HashMap<(String, String), Thread>,
    /// The embedding of each running turn's prompt, attached when it joins its ring.
    running: HashMap<(String, String), Option<Vec<f32>>>,
    /// Per thread, the last answer's token that was sampled but never fed (it stopped at its
    /// length): the next turn starts with it.
    carry: HashMap<(String, String), u32>,
    next_summary: u64,
    stats: DualStats,
    /// Most steps (prefill chunks, decode steps) a summary advances per idle slice.
    idle_steps: usize,
    /// Where persistent streams (and rings) are kept across restarts; `None`: RAM only.
    dir: Option<std::path::PathBuf>,
    /// Threads' rings on disk (with `dir`).
    rings: Option<RingStore>,
    /// The persistent streams' file writer (with `dir`), and the last write's id.
    streams: Option<StreamWriter>,
    next_write: u64,
    /// The ring restore the last `thread` call handed out, for the admission to carry.
    unsettled: Option<PendingRestore>,
    next_restore: u64,
    /// Threads whose ring failed its checksums: their next turn starts empty, not from disk.
    refused: HashSet<(String, String)>,
    /// The files' bytes against the disk budget (`set_disk_budget`).
    ledger: Option<crate::DualDiskLedger>,
    /// Forward work for the engine (state entries to prefill), handed out by
    /// `next_background`, and what each job in flight is for (`policy/state.rs`).
    background: std::collections::VecDeque<engram_policy::BackgroundJob>,
    state_jobs: HashMap<u64, state::StateJob>,
    /// What each summary job in flight is for (`policy/summary_in_engine.rs`).
    summary_jobs: HashMap<u64, summary_in_engine::SummaryTicket>,
    /// What each stream prefill in flight is for, and per user the state entries set while it
    /// ran (thread, tokens), set when it ends (`policy/stream_job.rs`).
    stream_jobs: HashMap<u64, stream_job::StreamJob>,
    deferred_states: HashMap<String, Vec<(String, Vec<u32>)>>,
    /// Users whose stream changed since the engine last asked for work: their prefill is
    /// queued then, once every message of the engine's pass is applied (a turn's anchors and
    /// facts arrive together; the stream's file is read against both).
    streams_changed: HashSet<String>,
    /// Users whose stream prefill failed in the engine, with why: their next admission says so
    /// (and queues the prefill again) instead of waiting on it for ever.
    stream_failures: HashMap<String, String>,
    next_job: u64,
    /// Masked turns' files (`policy/masked.rs`); `None`: masked turns stay in RAM.
    masked: Option<masked::MaskedTurns>,
    /// Counts admissions (threads' `admitted`).
    clock: u64,
}

impl DualStream {
    /// A policy whose threads keep `capacity` tokens of turns (the design's default: 1,536), with no
    /// cap on the persistent stream until [`DualStream::with_persistent_cap`].
    pub fn new(model: Arc<Model>, pool: KvPool, capacity: usize) -> DualStream {
        DualStream {
            model,
            pool,
            capacity,
            relevance: None,
            persistent_cap: usize::MAX,
            summarizer: None,
            users: HashMap::new(),
            threads: HashMap::new(),
            running: HashMap::new(),
            carry: HashMap::new(),
            next_summary: 0,
            idle_steps: summary::IDLE_STEPS,
            stats: DualStats::default(),
            dir: None,
            rings: None,
            streams: None,
            next_write: 0,
            unsettled: None,
            next_restore: 0,
            refused: HashSet::new(),
            ledger: None,
            background: std::collections::VecDeque::new(),
            state_jobs: HashMap::new(),
            summary_jobs: HashMap::new(),
            stream_jobs: HashMap::new(),
            deferred_states: HashMap::new(),
            streams_changed: HashSet::new(),
            stream_failures: HashMap::new(),
            next_job: 0,
            masked: None,
            clock: 0,
        }
    }

    /// Masks turns by relevance to each new prompt (`keep_last` is raised to 1).
    pub fn with_relevance(mut self, mut relevance: Relevance) -> DualStream {
        relevance.keep_last = relevance.keep_last.max(1);
        self.relevance = Some(relevance);
        self
    }

    /// Caps each persistent stream at `cap` tokens (the design's default: 512): past it, tombstoned
    /// facts are dropped (compaction) and, if the live tokens alone pass it, `summarizer`
    /// condenses the facts — at the session's start before the first prefill, later on the
    /// idle hook (generation goes on from the old stream meanwhile). Without a summarizer a
    /// stream of live facts over the cap stays as it is.
    pub fn with_persistent_cap(mut self, cap: usize, summarizer: Option<Summarizer>) -> DualStream {
        self.persistent_cap = cap;
        self.summarizer = summarizer;
        self
    }

    /// Sets `user`'s base anchors (the system prompt, as tokens); the user's threads attend
    /// the new stream from their next turn (unchanged tokens change nothing).
    pub fn set_anchors(&mut self, user: &str, tokens: Vec<u32>) {
        let u = self.users.entry(user.to_string()).or_default();
        if u.base != tokens {
            u.base = tokens;
            self.restart_summary(user);
            self.refresh(user);
        }
    }

    /// Sets `user`'s live facts, in order: facts no longer listed are tombstoned (masked at
    /// once), new ones appended after the stream's last token; threads see the change from
    /// their next turn.
    pub fn set_facts(&mut self, user: &str, facts: Vec<FactSegment>) {
        let u = self.users.entry(user.to_string()).or_default();
        if u.facts != facts {
            u.facts = facts;
            self.restart_summary(user);
            self.refresh(user);
        }
    }

    /// The slots of `user`'s stream a view leaves out (tombstoned facts), and its tokens.
    pub fn persistent(&self, user: &str) -> Option<&PersistentStream> {
        self.users.get(user).map(|u| &u.stream)
    }

    /// What the policy did so far.
    pub fn dual_stats(&self) -> DualStats {
        self.stats
    }

    /// The counters `/metrics` shows of this policy (`PolicyStats::named`).
    fn named_gauges(&self) -> Vec<PolicyGauge> {
        let counter = |name, help, value| PolicyGauge { name, help, kind: GaugeKind::Counter, value };
        let s = &self.stats;
        let masked = if self.masked.is_some() { self.masked_gauges() } else { Vec::new() };
        let mut out = vec![
            counter("engram_turns_evicted_total", "Whole turns evicted from dual-stream rings.", s.turns_evicted),
            counter("engram_turns_masked_total", "Turns masked out of a request's view as irrelevant (dual-stream).", s.turns_masked),
            counter("engram_summaries_total", "Persistent streams condensed by the summarizer (dual-stream).", s.summaries),
            counter(
                "engram_persistent_compactions_total",
                "Persistent streams compacted: tombstoned facts dropped from the KV (dual-stream).",
                s.compactions,
            ),
        ];
        out.extend(masked);
        out
    }

    /// Brings `user`'s stream to what is wanted, then enforces the cap: compaction when
    /// tombstones push it over, a summary due when the live tokens alone do.
    fn refresh(&mut self, user: &str) {
        let cap = self.persistent_cap;
        let has_summarizer = self.summarizer.is_some();
        let Some(u) = self.users.get_mut(user) else { return };
        u.stream.update(u.wanted());
        if u.stream.len() > cap && u.stream.compact() {
            self.stats.compactions += 1;
        }
        u.summary_due = has_summarizer && u.stream.live_len() > cap && !u.facts.is_empty();
        self.queue_summary(user);
        self.streams_changed.insert(user.to_string());
    }

    /// An empty ring over `base` (a fork of the user's stream) with its `masked` slots.
    fn open_ring(&self, base: &SeqKv, masked: Vec<Range<usize>>) -> Result<TurnRing, engram_kv::KvError> {
        let mut ring = TurnRing::new(SeqKv::new(&self.pool), self.capacity, self.model.config.clone());
        ring.rebase(base.fork(base.len()), masked)?;
        Ok(ring)
    }

    /// Whether `owner`'s stream holds the KV of all its tokens (after its file is restored):
    /// what a thread needs before it opens on the stream. The session-start summary (a
    /// summarizer model of its own) is written first, so the stream it leaves is the one
    /// prefilled. An empty stream holds its empty KV from the start.
    fn stream_ready(&mut self, owner: &str) -> bool {
        self.adopt_written();
        self.users.entry(owner.to_string()).or_default();
        self.summarize_at_start(owner);
        self.restore_stream(owner);
        let u = self.users.get_mut(owner).expect("inserted above");
        if u.stream.len() == 0 && u.stream.kv().is_none() {
            u.stream.set_prefilled(SeqKv::new(&self.pool)).expect("an empty KV for an empty stream");
        }
        u.stream.kv().is_some()
    }

    /// `owner`'s thread on the current generation of the user's stream (which the engine
    /// prefilled: [`ContextPolicy::prepare`] waits for it), the ring moved onto it. Errors: the
    /// stream's prefill failed (the next request queues it again).
    fn thread(&mut self, owner: &str, thread: &str) -> Result<&mut TurnRing, String> {
        let key = (owner.to_string(), thread.to_string());
        if !self.stream_ready(owner) {
            let why = self.stream_failures.remove(owner).unwrap_or_else(|| "it was not prefilled yet".into());
            self.streams_changed.insert(owner.to_string());
            return Err(format!("the persistent stream of {owner:?} has no KV ({why}); the next request prefills it again"));
        }
        self.save_stream(owner);
        self.drop_stream_job(owner);
        let u = self.users.get_mut(owner).expect("inserted above");
        let kv = u.stream.kv().expect("prefilled above");
        let (generation, masked, base) = (u.stream.generation(), u.stream.masked_ranges(), kv.fork(kv.len()));
        match self.threads.get_mut(&key) {
            None => {
                let mut ring = self.open_ring(&base, masked.clone()).map_err(|e| format!("opening the thread: {e}"))?;
                let (state, restored) =
                    if self.refused.remove(&key) { (None, None) } else { self.restore_ring(owner, thread, &mut ring, &base, &masked) };
                let pending = restored.map(|(n, check)| {
                    self.next_restore += 1;
                    self.unsettled = Some(PendingRestore::new(files::RingRestore {
                        owner: owner.to_string(),
                        thread: thread.to_string(),
                        id: self.next_restore,
                        check,
                    }));
                    (self.next_restore, n)
                });
                let thread = Thread {
                    ring,
                    generation,
                    state,
                    pending,
                    state_while_pending: None,
                    state_job: None,
                    last_masked: Vec::new(),
                    admitted: 0,
                };
                self.threads.insert(key.clone(), thread);
            }
            Some(t) if t.generation != generation => {
                t.ring.rebase(base, masked).map_err(|e| format!("moving the thread onto the new persistent stream: {e}"))?;
                t.generation = generation;
                self.stats.rebases += 1;
            }
            Some(_) => {}
        }
        Ok(&mut self.threads.get_mut(&key).expect("inserted above").ring)
    }
}

impl ContextPolicy for DualStream {
    /// A user's persistent stream that does not hold its tokens' KV yet (new anchors or facts
    /// not prefilled, no file to restore) is prefilled by the engine first: a `BlockingOwner`
    /// job (`policy/stream_job.rs`) the request waits on. After a failed prefill: `Now`, and
    /// [`ContextPolicy::admit`] says why.
    fn prepare(&mut self, req: &AdmitRequest<'_>) -> Readiness {
        let owner = req.owner.as_str();
        if self.stream_ready(owner) || self.stream_failures.contains_key(owner) {
            return Readiness::Now;
        }
        self.streams_changed.insert(owner.to_string());
        Readiness::AfterBackground
    }

    /// The request's token ids are its new turn (its text, if any, is not matched).
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        let (owner, prompt, tok) = (req.owner.as_str(), req.tokens, req.tok);
        let thread = req.session.unwrap_or("default").to_string();
        let query = match &self.relevance {
            Some(r) => {
                let text = tok.decode(prompt, true).map_err(|e| e.to_string())?;
                let v = r.encoder.encode(&[text]).map_err(|e| format!("embedding the prompt: {e}"))?;
                v.vectors.into_iter().next()
            }
            None => None,
        };
        let mask = match (&self.relevance, &query) {
            (Some(r), Some(q)) => TurnMask::Relevant { query: q.clone(), threshold: r.threshold, keep_last: r.keep_last },
            _ => TurnMask::All,
        };
        self.adopt_masked();
        self.thread(owner, &thread)?;
        self.restore_masked(owner, &thread, &mask);
        let view = self.threads[&(owner.to_string(), thread.clone())].ring.view(&mask);
        // What the view holds as tokens, for a prompt-lookup drafter: the live anchors, then
        // the attended turns in order (a code file pasted turns ago can be copied from).
        let mut lookup: Vec<u32> = self
            .users
            .get(owner)
            .map_or_else(Vec::new, |u| u.stream.segments().iter().filter(|s| !s.masked).flat_map(|s| s.tokens.iter().copied()).collect());
        let ring = &self.threads[&(owner.to_string(), thread.clone())].ring;
        for t in ring.turns().filter(|t| view.attended.contains(&t.id)) {
            lookup.extend_from_slice(&t.tokens);
        }
        let restore = self.unsettled.take();
        self.stats.turns_masked += view.masked.len() as u64;
        self.offload_masked(owner, &thread, &view.masked);
        self.touch_ring(owner, &thread);
        let key = (owner.to_string(), thread.clone());
        self.clock += 1;
        if let Some(t) = self.threads.get_mut(&key) {
            (t.last_masked, t.admitted) = (view.masked.clone(), self.clock);
        }
        let tokens: Vec<u32> = self.carry.remove(&key).into_iter().chain(prompt.iter().copied()).collect();
        self.running.insert(key, query);
        // Masked turns' files written meanwhile are charged; this thread's are kept while it runs.
        self.enforce_disk_budget();
        Ok(Checkout {
            session_id: thread,
            kind: if view.spans.is_empty() { MatchKind::Miss } else { MatchKind::Prefix },
            token_ends: vec![0; tokens.len()],
            tokens,
            reused: 0,
            kv: SeqKv::new(&self.pool),
            restore,
            spans: view.spans,
            // A stream ending in a tombstoned fact (with no turn after it) leaves a gap at the
            // view's end: the turn still goes at the ring's next position.
            own_first: Some(view.next_position),
            lookup,
            cache: None,
            repair: None,
        })
    }

    /// Rings and streams are paged KV: the pool's own count.
    fn admission_bytes(&self, _owner: &OwnerKey, _prompt_tokens: usize, _long_context_after: Option<usize>) -> Option<usize> {
        None
    }

    fn pin_owner(&mut self, _owner: &OwnerKey) {}

    /// Masked-out turns of idle threads leave RAM for disk first (with a masked turns'
    /// directory; `policy/pressure.rs`); rings are otherwise bounded by their capacity.
    fn make_room(&mut self, bytes: usize) -> bool {
        let fits = self.free_ram(bytes, None);
        self.enforce_disk_budget();
        fits
    }

    /// A thread's ring restored from disk at admission: its turn files' checksums, computed
    /// beside the turn's prefill. False (damaged): the thread starts empty and the scheduler
    /// admits the job again on it (see `policy/files.rs`).
    fn verify_restore(&mut self, restore: PendingRestore) -> bool {
        let sound = self.settle_ring(restore);
        self.enforce_disk_budget();
        sound
    }

    fn retire(&mut self, r: Retired) {
        let owner = r.owner.as_str().to_string();
        let key = (owner.clone(), r.session_id.clone());
        let embedding = self.running.remove(&key).flatten();
        if r.tokens.is_empty() {
            return;
        }
        self.adopt_masked();
        let Some(Thread { ring, .. }) = self.threads.get_mut(&key) else { return };
        if let Some(t) = r.unfed {
            self.carry.insert(key.clone(), t);
        }
        // The user's stream changed while the turn ran (its view held the old one): the turn
        // follows the ring's current end.
        let mut kv = r.kv;
        let next = ring.next_position();
        if !kv.is_empty() && kv.position(0) != next {
            if let Err(e) = kv.move_slots(0..kv.len(), next, &self.model.config) {
                tracing::warn!("thread {:?} of {:?}: the turn is not kept: {e}", r.session_id, owner);
                return;
            }
        }
        match ring.push(r.tokens, kv, embedding, false) {
            Ok(evicted) => {
                if !evicted.is_empty() {
                    tracing::debug!("thread {:?} of {:?}: {} whole turn(s) evicted from the ring", r.session_id, owner, evicted.len());
                }
                self.stats.turns_evicted += evicted.len() as u64;
            }
            Err(e) => tracing::warn!("thread {:?} of {:?}: the turn is not kept: {e}", r.session_id, owner),
        }
        self.save_ring(&owner, &r.session_id);
        // Files of masked turns evicted with their turns are no longer charged.
        self.enforce_disk_budget();
    }

    fn forget_owner(&mut self, owner: &OwnerKey) {
        let owner = owner.as_str();
        if let Some(r) = self.rings.as_mut() {
            r.forget_owner(owner);
        }
        if let (Some(dir), Some(w)) = (&self.dir, &self.streams) {
            // After any write of it still queued.
            w.delete(dir.join(crate::stream_file_name(owner)));
        }
        self.refused.retain(|(o, _)| o != owner);
        let threads: Vec<String> = self.threads.keys().filter(|(o, _)| o == owner).map(|(_, t)| t.clone()).collect();
        self.uncharge_owner(owner, &threads);
        self.users.remove(owner);
        self.threads.retain(|(o, _), _| o != owner);
        self.running.retain(|(o, _), _| o != owner);
        self.carry.retain(|(o, _), _| o != owner);
        self.background.retain(|j| j.owner.as_str() != owner);
        self.state_jobs.retain(|_, j| j.user != owner);
        self.summary_jobs.retain(|_, j| j.user != owner);
        self.stream_jobs.retain(|_, j| j.user != owner);
        self.deferred_states.remove(owner);
        self.streams_changed.remove(owner);
        self.stream_failures.remove(owner);
        self.enforce_disk_budget();
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            sessions_idle: self.threads.len() as u64,
            disk_bytes_used: self.disk_bytes_charged(),
            named: self.named_gauges(),
            ..PolicyStats::default()
        }
    }

    /// Takes [`DualControl`] messages (anchors, facts, a thread's state entry).
    fn control(&mut self, msg: PolicyControl) -> Result<ControlReply, ControlError> {
        let msg = msg.take::<DualControl>().map_err(PolicyControl::refuse)?;
        self.apply(msg)
    }

    /// Advances the summary in flight (or the next one due) by at most the policy's idle steps,
    /// stopping at the first step boundary once `interrupt` is requested; when it is ready the
    /// new stream is swapped in and threads attend it from their next turn (`policy/summary.rs`).
    fn idle_slice(&mut self, interrupt: &IdleInterrupt) -> bool {
        self.adopt_written();
        self.adopt_masked();
        self.enforce_disk_budget();
        self.idle_summaries(interrupt)
    }

    /// Persistent streams to prefill (`policy/stream_job.rs`), state entries
    /// (`policy/state.rs`) and summaries when the summarizer is the engine's model
    /// (`policy/summary_in_engine.rs`), in the order they were asked for.
    fn next_background(&mut self) -> Option<engram_policy::BackgroundJob> {
        let mut changed: Vec<String> = self.streams_changed.drain().collect();
        changed.sort();
        for user in changed {
            self.queue_stream_prefill(&user);
        }
        self.background.pop_front()
    }

    fn background_done(&mut self, done: engram_policy::BackgroundDone) {
        if let Err(done) = self.stream_done(done) {
            if let Err(done) = self.summary_done(done) {
                self.state_done(done);
            }
        }
        // A state entry put in the ring may have evicted masked turns (their files gone).
        self.enforce_disk_budget();
    }
}
