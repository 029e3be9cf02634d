//! Missing chunk KV as the engine's background work: a blended RAG request whose system prompt
//! or chunks its tenant's [`crate::ChunkStore`] lacks is not admitted until the engine has
//! prefilled them — one job per missing piece, `BlockingOwner` on the request's own owner key
//! (a RAG request's key is its own, so the job holds that request alone) — and
//! [`TreePolicy::admit`](engram_policy::ContextPolicy::admit) then assembles from the store
//! without running the model.
//!
//! ```text
//!  prepare(owner)  ─ store lacks the system prompt ─► one job: sys tokens from nothing        ─► AfterBackground
//!                  ─ store lacks chunks           ─► a job per chunk: sys KV forked + chunk  ─► AfterBackground
//!                  ─ nothing missing, or a job failed, or too many rounds                     ─► Now
//!  background_done ─ ok: the piece's KV into the store (as `ChunkStore::assemble` stores it); counted for the request
//!                  ─ error: kept for the request; its admission fails naming it
//!  admit(owner)    ─ the request's wait taken: its failure, or its counts for the blend report
//! ```
//! NOTE: a piece stored by a job may be evicted (the store's cap, the engine's `make_room`)
//! before its request is prepared again; it is then queued again, at most [`MAX_ROUNDS`]
//! times, after which the request fails rather than wait for ever.
//!
//! Invariant: every job's KV is what the engine's step computes for the piece's tokens (the
//! same computation `ChunkStore::assemble` runs alone), so the store's entries are the same
//! whichever path filled them; a request never waits on work nobody queued (prepare answers
//! `AfterBackground` only with a job of its owner queued or running).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;

use engram_kv::SeqKv;
use engram_policy::{BackgroundDone, BackgroundJob, BackgroundPriority, Checkout, MatchKind, OwnerKey, Readiness};

use super::{PromptSegments, TreePolicy, MAX_REGISTERED};
use crate::chunk_store::Piece;
use crate::pipeline::Prompt;

/// Rounds of jobs one request may wait on (the system prompt's, the chunks', and a few more
/// for pieces evicted before the request was prepared again).
pub const MAX_ROUNDS: u32 = 4;

/// Tags of chunk jobs carry this bit (idle units' jobs count from 1 without it).
const CHUNK_TAG: u64 = 1 << 63;

/// The blended requests waiting on chunk jobs, and the jobs not handed to the engine yet.
#[derive(Default)]
pub(super) struct ChunkJobs {
    next_tag: u64,
    /// Jobs for the engine, handed out by `next_background`.
    queue: VecDeque<BackgroundJob>,
    /// Jobs queued or running, by tag.
    running: HashMap<u64, Running>,
    /// Per request (owner key): what its jobs computed or why they failed.
    waits: HashMap<OwnerKey, Wait>,
    /// Order the waits began, to bound them (a request cancelled while waiting leaves one).
    order: VecDeque<OwnerKey>,
}

/// A chunk job in flight.
struct Running {
    owner: OwnerKey,
    tenant: String,
    chunk_dir: Option<std::path::PathBuf>,
    prompt: Prompt,
    piece: Piece,
}

/// One request's wait on its chunk jobs.
#[derive(Default)]
pub(super) struct Wait {
    /// Jobs of this request queued or running.
    in_flight: usize,
    /// Rounds of jobs queued so far.
    rounds: u32,
    /// Chunks and tokens its jobs prefilled (reported as computed, not reused).
    pub chunks_computed: usize,
    pub tokens_computed: usize,
    /// Why a job of it failed (its admission fails with this).
    pub failed: Option<String>,
}

/// The prompt as the chunk store reads it (segments and tokens).
pub(super) fn prompt_of(seg: &PromptSegments) -> Prompt {
    Prompt { path: seg.path.clone(), tokens: seg.tokens.clone(), ends: seg.ends.clone(), chunks: Vec::new() }
}

/// What a piece is, for messages.
fn describe(piece: Piece, prompt: &Prompt) -> String {
    match piece {
        Piece::Sys => "the system prompt".into(),
        Piece::Chunk(d) => format!("chunk {:?}", prompt.path[d]),
    }
}

impl TreePolicy {
    /// [`engram_policy::ContextPolicy::prepare`] of a blended RAG request (`seg` its checked
    /// registration): `AfterBackground` with jobs queued for the pieces its tenant's chunk
    /// store lacks; `Now` when nothing is missing or it cannot be (a job failed, too many
    /// rounds: its admission then says why).
    pub(super) fn prepare_blended(&mut self, owner: &OwnerKey, seg: &PromptSegments) -> Readiness {
        let prompt = prompt_of(seg);
        let (pool, tenant, dir) = (self.pool.clone(), seg.tenant.clone(), seg.chunk_dir.clone());
        if !self.chunk_jobs.waits.contains_key(owner) {
            self.chunk_jobs.begin(owner);
        }
        let wait = self.chunk_jobs.waits.get(owner).expect("begun above");
        if wait.failed.is_some() {
            return Readiness::Now;
        }
        if wait.in_flight > 0 {
            return Readiness::AfterBackground;
        }
        let rounds = wait.rounds;
        let c = self.chunk_store(&tenant, dir.as_deref());
        let missing = c.store.missing(&prompt);
        if missing.is_empty() {
            return Readiness::Now;
        }
        let sys_kv = if missing.sys { None } else { c.store.sys_kv(&prompt) };
        let wait = self.chunk_jobs.waits.get_mut(owner).expect("begun above");
        if rounds >= MAX_ROUNDS {
            wait.failed = Some(format!(
                "the prompt's chunk KV was still missing after {rounds} rounds of prefill jobs: the chunk store dropped it before the request could start (its cap or the KV budget may be too small for one prompt's chunks)"
            ));
            return Readiness::Now;
        }
        wait.rounds += 1;
        // The system prompt first: every chunk's prefill starts from its KV.
        let pieces: Vec<(Piece, Option<SeqKv>)> = match sys_kv {
            None => vec![(Piece::Sys, None)],
            Some(sys) => missing.chunks.iter().map(|&d| (Piece::Chunk(d), Some(sys.fork(sys.len())))).collect(),
        };
        for (piece, start) in pieces {
            self.chunk_jobs.next_tag += 1;
            let tag = CHUNK_TAG | self.chunk_jobs.next_tag;
            let tokens = piece.tokens(&prompt).to_vec();
            let n = tokens.len();
            let (kv, reused) = match start {
                Some(kv) => {
                    let held = kv.len();
                    (kv, held)
                }
                None => (SeqKv::new(&pool), 0),
            };
            let kind = if reused > 0 { MatchKind::Prefix } else { MatchKind::Miss };
            self.chunk_jobs.queue.push_back(BackgroundJob {
                owner: owner.clone(),
                tag,
                start: Checkout::own(format!("rag-chunk-{}", tag & !CHUNK_TAG), kind, tokens, vec![0; n], reused, kv),
                max_tokens: 0,
                stop: Vec::new(),
                priority: BackgroundPriority::BlockingOwner,
                hidden: Vec::new(),
            });
            let running = Running { owner: owner.clone(), tenant: tenant.clone(), chunk_dir: dir.clone(), prompt: prompt_of(seg), piece };
            self.chunk_jobs.running.insert(tag, running);
            self.chunk_jobs.waits.get_mut(owner).expect("begun above").in_flight += 1;
        }
        Readiness::AfterBackground
    }

    /// The next chunk job for the engine.
    pub(super) fn next_chunk_job(&mut self) -> Option<BackgroundJob> {
        self.chunk_jobs.queue.pop_front()
    }

    /// A chunk job ended: its KV stored in its tenant's chunk store and counted for its
    /// request, or its error kept for the request. `Err(done)` hands back any other job.
    pub(super) fn chunk_done(&mut self, done: BackgroundDone) -> Result<(), BackgroundDone> {
        let ours = done.tag & CHUNK_TAG != 0 && self.chunk_jobs.running.get(&done.tag).is_some_and(|r| r.owner == done.owner);
        if !ours {
            return Err(done);
        }
        let r = self.chunk_jobs.running.remove(&done.tag).expect("checked");
        let what = describe(r.piece, &r.prompt);
        let stored = match done.outcome {
            Ok(out) if out.tokens[..] == r.piece.tokens(&r.prompt)[..] => {
                let c = self.chunk_store(&r.tenant, r.chunk_dir.as_deref());
                let stored = c.store.insert(&r.prompt, &r.piece, out.kv).map_err(|e| e.to_string());
                c.dirty |= stored.is_ok();
                stored
            }
            Ok(_) => Err("its result holds other tokens than the piece's".into()),
            Err(e) => Err(e),
        };
        if stored.is_ok() {
            self.counters.blend_chunk_jobs.fetch_add(1, Relaxed);
        }
        if let Some(w) = self.chunk_jobs.waits.get_mut(&r.owner) {
            w.in_flight = w.in_flight.saturating_sub(1);
            match stored {
                Ok(()) => {
                    if let Piece::Chunk(d) = r.piece {
                        w.chunks_computed += 1;
                        w.tokens_computed += r.prompt.ends[d] - r.prompt.ends[d - 1];
                    } else {
                        w.tokens_computed += r.prompt.ends[0];
                    }
                }
                Err(e) => {
                    w.failed.get_or_insert(format!("prefilling {what} of the prompt failed: {e}"));
                }
            }
        }
        Ok(())
    }

    /// The wait of `owner`'s request, ended at its admission (`None`: it waited on nothing).
    pub(super) fn take_wait(&mut self, owner: &OwnerKey) -> Option<Wait> {
        let w = self.chunk_jobs.waits.remove(owner)?;
        self.chunk_jobs.order.retain(|o| o != owner);
        Some(w)
    }
}

impl ChunkJobs {
    /// Starts `owner`'s wait, dropping the oldest beyond [`MAX_REGISTERED`] (a request
    /// cancelled while it waited is never admitted to take its own).
    fn begin(&mut self, owner: &OwnerKey) {
        self.waits.insert(owner.clone(), Wait::default());
        self.order.push_back(owner.clone());
        while self.order.len() > MAX_REGISTERED {
            if let Some(old) = self.order.pop_front() {
                self.waits.remove(&old);
            }
        }
    }
}
