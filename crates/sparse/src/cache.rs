//! [`SparseKv`]: one sequence's KV (f16, all in RAM) that answers each single-token step's
//! attention with only the keys its method retrieves, per (layer, KV head).
//!
//! Storage per layer is `[kv_head][capacity][head_dim]` f16 keys and values (the model's chunk
//! layout), slot = position (a linear sequence). Until [`SparseKv::build_index`] (the end of
//! the prefill), and for every step of more than one token, the view is every key (exact
//! attention, one chunk). After it, a one-token step's read of KV head `h` is answered with one
//! chunk gathered from the sinks, the method's chosen tokens and the recent window, sorted by
//! position and named key by key (the view contract, `engram_model::view`).
//!
//! Invariant: the keys a sparse read yields are exactly the selection it made (kept as
//! [`SparseKv::last_selection`]), in position order; with a budget covering the history they are every visible
//! key, in the exact path's order, so attention equals the exact path's. A sparse read's
//! chunk is numbered from key 0 (its keys are a subset), so a [`engram_model::KeyMask`] must
//! not be used on one-token steps after the index is built.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use engram_model::{KvCache, KvChunk, KvData, KvElem, KvRead, ModelConfig};
use half::f16;

use crate::keys::HeadKeys;
use crate::method::{HeadIndex, IndexStats, Method};
use crate::offload::{HeadSource, Offloaded, Purpose};
use crate::placement::Calib;
use crate::probe::Probe;
use crate::shared::SharedIndex;

/// How a sparse step chooses its keys. Invariant: `sinks + recent` tokens are always
/// attended; `budget` bounds the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseConfig {
    pub method: Method,
    /// Tokens retrieved per (layer, KV head) and step, besides the sinks and the recent window.
    pub budget: usize,
    /// The first tokens of the sequence (attention sinks), always attended.
    pub sinks: usize,
    /// The last tokens, always attended.
    pub recent: usize,
}

impl SparseConfig {
    /// The defaults: 2,048 retrieved tokens, 4 sinks, a recent window of 64.
    pub fn new(method: Method) -> SparseConfig {
        SparseConfig { method, budget: 2048, sinks: 4, recent: 64 }
    }
}

thread_local! {
    /// Per attention thread: gathered keys, values and positions of the last sparse read.
    pub(crate) static GATHER: RefCell<(Vec<f16>, Vec<f16>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// One sequence's KV with sparse retrieval (module doc).
pub struct SparseKv {
    pub(crate) layers: usize,
    pub(crate) heads: usize,
    pub(crate) dim: usize,
    pub(crate) cfg: Option<SparseConfig>,
    /// Slots per head in `keys`/`values` (slot = position - `origin[layer]`).
    pub(crate) cap: usize,
    /// Tokens stored, per layer.
    pub(crate) lens: Vec<usize>,
    pub(crate) keys: Vec<Vec<f16>>,
    pub(crate) values: Vec<Vec<f16>>,
    /// Per layer: the first position held in `keys`/`values` (0 until offloaded; after, the
    /// older positions but the sinks are in the file).
    pub(crate) origin: Vec<usize>,
    /// The offloaded part (`None`: all KV in RAM).
    pub(crate) off: Option<Box<Offloaded>>,
    /// `layer * heads + head`: the index (shared copy on write with pending saves'
    /// snapshots) and the last selection it made; empty until built.
    pub(crate) index: Vec<Mutex<(SharedIndex, Vec<u32>)>>,
    pub(crate) built: bool,
    /// Reads are exact for now (the index is kept up to date): for timing both paths on one
    /// cache, step by step.
    bypass: bool,
    pub(crate) probe: Option<Probe>,
    /// `layer * heads + head`: the prefill's last query tokens, for co-retrieval placement
    /// (`crate::placement`); recorded until the index is built.
    pub(crate) calib: Vec<Mutex<Calib>>,
    reads: AtomicUsize,
    attended: AtomicUsize,
    /// The most KV bytes held in RAM after a write (before what it made go to the file).
    pub(crate) peak_ram: usize,
}

impl SparseKv {
    /// An empty cache for `model`'s layers and KV heads; `cfg: None` is exact attention.
    pub fn new(model: &ModelConfig, cfg: Option<SparseConfig>) -> SparseKv {
        SparseKv::with_shape(model.num_layers, model.num_kv_heads, model.head_dim, cfg)
    }

    /// An empty cache of `layers × heads` heads of `dim` elements.
    pub fn with_shape(layers: usize, heads: usize, dim: usize, cfg: Option<SparseConfig>) -> SparseKv {
        SparseKv {
            layers,
            heads,
            dim,
            cfg,
            cap: 0,
            lens: vec![0; layers],
            keys: vec![Vec::new(); layers],
            values: vec![Vec::new(); layers],
            origin: vec![0; layers],
            off: None,
            index: Vec::new(),
            built: false,
            bypass: false,
            probe: None,
            calib: (0..layers * heads).map(|_| Mutex::default()).collect(),
            reads: AtomicUsize::new(0),
            attended: AtomicUsize::new(0),
            peak_ram: 0,
        }
    }

    /// A copy of the stored keys and values under `cfg` (`None`: exact), without an index
    /// ([`SparseKv::build_index`] makes one) and with empty counters; the prefill's
    /// calibration queries come along (so the copy's index places its clusters alike).
    /// Panics on an offloaded cache (its older KV is in its file, which is not shared).
    pub fn fork(&self, cfg: Option<SparseConfig>) -> SparseKv {
        assert!(self.off.is_none(), "SparseKv::fork of an offloaded cache");
        SparseKv {
            cap: self.cap,
            lens: self.lens.clone(),
            keys: self.keys.clone(),
            values: self.values.clone(),
            origin: self.origin.clone(),
            calib: self.calib.iter().map(|c| Mutex::new(c.lock().expect("calib lock").clone())).collect(),
            ..SparseKv::with_shape(self.layers, self.heads, self.dim, cfg)
        }
    }

    /// A copy of the stored keys and values with a copy of the index (same configuration,
    /// empty counters): the copy then decodes exactly as this cache would. Panics on an
    /// offloaded cache.
    pub fn fork_with_index(&self) -> SparseKv {
        let mut kv = self.fork(self.cfg);
        kv.index = self
            .index
            .iter()
            .map(|i| {
                let i = i.lock().expect("index lock");
                Mutex::new((SharedIndex::new(i.0.clone_box()), i.1.clone()))
            })
            .collect();
        kv.built = self.built;
        kv
    }

    /// Switches to `cfg` (`None`: exact), dropping the index and the counters; the stored
    /// keys and values stay. Panics on an offloaded cache (its file is laid out by its index).
    /// The prefill's calibration queries stay (`crate::placement`).
    pub fn set_config(&mut self, cfg: Option<SparseConfig>) {
        assert!(self.off.is_none(), "SparseKv::set_config of an offloaded cache");
        self.cfg = cfg;
        self.index = Vec::new();
        self.built = false;
        self.reads = AtomicUsize::new(0);
        self.attended = AtomicUsize::new(0);
    }

    /// Makes reads exact (`true`) or sparse again (`false`) without touching the index, which
    /// keeps taking every new token: the same cache timed both ways, step by step.
    pub fn set_bypass(&mut self, exact: bool) {
        self.bypass = exact;
    }

    /// Measures, on every sparse read, the exact attention mass the chosen keys hold and the
    /// attention output's relative error per layer ([`Probe`]; f64, every visible key).
    pub fn with_probe(mut self) -> SparseKv {
        self.probe = Some(Probe::new(self.layers));
        self
    }

    /// The probe's figures, if probing.
    pub fn probe(&self) -> Option<&Probe> {
        self.probe.as_ref()
    }

    /// The most bytes of KV this cache held in RAM after a write, before the tokens that write
    /// sent to the file (an in-RAM cache: all it stored; [`SparseKv::ram_kv_bytes`] is now).
    pub fn peak_ram_kv_bytes(&self) -> usize {
        self.peak_ram
    }

    /// Tokens stored in every layer.
    pub fn len(&self) -> usize {
        self.lens.iter().copied().min().unwrap_or(0)
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configuration (`None`: exact).
    pub fn config(&self) -> Option<SparseConfig> {
        self.cfg
    }

    /// Bytes of keys and values stored (f16).
    pub fn kv_bytes(&self) -> usize {
        self.layers * self.heads * self.len() * self.dim * 2 * 2
    }

    /// Mean keys attended per sparse read (one layer, one KV head, one step), and the reads.
    pub fn mean_attended(&self) -> (f64, usize) {
        let r = self.reads.load(Ordering::Relaxed);
        (self.attended.load(Ordering::Relaxed) as f64 / r.max(1) as f64, r)
    }

    /// The indexes' counters, summed over heads.
    pub fn index_stats(&self) -> IndexStats {
        self.index.iter().map(|i| i.lock().expect("index lock").0.stats()).fold(IndexStats::default(), IndexStats::add)
    }

    /// Makes room for `n` more tokens.
    pub fn reserve(&mut self, n: usize) {
        let need = (0..self.layers).map(|l| self.lens[l] - self.origin[l]).max().unwrap_or(0) + n;
        if need <= self.cap {
            return;
        }
        let cap = need.max(self.cap * 2).max(256);
        self.resize_slots(cap);
    }

    /// The index's bytes as a save encodes it, every head ([`HeadIndex::saved_len`]): what
    /// the KV pool charges for it. A clustered index (DynaKV's) is measured without
    /// allocating.
    pub fn index_bytes(&self) -> usize {
        self.index.iter().map(|i| i.lock().expect("index lock").0.saved_len()).sum()
    }

    /// Reallocates the RAM slots to `cap` per head (`cap` >= every layer's held tokens).
    pub(crate) fn resize_slots(&mut self, cap: usize) {
        let (d, old) = (self.dim, self.cap);
        for l in 0..self.layers {
            let len = self.lens[l] - self.origin[l];
            for buf in [&mut self.keys[l], &mut self.values[l]] {
                let mut next = vec![f16::ZERO; self.heads * cap * d];
                for h in 0..self.heads {
                    next[h * cap * d..(h * cap + len) * d].copy_from_slice(&buf[h * old * d..(h * old + len) * d]);
                }
                *buf = next;
            }
        }
        self.cap = cap;
    }

    /// Builds every head's index over the tokens stored (the end of the prefill), in
    /// parallel over heads; for a bounded prefill ([`SparseKv::offload_streaming`]), finishes
    /// it (the index was built as the prompt was written). Later tokens join the indexes as
    /// they are written. Does nothing for an exact cache or one already built.
    pub fn build_index(&mut self) {
        let Some(cfg) = self.cfg else { return };
        if self.built {
            return;
        }
        if self.streaming() {
            return self.finish_stream();
        }
        let index: Vec<Mutex<(SharedIndex, Vec<u32>)>> =
            (0..self.layers * self.heads).map(|_| Mutex::new((SharedIndex::new(cfg.method.index(self.dim)), Vec::new()))).collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(index.len()).max(1);
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= index.len() {
                        break;
                    }
                    let n = self.lens[i / self.heads];
                    let keys = self.head_keys(i / self.heads, i % self.heads, n);
                    let mut idx = index[i].lock().expect("index lock");
                    let head = idx.0.make_mut();
                    head.build(keys);
                    self.calib[i].lock().expect("calib lock").apply(head, n, &cfg);
                    head.drain_touched(&mut Vec::new());
                });
            }
        });
        self.index = index;
        self.built = true;
    }

    /// Whether the indexes are built.
    pub fn is_built(&self) -> bool {
        self.built
    }

    /// Keys `0..n` of (layer, head), all in RAM (before any offload).
    fn head_keys(&self, layer: usize, head: usize, n: usize) -> HeadKeys<'_> {
        assert!(self.off.is_none(), "head_keys of an offloaded cache");
        let base = head * self.cap * self.dim;
        HeadKeys::new(&self.keys[layer][base..base + n * self.dim], self.dim)
    }

    /// The offloaded view of (layer, head) for one step at `now`, or `None` when in RAM.
    pub(crate) fn source(&self, layer: usize, head: usize, purpose: Purpose, now: u64) -> Option<HeadSource<'_>> {
        let off = self.off.as_deref()?;
        let (d, base, held) = (self.dim, head * self.cap * self.dim, self.lens[layer] - self.origin[layer]);
        Some(HeadSource {
            off,
            layer,
            head,
            heads: self.heads,
            dim: d,
            origin: self.origin[layer],
            tail_k: &self.keys[layer][base..base + held * d],
            tail_v: &self.values[layer][base..base + held * d],
            purpose,
            now,
        })
    }

    /// The last selection made for (layer, KV head) (sorted positions; empty before one).
    pub fn last_selection(&self, layer: usize, head: usize) -> Vec<u32> {
        self.index.get(layer * self.heads + head).map_or_else(Vec::new, |i| i.lock().expect("index lock").1.clone())
    }

    /// Chooses the tokens a one-token read attends (sorted positions; an adaptive index may
    /// split the clusters it fetched, so asking twice may answer differently), or `None`
    /// where the read is exact (no index yet, several query tokens, an exact cache).
    pub fn selection(&self, read: &KvRead<'_>) -> Option<Vec<u32>> {
        let cfg = self.cfg?;
        if !self.built || self.bypass || read.positions.len() != 1 {
            return None;
        }
        let n = (read.positions[0] as usize + 1).min(self.lens[read.layer]);
        let sinks = cfg.sinks.min(n);
        let recent_from = n.saturating_sub(cfg.recent).max(sinks);
        let mut sel: Vec<u32> = (0..sinks as u32).collect();
        let mut idx = self.index[read.layer * self.heads + read.kv_head].lock().expect("index lock");
        let len = self.lens[read.layer];
        match self.source(read.layer, read.kv_head, Purpose::Retrieval, read.positions[0] as u64) {
            Some(src) => {
                idx.0.make_mut().select(HeadKeys::from_source(&src, len, self.dim), read.queries, sinks..recent_from, cfg.budget, &mut sel);
                self.mark_touched(read.layer, read.kv_head, idx.0.make_mut(), read.positions[0] as u64);
            }
            None => idx.0.make_mut().select(
                self.head_keys(read.layer, read.kv_head, len),
                read.queries,
                sinks..recent_from,
                cfg.budget,
                &mut sel,
            ),
        }
        sel.extend(recent_from as u32..n as u32);
        sel.sort_unstable();
        sel.dedup();
        idx.1.clone_from(&sel);
        Some(sel)
    }

    /// Marks in the cluster cache the clusters of (layer, head) that changed (offloaded only).
    fn mark_touched(&self, layer: usize, head: usize, idx: &mut dyn HeadIndex, now: u64) {
        let mut touched = Vec::new();
        idx.drain_touched(&mut touched);
        if let Some(off) = self.off.as_deref() {
            let mut cache = off.shared.cache.lock().expect("cache lock");
            for c in touched {
                cache.mark_updated((layer as u32, head as u32, c), now);
            }
        }
    }

    fn exact_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let len = self.lens[layer];
        if len == 0 {
            return;
        }
        if self.off.is_some() {
            return self.gathered_exact(layer, f);
        }
        f(&KvChunk {
            first_pos: 0,
            positions: None,
            key_index: 0,
            len,
            capacity: self.cap,
            keys: KvData { elem: KvElem::F16, bytes: bytemuck::cast_slice(&self.keys[layer]) },
            values: KvData { elem: KvElem::F16, bytes: bytemuck::cast_slice(&self.values[layer]) },
            mask: None,
            ahead: None,
        });
    }
}

impl KvCache for SparseKv {
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        assert_eq!(first_pos, self.lens[layer], "SparseKv stores a linear sequence: write at its end");
        let slot0 = first_pos - self.origin[layer];
        assert!(slot0 + num_tokens <= self.cap, "SparseKv::write past the reserved room (reserve first)");
        let (d, w) = (self.dim, self.heads * self.dim);
        for t in 0..num_tokens {
            let slot0 = first_pos - self.origin[layer];
            for h in 0..self.heads {
                let dst = (h * self.cap + slot0 + t) * d;
                for (buf, src) in [(&mut self.keys[layer], keys), (&mut self.values[layer], values)] {
                    for (o, &x) in buf[dst..dst + d].iter_mut().zip(&src[t * w + h * d..t * w + (h + 1) * d]) {
                        *o = f16::from_f32(x);
                    }
                }
            }
            self.lens[layer] += 1;
            if self.built && self.offload_failure().is_none() {
                let (len, now) = (self.lens[layer], (first_pos + t) as u64);
                for h in 0..self.heads {
                    let mut idx = self.index[layer * self.heads + h].lock().expect("index lock");
                    match self.source(layer, h, Purpose::Split, now) {
                        Some(src) => {
                            idx.0.make_mut().append(HeadKeys::from_source(&src, len, d));
                            src.finish();
                        }
                        None => idx.0.make_mut().append(self.head_keys(layer, h, len)),
                    }
                    self.mark_touched(layer, h, idx.0.make_mut(), now);
                }
            }
            if self.off.is_some() && !self.streaming() {
                self.flush_if_due(layer);
            }
        }
        self.peak_ram = self.peak_ram.max(self.ram_kv_bytes());
        if self.streaming() {
            self.stream_step(layer);
        }
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.exact_chunk(layer, f)
    }

    fn read_failure(&self) -> Option<String> {
        self.offload_failure()
    }

    fn for_each_chunk_of(&self, read: &KvRead<'_>, f: &mut dyn FnMut(&KvChunk<'_>)) {
        if self.offload_failure().is_some() {
            return; // failed: nothing more is answered (the forward pass reports why)
        }
        let Some(sel) = self.selection(read) else {
            if !self.built {
                // Also without a method yet: a cache given one later (`set_config`) keeps them.
                self.calib[read.layer * self.heads + read.kv_head].lock().expect("calib lock").record(read);
            }
            if self.off.is_some() {
                return self.gathered_all(read, f);
            }
            return self.exact_chunk(read.layer, f);
        };
        if sel.is_empty() {
            return self.read_done(read.layer, read.positions[0] as u64);
        }
        let (h, m) = (read.kv_head, sel.len());
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.attended.fetch_add(m, Ordering::Relaxed);
        if let Some(p) = &self.probe {
            p.record(read, self.head_keys(read.layer, h, self.lens[read.layer]), self.head_values(read.layer, h), &sel);
        }
        self.emit(read.layer, h, sel, read.positions[0] as u64, true, f);
        self.read_done(read.layer, read.positions[0] as u64);
    }
}

impl SparseKv {
    /// Gathers `sel` (sorted positions) of (layer, KV head `h`) into one chunk and calls `f`.
    /// `units`: the index's fetched clusters are read (and cached) as units.
    pub(crate) fn emit(&self, layer: usize, h: usize, sel: Vec<u32>, now: u64, units: bool, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let (d, m) = (self.dim, sel.len());
        GATHER.with(|g| {
            let (gk, gv, pos) = &mut *g.borrow_mut();
            // The chunk layout is `[kv_head][capacity]`: with capacity `m`, head `h`'s rows
            // start at row `h * m`; rows of other heads are never read.
            for buf in [&mut *gk, &mut *gv] {
                if buf.len() < (h + 1) * m * d {
                    buf.resize((h + 1) * m * d, f16::ZERO);
                }
            }
            if let Some(src) = self.source(layer, h, Purpose::Retrieval, now) {
                let idx = self.index.get(layer * self.heads + h).filter(|_| units).map(|i| i.lock().expect("index lock"));
                let none = crate::method::NoIndex;
                let index: &dyn HeadIndex = idx.as_ref().map_or(&none, |i| &*i.0);
                if let Err(e) = src.gather(index, &sel, &mut gk[h * m * d..(h + 1) * m * d], &mut gv[h * m * d..(h + 1) * m * d]) {
                    // Recorded, not attended: the forward pass ends the step (`read_failure`).
                    src.off.record_failure(&e);
                    return;
                }
            } else {
                let base = h * self.cap * d;
                for (i, &t) in sel.iter().enumerate() {
                    let src = base + t as usize * d;
                    gk[(h * m + i) * d..(h * m + i + 1) * d].copy_from_slice(&self.keys[layer][src..src + d]);
                    gv[(h * m + i) * d..(h * m + i + 1) * d].copy_from_slice(&self.values[layer][src..src + d]);
                }
            }
            *pos = sel;
            f(&KvChunk {
                first_pos: pos[0] as usize,
                positions: Some(&pos[..]),
                key_index: 0,
                len: m,
                capacity: m,
                keys: KvData { elem: KvElem::F16, bytes: bytemuck::cast_slice(&gk[..(h + 1) * m * d]) },
                values: KvData { elem: KvElem::F16, bytes: bytemuck::cast_slice(&gv[..(h + 1) * m * d]) },
                mask: None,
                ahead: None,
            });
        });
    }
}

impl SparseKv {
    /// Values `0..len` of (layer, head), f16 rows.
    fn head_values(&self, layer: usize, head: usize) -> &[f16] {
        let base = head * self.cap * self.dim;
        &self.values[layer][base..base + self.lens[layer] * self.dim]
    }
}
