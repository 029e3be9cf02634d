//! Bounded prefill: a cache offloaded before its prompt is written
//! ([`SparseKv::offload_streaming`]), so a long prompt's KV goes to the file chunk by chunk and
//! the KV held in RAM stays within the sequence's budget whatever the prompt's length.
//!
//! The index clusters the prefill segment by segment ([`SEGMENT`] tokens, as
//! [`crate::HeadIndex::build`] does), so it is built while the prompt is written. Each (layer,
//! KV head) gets a region of [`SEGMENT`] file rows per segment; a token leaving the RAM budget
//! is written to its row in position order. Once a segment is complete its clusters are built
//! (its keys gathered from the RAM tail and its region), and once all its tokens are in the file
//! the region is rewritten in place cluster after cluster (in co-retrieval order of the
//! calibration queries seen so far, `crate::placement`), so one cluster is one contiguous read,
//! as after [`SparseKv::offload`]. The prefill's exact attention reads the history back one
//! segment at a time, into a mapping whose pages go back to the kernel once the segment is
//! attended (`scratch.rs`), in requests of [`FULL_READ_ROWS`] rows. [`SparseKv::build_index`] ends the prefill: the last
//! segment is clustered, the threshold and the calibration set, every token older than the
//! recent window written and placed; a prompt that fits the budget whole stays in RAM (the file
//! is dropped).
//!
//! ```text
//!  positions:  | sinks | segment 0 ...... | segment 1 ...... | segment 2 .. | RAM tail (budget) |
//!  file:       header | L0 seg 0: head 0 rows, head 1 rows, … | L1 seg 0 … | L0 seg 1 … | (decode flushes)
//! ```
//!
//! Invariant: the index equals the one built over the same keys in RAM (same segments, same f16
//! bits, same calibration queries), and every read yields the bits written, so the prefill's and
//! the decode's logits equal those of prefilling in RAM and offloading after; only the order of
//! clusters in the file may differ (placement is per segment).

use std::io::{self, ErrorKind};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use engram_model::{KvChunk, KvData, KvElem, KvRead};
use half::f16;

use super::scratch::Scratch;
use super::{Layout, OffloadConfig, Offloaded, Purpose};
use crate::keys::HeadKeys;
use crate::kmeans::SEGMENT;
use crate::shared::SharedIndex;
use crate::SparseKv;

/// Rows of one request of a full read ([`SparseKv::gather_block`]): 256 rows of a 64-dim head
/// are 64 KiB.
pub(crate) const FULL_READ_ROWS: usize = 256;

/// The prefill's progress while the cache streams to its file (module doc).
pub(crate) struct Stream {
    /// Tokens one layer keeps in RAM between writes (its share of the budget, at least the
    /// recent window; the sinks apart). A write adds its tokens before they go to the file.
    pub budget_tokens: usize,
    /// Per layer: segments clustered (every head), and segments laid out in cluster order.
    pub built: Vec<usize>,
    pub placed: Vec<usize>,
    /// Per layer: each segment's first file row (`heads × SEGMENT` rows, head `h`'s from
    /// `h × SEGMENT`).
    pub regions: Vec<Vec<u64>>,
    /// Per `layer * heads + head`: the index units each segment's clustering made.
    pub units: Vec<Vec<Range<u32>>>,
    /// Whether any token went to the file.
    pub flushed: bool,
}

impl SparseKv {
    /// Bounded prefill (module doc): from now on, the KV past `cfg.ram_budget` goes to a new
    /// file in `cfg.dir` while the prompt is written, its index built segment by segment;
    /// [`SparseKv::build_index`] ends the prefill. Call it before the prompt (tokens already
    /// stored are taken as they are). Errors (nothing changes): no sparse method, an index
    /// already built, a cache already offloaded or probed, `flush == 0`, the dual-head layout
    /// (the regions of a streamed prefill are the append layout's), a directory that cannot
    /// hold a file.
    pub fn offload_streaming(&mut self, cfg: OffloadConfig) -> io::Result<()> {
        let scfg = self.cfg.ok_or_else(|| invalid("offload needs a sparse method (exact attention reads every key)"))?;
        if self.is_built() {
            return Err(invalid("a bounded prefill starts before the index is built (before the prompt)"));
        }
        if self.off.is_some() {
            return Err(invalid("this cache is already offloaded"));
        }
        if self.probe.is_some() {
            return Err(invalid("a probed cache reads every key in RAM: it cannot be offloaded"));
        }
        if cfg.flush == 0 {
            return Err(invalid("offload flush must be at least 1 token"));
        }
        if cfg.layout != Layout::Append {
            return Err(invalid("a bounded prefill writes the append layout (dual-head regions are laid out after the prefill)"));
        }
        let (layers, heads, d) = (self.layers, self.heads, self.dim);
        let (file, shared, reader, prefetcher) = self.open_file(&cfg, &scfg, 0)?;
        // The recent window stays in RAM whatever the budget (as after `offload`).
        let budget_tokens = (cfg.ram_budget / (layers * heads * d * 4).max(1)).max(scfg.recent);
        self.index = (0..layers * heads).map(|_| Mutex::new((SharedIndex::new(scfg.method.index(d)), Vec::new()))).collect();
        let sinks = scfg.sinks;
        self.off = Some(Box::new(Offloaded {
            shared,
            staging: (0..layers * heads).map(|_| Mutex::default()).collect(),
            prefetcher,
            reads_done: (0..layers).map(|_| AtomicUsize::new(0)).collect(),
            file,
            reader,
            row_bytes: d * 4,
            sinks,
            sink_k: vec![vec![f16::ZERO; heads * sinks * d]; layers],
            sink_v: vec![vec![f16::ZERO; heads * sinks * d]; layers],
            slots: (0..layers * heads).map(|_| Arc::default()).collect(),
            written: 0,
            flush_failures: 0,
            regions: vec![Default::default(); layers * heads],
            in_place_rows: 0,
            elsewhere_rows: 0,
            slack_rows: 0,
            failed: Default::default(),
            failure: Mutex::new(None),
            stream: Some(Stream {
                budget_tokens,
                built: vec![0; layers],
                placed: vec![0; layers],
                regions: vec![Vec::new(); layers],
                units: vec![Vec::new(); layers * heads],
                flushed: false,
            }),
            cfg,
        }));
        for layer in 0..layers {
            self.stream_step(layer);
        }
        Ok(())
    }

    /// Whether a bounded prefill is under way (offloaded, index not built yet).
    pub(crate) fn streaming(&self) -> bool {
        self.off.as_deref().is_some_and(|o| o.stream.is_some())
    }

    /// After tokens were written to `layer` during a bounded prefill: keeps the sinks apart,
    /// clusters the segments now complete, writes what exceeds the budget to the file and
    /// lays out the segments now wholly written.
    pub(crate) fn stream_step(&mut self, layer: usize) {
        let (heads, d, cap, n, o) = (self.heads, self.dim, self.cap, self.lens[layer], self.origin[layer]);
        let Some(off) = self.off.as_deref_mut() else { return };
        if o == 0 {
            // The sinks are still in the RAM tail: copy them where the offloaded reads look.
            let ns = off.sinks.min(n);
            for h in 0..heads {
                for (buf, sink) in [(&self.keys[layer], &mut off.sink_k[layer]), (&self.values[layer], &mut off.sink_v[layer])] {
                    sink[h * off.sinks * d..(h * off.sinks + ns) * d].copy_from_slice(&buf[h * cap * d..(h * cap + ns) * d]);
                }
            }
        }
        let st = off.stream.as_ref().expect("streaming");
        let (built, budget) = (st.built[layer], st.budget_tokens);
        for s in built..n / SEGMENT {
            self.build_segment(layer, s * SEGMENT..(s + 1) * SEGMENT);
        }
        let held = self.lens[layer] - self.origin[layer];
        if held > budget {
            self.stream_flush(layer, self.lens[layer] - budget);
        }
        self.place_written(layer, false);
    }

    /// Clusters the prefill tokens `range` of every head of `layer` (one segment, or the
    /// prefill's last part), in parallel over heads; their keys come from RAM and the file.
    fn build_segment(&mut self, layer: usize, range: Range<usize>) {
        let (heads, d) = (self.heads, self.dim);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(heads).max(1);
        let next = AtomicUsize::new(0);
        let units: Vec<Mutex<Range<u32>>> = (0..heads).map(|_| Mutex::new(0..0)).collect();
        let this = &*self;
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let h = next.fetch_add(1, Ordering::Relaxed);
                    if h >= heads {
                        break;
                    }
                    let mut k = vec![f16::ZERO; range.len() * d];
                    if let Err(e) = this.gather_block(layer, h, range.clone(), &mut k, None) {
                        // Recorded: the forward pass ends the step with it (`read_failure`).
                        this.off.as_deref().expect("offloaded").record_failure(&e);
                    }
                    let mut idx = this.index[layer * heads + h].lock().expect("index lock");
                    let before = idx.0.stats().units as u32;
                    idx.0.make_mut().build_part(HeadKeys::window(&k, range.start, d), range.clone());
                    *units[h].lock().expect("units lock") = before..idx.0.stats().units as u32;
                });
            }
        });
        let st = self.off.as_deref_mut().and_then(|o| o.stream.as_mut()).expect("streaming");
        for (h, u) in units.into_iter().enumerate() {
            st.units[layer * heads + h].push(u.into_inner().expect("units lock"));
        }
        st.built[layer] += 1;
    }

    /// Writes positions `origin..upto` of `layer` (the sinks apart) to their segments'
    /// regions, position order, and drops them from RAM. A failed write keeps them in RAM,
    /// warns once and stops writing (the budget no longer holds; every answer stays exact).
    fn stream_flush(&mut self, layer: usize, upto: usize) {
        let (heads, d, cap, o) = (self.heads, self.dim, self.cap, self.origin[layer]);
        let Some(off) = self.off.as_deref_mut() else { return };
        if off.flush_failures > 0 || upto <= o {
            return;
        }
        let Offloaded { stream, file, slots, written, row_bytes, sinks, flush_failures, .. } = off;
        let st = stream.as_mut().expect("streaming");
        let rb = *row_bytes;
        let mut t = o.max((*sinks).min(upto));
        let result = (|| -> io::Result<()> {
            while t < upto {
                let s = t / SEGMENT;
                let end = ((s + 1) * SEGMENT).min(upto);
                while st.regions[layer].len() <= s {
                    let first = file.reserve((heads * SEGMENT) as u64)?;
                    st.regions[layer].push(first);
                }
                let region = st.regions[layer][s];
                for h in 0..heads {
                    let mut bytes = Vec::with_capacity((end - t) * rb);
                    for p in t..end {
                        let at = (h * cap + p - o) * d;
                        bytes.extend_from_slice(bytemuck::cast_slice(&self.keys[layer][at..at + d]));
                        bytes.extend_from_slice(bytemuck::cast_slice(&self.values[layer][at..at + d]));
                    }
                    let first = region + (h * SEGMENT + t - s * SEGMENT) as u64;
                    file.write_rows(first, &bytes)?;
                    *written += bytes.len() as u64;
                    let sl = Arc::make_mut(&mut slots[layer * heads + h]);
                    sl.resize(end, u32::MAX);
                    for (i, slot) in sl[t..end].iter_mut().enumerate() {
                        *slot = u32::try_from(first + i as u64).map_err(|_| invalid("offload file past 2^32 rows"))?;
                    }
                }
                t = end;
            }
            Ok(())
        })();
        if let Err(e) = result {
            eprintln!("warning: DynaKV offload write failed ({e}); the prompt's tokens stay in RAM from now on");
            *flush_failures += 1;
            return;
        }
        st.flushed = true;
        self.drop_flushed(layer, upto - o);
    }

    /// Lays out in cluster order the segments of `layer` whose tokens are all in the file and
    /// whose clusters are built; with `last`, also the segment holding the file's last tokens
    /// (the end of the prefill: nothing more is written to it). A failed read or write fails
    /// the cache (recorded: the next step ends with it).
    fn place_written(&mut self, layer: usize, last: bool) {
        loop {
            let o = self.origin[layer];
            let st = self.off.as_deref().and_then(|o| o.stream.as_ref()).expect("streaming");
            let s = st.placed[layer];
            let whole = (s + 1) * SEGMENT <= o;
            if s >= st.built[layer] || !(whole || (last && s * SEGMENT < o)) {
                return;
            }
            if let Err(e) = self.place_segment(layer, s) {
                self.off.as_deref().expect("offloaded").record_failure(&e);
                return;
            }
            self.off.as_deref_mut().and_then(|o| o.stream.as_mut()).expect("streaming").placed[layer] += 1;
        }
    }

    /// Rewrites segment `s` of `layer` (its tokens in the file, still in position order)
    /// cluster after cluster, and points the position → row tables at the new rows.
    fn place_segment(&mut self, layer: usize, s: usize) -> io::Result<()> {
        let scfg = self.cfg.expect("a sparse cache");
        let (heads, n, o) = (self.heads, self.lens[layer], self.origin[layer]);
        let off = self.off.as_deref_mut().expect("offloaded");
        let st = off.stream.as_ref().expect("streaming");
        let (lo, hi) = ((s * SEGMENT).max(off.sinks), ((s + 1) * SEGMENT).min(o));
        if lo >= hi {
            return Ok(());
        }
        let rb = off.row_bytes;
        for h in 0..heads {
            let hx = layer * heads + h;
            let order = {
                let mut idx = self.index[hx].lock().expect("index lock");
                if off.cfg.co_retrieval {
                    self.calib[hx].lock().expect("calib lock").apply(idx.0.make_mut(), n, &scfg);
                }
                let Some(units) = idx.0.placement_of(off.cfg.co_retrieval, st.units[hx][s].clone()) else { continue };
                let mut seen = vec![false; hi - lo];
                let mut order = Vec::with_capacity(hi - lo);
                for t in units.into_iter().flat_map(|(_, m)| m).map(|t| t as usize).filter(|t| (lo..hi).contains(t)) {
                    seen[t - lo] = true;
                    order.push(t);
                }
                order.extend((lo..hi).filter(|&t| !seen[t - lo]));
                order
            };
            let first = st.regions[layer][s] + (h * SEGMENT + lo - s * SEGMENT) as u64;
            let mut old = vec![0u8; (hi - lo) * rb];
            off.file.read_rows(first, &mut old)?;
            let mut new = Vec::with_capacity(old.len());
            for &t in &order {
                new.extend_from_slice(&old[(t - lo) * rb..(t - lo + 1) * rb]);
            }
            off.file.write_rows(first, &new)?;
            off.written += new.len() as u64;
            let slots = Arc::make_mut(&mut off.slots[hx]);
            for (i, &t) in order.iter().enumerate() {
                slots[t] = (first + i as u64) as u32;
            }
        }
        Ok(())
    }

    /// The end of a bounded prefill ([`SparseKv::build_index`] on a streaming cache): the last
    /// segment clustered, every index finished and calibrated, every token older than the
    /// recent window (the sinks apart) written and laid out, the RAM tail shrunk to the recent
    /// window and a flush; or, when the whole prompt fit the budget and nothing was written,
    /// the file dropped and the cache in RAM.
    pub(crate) fn finish_stream(&mut self) {
        let scfg = self.cfg.expect("a sparse cache");
        for layer in 0..self.layers {
            let built = self.off.as_deref().and_then(|o| o.stream.as_ref()).expect("streaming").built[layer];
            if built * SEGMENT < self.lens[layer] {
                self.build_segment(layer, built * SEGMENT..self.lens[layer]);
            }
        }
        for (i, idx) in self.index.iter().enumerate() {
            let mut idx = idx.lock().expect("index lock");
            let head = idx.0.make_mut();
            head.finish_build();
            let n = self.lens[i / self.heads];
            self.calib[i].lock().expect("calib lock").apply(head, n, &scfg);
            head.drain_touched(&mut Vec::new());
        }
        self.built = true;
        let off = self.off.as_deref().expect("offloaded");
        if !off.stream.as_ref().expect("streaming").flushed && self.kv_bytes() <= off.cfg.ram_budget {
            self.off = None; // the prompt fit: no file, as `offload` leaves such a cache
            return;
        }
        for layer in 0..self.layers {
            let n = self.lens[layer];
            self.stream_flush(layer, n.saturating_sub(scfg.recent).max(scfg.sinks.min(n)));
            self.place_written(layer, true);
        }
        let flush = self.off.as_deref().expect("offloaded").cfg.flush;
        let cap = (0..self.layers).map(|l| self.lens[l] - self.origin[l]).max().unwrap_or(0) + flush + 1;
        self.resize_slots(cap);
        self.off.as_deref_mut().expect("offloaded").stream = None;
    }

    /// Fills `gk` (and `gv`) with the keys (and values) of positions `range` of (layer, KV
    /// head `h`) of an offloaded cache: the sinks and the RAM tail copied, the rest read from
    /// the file in one coalesced request (counted as a full read).
    pub(crate) fn gather_block(
        &self,
        layer: usize,
        h: usize,
        range: Range<usize>,
        gk: &mut [f16],
        mut gv: Option<&mut [f16]>,
    ) -> io::Result<()> {
        let off = self.off.as_deref().expect("offloaded");
        let (d, hx, o, base) = (self.dim, layer * self.heads + h, self.origin[layer], h * self.cap * self.dim);
        let mut file: Vec<(u64, u32)> = Vec::new();
        for (i, t) in range.enumerate() {
            let (k, v) = if t < off.sinks {
                let at = (h * off.sinks + t) * d;
                (&off.sink_k[layer][at..at + d], &off.sink_v[layer][at..at + d])
            } else if t >= o {
                let at = base + (t - o) * d;
                (&self.keys[layer][at..at + d], &self.values[layer][at..at + d])
            } else {
                file.push((off.slots[hx][t] as u64, i as u32));
                continue;
            };
            gk[i * d..(i + 1) * d].copy_from_slice(k);
            if let Some(gv) = gv.as_deref_mut() {
                gv[i * d..(i + 1) * d].copy_from_slice(v);
            }
        }
        if file.is_empty() {
            return Ok(());
        }
        file.sort_unstable();
        let rb = off.row_bytes;
        // A few hundred rows per request: the reply and its picked rows are small buffers the
        // allocator reuses, not a segment's region twice over, freed into its heap.
        for piece in file.chunks(FULL_READ_ROWS) {
            let rows: Vec<u64> = piece.iter().map(|r| r.0).collect();
            let bytes = off.read(&rows, Purpose::Full)?;
            for (j, &(_, i)) in piece.iter().enumerate() {
                let (row, i) = (&bytes[j * rb..(j + 1) * rb], i as usize);
                bytemuck::cast_slice_mut::<f16, u8>(&mut gk[i * d..(i + 1) * d]).copy_from_slice(&row[..2 * d]);
                if let Some(gv) = gv.as_deref_mut() {
                    bytemuck::cast_slice_mut::<f16, u8>(&mut gv[i * d..(i + 1) * d]).copy_from_slice(&row[2 * d..]);
                }
            }
        }
        Ok(())
    }

    /// A read that is not a retrieval (several query tokens, or exact reads asked for) on an
    /// offloaded cache: every stored key of the head, one chunk per [`SEGMENT`] of positions
    /// (one segment's rows read at a time, [`FULL_READ_ROWS`] per request), so the RAM it takes
    /// does not grow with the history: the chunks are gathered into a [`Scratch`] mapping whose
    /// pages are handed back after each chunk is attended, and freed at the end.
    /// Chunks start at multiples of the segment, so attention runs the same tiles as over one
    /// chunk in RAM (bitwise equal).
    pub(crate) fn gathered_all(&self, read: &KvRead<'_>, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let (n, h, d) = (self.lens[read.layer], read.kv_head, self.dim);
        let off = self.off.as_deref().expect("offloaded");
        // K rows then V rows, each `[kv_head][m]` for the widest chunk (head `h`'s at `h × m`).
        let span = (h + 1) * SEGMENT.min(n) * d;
        let mut scratch = match Scratch::zeroed(2 * span) {
            Ok(s) => s,
            Err(e) => return off.record_failure(&e),
        };
        let mut a = 0;
        while a < n {
            let b = ((a / SEGMENT + 1) * SEGMENT).min(n);
            let m = b - a;
            let (gk, gv) = scratch.as_mut_slice().split_at_mut(span);
            let (k, v) = (&mut gk[h * m * d..(h + 1) * m * d], &mut gv[h * m * d..(h + 1) * m * d]);
            if let Err(e) = self.gather_block(read.layer, h, a..b, k, Some(v)) {
                return off.record_failure(&e);
            }
            f(&KvChunk {
                first_pos: a,
                positions: None,
                key_index: a,
                len: m,
                capacity: m,
                keys: KvData { elem: KvElem::F16, bytes: bytemuck::cast_slice(&gk[..(h + 1) * m * d]) },
                values: KvData { elem: KvElem::F16, bytes: bytemuck::cast_slice(&gv[..(h + 1) * m * d]) },
                mask: None,
                ahead: None,
            });
            scratch.release(h * m * d..(h + 1) * m * d);
            scratch.release(span + h * m * d..span + (h + 1) * m * d);
            a = b;
        }
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(ErrorKind::InvalidInput, msg.to_string())
}
