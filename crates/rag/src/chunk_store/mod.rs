//! [`ChunkStore`]: position-independent chunk KV (opt-in `blend` reuse).
//! Each retrieved chunk's KV is computed once on its own — right after the system prompt, at
//! positions `sys_len ..` — stored per (system prompt, chunk id), and attended wherever the
//! chunk lands in a later prompt: moved there with re-rotated keys (`SeqKv::extend_shifted`),
//! then repaired by CacheBlend-style selective recomputation ([`engram_engine::blend`]).
//!
//! ```text
//!  prompt:  sys │ c₇ │ c₂ │ c₉ │ question
//!  KV:      fork of entry (sys,c₇)        exact: c₇ sits where it was computed
//!                 + c₂ moved, + c₉ moved   approximate: they saw only sys when computed
//!           blend(ratio): recompute the most-deviating ratio of c₂, c₉'s tokens
//! ```
//! NOTE: computed after the system prompt, not at position 0: every prompt starts with the
//! same system prompt, so a chunk in first place needs no recomputation at all (its KV is the
//! exact tree path's), and every chunk's tokens saw the attention-sink tokens they will see
//! in any prompt — only the other chunks are missing from their context.
//!
//! Invariants: an entry holds exactly the KV the model computes for `sys + chunk` at positions
//! `0..` (so the first chunk of an assembly equals the exact path); entries are keyed by the
//! model's fingerprint and KV format (another model or format is a miss, never a wrong hit);
//! the bytes charged stay under the cap after every insert (least recently used chunks
//! evicted first). [`ChunkStore::save`] / [`ChunkStore::load`] (`files.rs`) keep it across
//! restarts as `engram-kv` entry files, used only once every check passes.

mod files;
pub use files::ChunkLoadReport;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::time::Instant;

use engram_engine::SamplingParams;
use engram_kv::{KvFormat, KvPool, SeqKv};
use engram_model::{Fingerprint, Model};

use crate::error::Result;
use crate::kv_tree::SegKey;
use crate::pipeline::{BlendStats, Prompt};
use crate::run::{self, Request};

/// A system prompt's KV and tokens.
struct Sys {
    kv: SeqKv,
    tokens: Vec<u32>,
}

struct Entry {
    /// KV of `sys + chunk`.
    kv: SeqKv,
    /// The chunk's own tokens.
    tokens: Vec<u32>,
    sys_len: usize,
    last_used: u64,
}

/// A prompt's KV assembled from the store, before recomputation.
pub struct Assembled {
    /// KV of `tokens` (slots are positions).
    pub kv: SeqKv,
    /// The prompt's tokens through its last chunk.
    pub tokens: Vec<u32>,
    /// Slots holding moved chunks (every chunk but the first).
    pub moved: Vec<Range<usize>>,
    /// Chunks found in the store / computed for this prompt.
    pub chunks_reused: usize,
    pub chunks_computed: usize,
    /// Tokens of `tokens` prefilled by this call (a system prompt or chunks not stored yet).
    pub tokens_computed: usize,
}

/// Counts for stats.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ChunkStoreStats {
    pub entries: usize,
    pub bytes: usize,
    pub cap_bytes: usize,
    pub evicted: u64,
}

/// The chunk KV store. See the module doc.
pub struct ChunkStore {
    fingerprint: Fingerprint,
    format: KvFormat,
    bytes_per_token: usize,
    cap_bytes: usize,
    /// System prompts' KV by key (charged for their tokens).
    sys: HashMap<SegKey, Sys>,
    entries: HashMap<(SegKey, SegKey), Entry>,
    clock: u64,
    evicted: u64,
    /// Entry files this store wrote or loaded (`files.rs`).
    on_disk: HashSet<String>,
}

/// Which step of [`ChunkStore::assemble_blended`] failed.
#[derive(Debug)]
pub enum BlendFailure {
    /// Looking up, computing or moving the chunks' KV.
    Assemble(crate::error::RagError),
    /// The selective recomputation.
    Blend(engram_engine::EngineError),
}

impl ChunkStore {
    /// An empty store for one model (`fingerprint`) and KV format, charging
    /// `bytes_per_token` per chunk token held, within `cap_bytes`.
    pub fn new(fingerprint: Fingerprint, format: KvFormat, bytes_per_token: usize, cap_bytes: usize) -> ChunkStore {
        ChunkStore {
            fingerprint,
            format,
            bytes_per_token,
            cap_bytes,
            sys: HashMap::new(),
            entries: HashMap::new(),
            clock: 0,
            evicted: 0,
            on_disk: HashSet::new(),
        }
    }

    /// Whether chunk `chunk` after system prompt `sys` is stored for this model and format.
    pub fn contains(&self, fingerprint: Fingerprint, format: KvFormat, sys: &SegKey, chunk: &SegKey) -> bool {
        fingerprint == self.fingerprint && format == self.format && self.entries.contains_key(&(sys.clone(), chunk.clone()))
    }

    /// [`ChunkStore::assemble`], then [`engram_engine::blend`] of the moved chunks with `ratio`,
    /// both timed: the blended assembly and what it reused and recomputed. The one way a blended
    /// prompt is built, for `Rag::query` and the server's blend admission alike.
    pub fn assemble_blended(
        &mut self,
        model: &Model,
        pool: &KvPool,
        prompt: &Prompt,
        ratio: f32,
    ) -> std::result::Result<(Assembled, BlendStats), BlendFailure> {
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let mut a = self.assemble(model, pool, prompt).map_err(BlendFailure::Assemble)?;
        let assemble_ms = ms(t1);
        let t2 = Instant::now();
        let r = engram_engine::blend(model, &mut a.kv, &a.tokens, &a.moved, ratio).map_err(BlendFailure::Blend)?;
        let stats = BlendStats {
            ratio,
            chunks_reused: a.chunks_reused,
            chunks_computed: a.chunks_computed,
            moved_tokens: r.moved_tokens,
            recomputed_tokens: r.recomputed_tokens,
            probed_tokens: r.probed_tokens,
            assemble_ms,
            recompute_ms: ms(t2),
        };
        Ok((a, stats))
    }

    /// The KV of `prompt`'s system prompt and chunks (`prompt.path`, `prompt.ends`), each chunk
    /// taken from the store or computed and stored first; the first chunk is forked in place,
    /// the others moved behind it. With another model or KV format than the store's, nothing
    /// is stored and every chunk is computed (the result is still right).
    pub fn assemble(&mut self, model: &Model, pool: &KvPool, prompt: &Prompt) -> Result<Assembled> {
        let own = model.fingerprint == self.fingerprint && pool.format() == self.format;
        let sys_end = prompt.ends[0];
        let sys_key = prompt.path[0].clone();
        let sys_tokens = &prompt.tokens[..sys_end];
        let mut tokens_computed = 0;
        let sys_kv = match self.sys.get(&sys_key).filter(|e| own && e.tokens == sys_tokens) {
            Some(e) => e.kv.fork(sys_end),
            None => {
                tokens_computed += sys_end;
                let kv = prefill(model, pool, sys_tokens.to_vec(), None)?;
                if own {
                    self.sys.insert(sys_key.clone(), Sys { kv: kv.fork(sys_end), tokens: sys_tokens.to_vec() });
                }
                kv
            }
        };
        self.clock += 1;
        let end = *prompt.ends.last().expect("a prompt has its system segment");
        let mut out = Assembled {
            kv: sys_kv.fork(sys_end),
            tokens: prompt.tokens[..end].to_vec(),
            moved: Vec::new(),
            chunks_reused: 0,
            chunks_computed: 0,
            tokens_computed,
        };
        for d in 1..prompt.path.len() {
            let range = prompt.ends[d - 1]..prompt.ends[d];
            let chunk_tokens = &prompt.tokens[range.clone()];
            let key = (sys_key.clone(), prompt.path[d].clone());
            let hit = own && self.entries.get(&key).is_some_and(|e| e.tokens == chunk_tokens && e.sys_len == sys_end);
            if hit {
                out.chunks_reused += 1;
            } else {
                let kv = prefill(model, pool, [sys_tokens, chunk_tokens].concat(), Some(sys_kv.fork(sys_end)))?;
                self.entries.insert(key.clone(), Entry { kv, tokens: chunk_tokens.to_vec(), sys_len: sys_end, last_used: self.clock });
                out.chunks_computed += 1;
                out.tokens_computed += chunk_tokens.len();
            }
            let e = self.entries.get_mut(&key).expect("present or just inserted");
            e.last_used = self.clock;
            if d == 1 {
                out.kv = e.kv.fork(range.end);
            } else {
                out.kv
                    .extend_shifted(&e.kv, sys_end..sys_end + chunk_tokens.len(), &model.config)
                    .map_err(engram_engine::EngineError::Kv)?;
                out.moved.push(range);
            }
            if !own {
                self.entries.remove(&key);
            }
        }
        self.evict_to_cap();
        Ok(out)
    }

    /// Bytes charged: every stored token (system prompts' and chunks') × bytes per token.
    pub fn bytes(&self) -> usize {
        let sys: usize = self.sys.values().map(|e| e.tokens.len()).sum();
        let chunks: usize = self.entries.values().map(|e| e.tokens.len()).sum();
        (sys + chunks) * self.bytes_per_token
    }

    fn evict_to_cap(&mut self) {
        while self.bytes() > self.cap_bytes {
            if !self.evict_lru() {
                break;
            }
        }
    }

    /// Drops the least recently used chunk (or, with none left, the system prompts: they are
    /// recomputed on the next use); whether anything was freed. The engine's `make_room`
    /// calls this when RAM is short.
    pub fn evict_lru(&mut self) -> bool {
        let victim = self.entries.iter().min_by_key(|(k, e)| (e.last_used, (*k).clone())).map(|(k, _)| k.clone());
        match victim {
            Some(k) => {
                self.entries.remove(&k);
                self.evicted += 1;
                true
            }
            None if self.sys.is_empty() => false,
            None => {
                self.sys.clear();
                true
            }
        }
    }

    /// Drops the entries of `chunks` (removed or replaced chunks).
    pub fn forget_chunks(&mut self, chunks: &[SegKey]) {
        self.entries.retain(|(_, c), _| !chunks.contains(c));
    }

    /// Counts.
    pub fn stats(&self) -> ChunkStoreStats {
        ChunkStoreStats { entries: self.entries.len(), bytes: self.bytes(), cap_bytes: self.cap_bytes, evicted: self.evicted }
    }
}

/// The KV of `tokens`, prefilled through the engine's step on this thread (`run::alone`, no
/// token sampled) after `start`, which holds the system prompt's KV when given (its length the
/// tokens it holds).
fn prefill(model: &Model, pool: &KvPool, tokens: Vec<u32>, start: Option<SeqKv>) -> Result<SeqKv> {
    let reused = start.as_ref().map_or(0, |kv| kv.len());
    let req = Request { prompt: tokens, start, reused, params: SamplingParams { max_tokens: 0, ..SamplingParams::default() } };
    let ran = run::alone(model, pool, req, engram_engine::DEFAULT_PREFILL_CHUNK, &mut || false)?.expect("never stopped");
    Ok(ran.kv)
}
