//! [`ChunkStore`]: position-independent chunk KV (opt-in `blend` reuse).
//! Each retrieved chunk's KV is computed once on its own — right after the system prompt, at
//! positions `sys_len ..` — stored per (system prompt, chunk id), and attended wherever the
//! chunk lands in a later prompt: moved there with re-rotated keys (`SeqKv::extend_shifted`),
//! then repaired by CacheBlend-style selective recomputation ([`engram_engine::blend`], run by
//! the engine's step for a checkout's [`engram_policy::Repair`]).
//!
//! ```text
//!  prompt:  sys │ c₇ │ c₂ │ c₉ │ question
//!  KV:      fork of entry (sys,c₇)        exact: c₇ sits where it was computed
//!                 + c₂ moved, + c₉ moved   approximate: they saw only sys when computed
//!           repair (ratio): the engine's step recomputes the most-deviating ratio of c₂, c₉'s tokens
//! ```
//! Filled two ways: [`ChunkStore::assemble`] prefills what [`ChunkStore::missing`] names on its
//! caller's thread (`Rag::query`), or the server's engine prefills each missing [`Piece`] as a
//! background job that [`ChunkStore::insert`]s it (`crate::TreePolicy`), whose admission then
//! calls [`ChunkStore::assemble_stored`], which runs no model.
//!
//! NOTE: computed after the system prompt, not at position 0: every prompt starts with the
//! same system prompt, so a chunk in first place needs no recomputation at all (its KV is the
//! exact tree path's), and every chunk's tokens saw the attention-sink tokens they will see
//! in any prompt — only the other chunks are missing from their context.
//!
//! Invariants: an entry holds exactly the KV the model computes for `sys + chunk` at positions
//! `0..` (so the first chunk of an assembly equals the exact path); entries are keyed by the
//! model's fingerprint and KV format (another model or format is a miss, never a wrong hit);
//! the bytes charged stay under the cap after every assembly (least recently used chunks
//! evicted first; an insert evicts nothing, so the pieces stored for a prompt are still there
//! when it is assembled). [`ChunkStore::save`] / [`ChunkStore::load`] (`files.rs`) keep it across
//! restarts as `engram-kv` entry files, used only once every check passes.

mod files;
pub use files::ChunkLoadReport;

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use engram_engine::SamplingParams;
use engram_kv::{KvFormat, KvPool, SeqKv};
use engram_model::{Fingerprint, Model};

use crate::error::Result;
use crate::kv_tree::SegKey;
use crate::pipeline::Prompt;
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

/// A piece of a prompt's KV the store holds on its own: the system prompt, or the chunk of
/// segment `d` (≥ 1) computed right after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    Sys,
    Chunk(usize),
}

impl Piece {
    /// The tokens a prefill of this piece of `prompt` runs and its KV holds: the system
    /// prompt, or the system prompt then the chunk (whose KV starts from the system prompt's).
    pub fn tokens<'p>(&self, prompt: &'p Prompt) -> std::borrow::Cow<'p, [u32]> {
        let sys = &prompt.tokens[..prompt.ends[0]];
        match *self {
            Piece::Sys => std::borrow::Cow::Borrowed(sys),
            Piece::Chunk(d) => std::borrow::Cow::Owned([sys, &prompt.tokens[prompt.ends[d - 1]..prompt.ends[d]]].concat()),
        }
    }
}

/// What of a prompt's KV a store lacks ([`ChunkStore::missing`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Missing {
    /// The system prompt's KV (every chunk's prefill starts from it).
    pub sys: bool,
    /// Segments (≥ 1) whose chunk is not stored.
    pub chunks: Vec<usize>,
}

impl Missing {
    /// Nothing is missing.
    pub fn is_empty(&self) -> bool {
        !self.sys && self.chunks.is_empty()
    }
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

    /// The KV of `prompt`'s system prompt and chunks (`prompt.path`, `prompt.ends`), each piece
    /// the store lacks ([`ChunkStore::missing`]) prefilled on this thread (`run::alone`) and
    /// stored first, then [`ChunkStore::assemble_stored`]. With another model or KV format than
    /// the store's, nothing is stored and every chunk is computed (the result is still right).
    pub fn assemble(&mut self, model: &Model, pool: &KvPool, prompt: &Prompt) -> Result<Assembled> {
        if model.fingerprint != self.fingerprint || pool.format() != self.format {
            let mut scratch = ChunkStore::new(model.fingerprint, pool.format(), self.bytes_per_token, usize::MAX);
            return scratch.assemble(model, pool, prompt);
        }
        let missing = self.missing(prompt);
        let (mut chunks_computed, mut tokens_computed) = (0, 0);
        if missing.sys {
            let kv = prefill(model, pool, Piece::Sys.tokens(prompt).to_vec(), None)?;
            tokens_computed += prompt.ends[0];
            self.insert(prompt, &Piece::Sys, kv)?;
        }
        for &d in &missing.chunks {
            let piece = Piece::Chunk(d);
            let start = self.sys_kv(prompt).expect("stored above");
            let kv = prefill(model, pool, piece.tokens(prompt).to_vec(), Some(start))?;
            chunks_computed += 1;
            tokens_computed += prompt.ends[d] - prompt.ends[d - 1];
            self.insert(prompt, &piece, kv)?;
        }
        let mut a = self.assemble_stored(model, prompt)?;
        a.chunks_reused -= chunks_computed;
        a.chunks_computed = chunks_computed;
        a.tokens_computed = tokens_computed;
        Ok(a)
    }

    /// What of `prompt`'s system prompt and chunks this store lacks (for its own model and KV
    /// format): each missing piece is prefilled as [`Piece::tokens`] over [`ChunkStore::sys_kv`]
    /// (a chunk) or from nothing (the system prompt) and handed to [`ChunkStore::insert`].
    pub fn missing(&self, prompt: &Prompt) -> Missing {
        let sys_end = prompt.ends[0];
        let sys_key = &prompt.path[0];
        let sys = self.sys.get(sys_key).is_none_or(|e| e.tokens != prompt.tokens[..sys_end]);
        let chunks = (1..prompt.path.len())
            .filter(|&d| {
                let chunk_tokens = &prompt.tokens[prompt.ends[d - 1]..prompt.ends[d]];
                let key = (sys_key.clone(), prompt.path[d].clone());
                self.entries.get(&key).is_none_or(|e| e.tokens != chunk_tokens || e.sys_len != sys_end)
            })
            .collect();
        Missing { sys, chunks }
    }

    /// The stored KV of `prompt`'s system prompt (a fork), where a chunk's prefill starts.
    pub fn sys_kv(&self, prompt: &Prompt) -> Option<SeqKv> {
        let sys_end = prompt.ends[0];
        self.sys.get(&prompt.path[0]).filter(|e| e.tokens == prompt.tokens[..sys_end]).map(|e| e.kv.fork(sys_end))
    }

    /// Stores `kv`, the prefill of `piece` of `prompt` (it must hold exactly
    /// [`Piece::tokens`]: a chunk's entry holds the system prompt's KV too). Nothing is evicted
    /// here: the next assembly keeps the store under its cap.
    pub fn insert(&mut self, prompt: &Prompt, piece: &Piece, kv: SeqKv) -> Result<()> {
        let tokens = piece.tokens(prompt);
        if kv.len() != tokens.len() {
            return Err(crate::error::RagError::Model(format!(
                "a prefilled piece holds {} tokens of KV, not its {} tokens",
                kv.len(),
                tokens.len()
            )));
        }
        let sys_end = prompt.ends[0];
        let sys_key = prompt.path[0].clone();
        match *piece {
            Piece::Sys => {
                self.sys.insert(sys_key, Sys { kv, tokens: tokens.to_vec() });
            }
            Piece::Chunk(d) => {
                let chunk = prompt.tokens[prompt.ends[d - 1]..prompt.ends[d]].to_vec();
                let entry = Entry { kv, tokens: chunk, sys_len: sys_end, last_used: self.clock };
                self.entries.insert((sys_key, prompt.path[d].clone()), entry);
            }
        }
        Ok(())
    }

    /// The KV of `prompt`'s system prompt and chunks from the store alone — the first chunk
    /// forked in place, the others moved behind it (`Assembled::moved`) — without running the
    /// model; an error naming the first piece the store lacks ([`ChunkStore::missing`]). Every
    /// chunk counts as reused. Then the store is brought under its cap.
    pub fn assemble_stored(&mut self, model: &Model, prompt: &Prompt) -> Result<Assembled> {
        let lacks = |what: String| crate::error::RagError::Model(format!("the chunk store does not hold {what}"));
        if model.fingerprint != self.fingerprint {
            return Err(lacks("KV of this model".into()));
        }
        let sys_end = prompt.ends[0];
        let sys_key = prompt.path[0].clone();
        let sys_kv = self.sys_kv(prompt).ok_or_else(|| lacks("the prompt's system prompt".into()))?;
        self.clock += 1;
        let end = *prompt.ends.last().expect("a prompt has its system segment");
        let mut out = Assembled {
            kv: sys_kv,
            tokens: prompt.tokens[..end].to_vec(),
            moved: Vec::new(),
            chunks_reused: 0,
            chunks_computed: 0,
            tokens_computed: 0,
        };
        for d in 1..prompt.path.len() {
            let range = prompt.ends[d - 1]..prompt.ends[d];
            let chunk_tokens = &prompt.tokens[range.clone()];
            let key = (sys_key.clone(), prompt.path[d].clone());
            let e = self
                .entries
                .get_mut(&key)
                .filter(|e| e.tokens == chunk_tokens && e.sys_len == sys_end)
                .ok_or_else(|| lacks(format!("chunk {:?}", prompt.path[d])))?;
            e.last_used = self.clock;
            out.chunks_reused += 1;
            if d == 1 {
                out.kv = e.kv.fork(range.end);
            } else {
                out.kv
                    .extend_shifted(&e.kv, sys_end..sys_end + chunk_tokens.len(), &model.config)
                    .map_err(engram_engine::EngineError::Kv)?;
                out.moved.push(range);
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
    let req =
        Request { prompt: tokens, start, reused, params: SamplingParams { max_tokens: 0, ..SamplingParams::default() }, repair: None };
    let ran = run::alone(model, pool, req, engram_engine::DEFAULT_PREFILL_CHUNK, &mut || false)?.expect("never stopped");
    Ok(ran.kv)
}
