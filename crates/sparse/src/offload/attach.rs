//! Moving a [`SparseKv`]'s older KV into its file, flushing new tokens after it, and the
//! reads an offloaded cache answers without its index (module doc of [`crate::offload`]).

use std::io::{self, ErrorKind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use engram_model::{KvChunk, KvData, KvElem};
use half::f16;

use super::{
    file, fingerprint, Backend, ClusterCache, FileSpec, Layout, OffloadConfig, OffloadFile, OffloadStats, Offloaded, Prefetcher, Purpose,
    Reader, Regions, Shared, SLACK,
};
use crate::method::NoIndex;
use crate::{SparseConfig, SparseKv};

fn invalid(msg: String) -> io::Error {
    io::Error::new(ErrorKind::InvalidInput, msg)
}

/// Unique file names within one process.
static FILES: AtomicUsize = AtomicUsize::new(0);

impl SparseKv {
    /// Moves the KV of every token older than the recent window (the sinks excepted) into a
    /// new file in `cfg.dir`, cluster after cluster, if the KV stored exceeds
    /// `cfg.ram_budget`; returns whether it did. Needs a built index. On any error (a missing
    /// directory, a disk too small for the offloaded KV, a failed write) nothing changes: the
    /// cache stays in RAM and answers as before, and the partial file is removed.
    pub fn offload(&mut self, cfg: OffloadConfig) -> io::Result<bool> {
        let scfg = self.cfg.ok_or_else(|| invalid("offload needs a sparse method (exact attention reads every key)".into()))?;
        if !self.is_built() {
            return Err(invalid("offload after the index is built (the end of the prefill)".into()));
        }
        if self.off.is_some() {
            return Err(invalid("this cache is already offloaded".into()));
        }
        if self.probe.is_some() {
            return Err(invalid("a probed cache reads every key in RAM: it cannot be offloaded".into()));
        }
        if cfg.flush == 0 {
            return Err(invalid("offload flush must be at least 1 token".into()));
        }
        if self.kv_bytes() <= cfg.ram_budget {
            return Ok(false);
        }
        let (layers, heads, d) = (self.layers, self.heads, self.dim);
        let sinks = scfg.sinks;
        let origin: Vec<usize> = self.lens.iter().map(|&n| n.saturating_sub(scfg.recent).max(sinks.min(n))).collect();
        let rb = d * 4;
        let rows: u64 = origin.iter().map(|&o| (o.saturating_sub(sinks) * heads) as u64).sum();
        // The dual-head layout reserves a quarter more (at least a page) per pair as slack.
        let rows = if cfg.layout == Layout::DualHead { rows + rows / 4 + (rows / 64 + 16) * 2 } else { rows };
        let (mut f, shared, reader, prefetcher) = self.open_file(&cfg, &scfg, rows)?;
        let path = f.path().to_path_buf();
        let mut slots = vec![Vec::new(); layers * heads];
        let mut regions = vec![Regions::default(); layers * heads];
        let page_rows = (4096 / rb).max(1);
        let mut order_slack = 0u64;
        let written = (|| -> io::Result<u64> {
            let mut written = 0u64;
            for layer in 0..layers {
                let o = origin[layer];
                for h in 0..heads {
                    let hi = layer * heads + h;
                    let clusters: Vec<(u32, Vec<u32>)> = self.index[hi]
                        .lock()
                        .expect("index lock")
                        .0
                        .placement(cfg.co_retrieval)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(c, m)| (c, m.into_iter().filter(|&t| (sinks..o).contains(&(t as usize))).collect::<Vec<u32>>()))
                        .filter(|(_, m)| !m.is_empty())
                        .collect();
                    let mut seen = vec![false; o];
                    clusters.iter().flat_map(|(_, m)| m).for_each(|&t| seen[t as usize] = true);
                    let loose = (sinks..o).filter(|&t| !seen[t]).map(|t| t as u32);
                    let order: Vec<u32> = match cfg.layout {
                        Layout::Append => clusters.into_iter().flat_map(|(_, m)| m).chain(loose).collect(),
                        Layout::DualHead => {
                            let (r, mut rows) = Regions::lay_out(&clusters, f.rows(), page_rows);
                            rows.extend(loose);
                            // Pad to whole pages: the next head's regions start page-aligned.
                            rows.resize(rows.len().div_ceil(page_rows) * page_rows, SLACK);
                            regions[hi] = r;
                            order_slack += rows.iter().filter(|&&t| t == SLACK).count() as u64;
                            rows
                        }
                    };
                    let base = h * self.cap * d;
                    let mut bytes = Vec::with_capacity(order.len() * rb);
                    for &t in &order {
                        if t == SLACK {
                            bytes.resize(bytes.len() + rb, 0);
                            continue;
                        }
                        let at = base + t as usize * d;
                        bytes.extend_from_slice(bytemuck::cast_slice(&self.keys[layer][at..at + d]));
                        bytes.extend_from_slice(bytemuck::cast_slice(&self.values[layer][at..at + d]));
                    }
                    let first = f.append(&bytes)?;
                    written += bytes.len() as u64;
                    let s = &mut slots[hi];
                    s.resize(o, u32::MAX);
                    for (i, &t) in order.iter().enumerate().filter(|(_, &t)| t != SLACK) {
                        s[t as usize] = u32::try_from(first + i as u64).map_err(|_| invalid("offload file past 2^32 rows".into()))?;
                    }
                }
            }
            Ok(written)
        })();
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                drop((f, reader, prefetcher));
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        // RAM: the sinks apart, the tail from `origin` on.
        let (mut sink_k, mut sink_v) = (Vec::with_capacity(layers), Vec::with_capacity(layers));
        let cap = (0..layers).map(|l| self.lens[l] - origin[l]).max().unwrap_or(0) + cfg.flush + 1;
        for layer in 0..layers {
            let (o, held, old) = (origin[layer], self.lens[layer] - origin[layer], self.cap);
            let ns = sinks.min(self.lens[layer]);
            for (buf, sink) in [(&mut self.keys[layer], &mut sink_k), (&mut self.values[layer], &mut sink_v)] {
                let mut s = vec![f16::ZERO; heads * sinks * d];
                let mut next = vec![f16::ZERO; heads * cap * d];
                for h in 0..heads {
                    s[h * sinks * d..(h * sinks + ns) * d].copy_from_slice(&buf[h * old * d..(h * old + ns) * d]);
                    next[h * cap * d..(h * cap + held) * d].copy_from_slice(&buf[(h * old + o) * d..(h * old + o + held) * d]);
                }
                sink.push(s);
                *buf = next;
            }
        }
        self.cap = cap;
        self.origin = origin;
        self.off = Some(Box::new(Offloaded {
            shared,
            staging: (0..layers * heads).map(|_| Mutex::default()).collect(),
            prefetcher,
            reads_done: (0..layers).map(|_| AtomicUsize::new(0)).collect(),
            cfg,
            file: f,
            reader,
            row_bytes: rb,
            sinks,
            sink_k,
            sink_v,
            slots: slots.into_iter().map(Arc::new).collect(),
            written,
            flush_failures: 0,
            regions,
            in_place_rows: 0,
            elsewhere_rows: 0,
            slack_rows: order_slack,
            failed: Default::default(),
            failure: Mutex::new(None),
            stream: None,
        }));
        Ok(true)
    }

    /// A new offload file for this cache in `cfg.dir` (room checked for `rows` rows and a
    /// quarter more, for the tokens flushed later), its reader and the layer-ahead loader. On
    /// error no file is left.
    pub(super) fn open_file(
        &self,
        cfg: &OffloadConfig,
        scfg: &SparseConfig,
        rows: u64,
    ) -> io::Result<(OffloadFile, Arc<Shared>, Reader, Option<Prefetcher>)> {
        let (layers, heads, d) = (self.layers, self.heads, self.dim);
        let spec = FileSpec {
            layers: layers as u32,
            heads: heads as u32,
            dim: d as u32,
            fingerprint: fingerprint(cfg.model_fingerprint, scfg, layers, heads, d, cfg.layout),
        };
        let rb = spec.row_bytes();
        let need = rows * rb as u64 + file::HEADER;
        let free =
            file::free_bytes(&cfg.dir).map_err(|e| io::Error::new(e.kind(), format!("offload directory {}: {e}", cfg.dir.display())))?;
        if free < need + need / 4 {
            return Err(io::Error::new(
                ErrorKind::StorageFull,
                format!(
                    "disk store too small: offloading needs {:.1} MiB (+25% for growth) in {}, {:.1} MiB free",
                    need as f64 / (1 << 20) as f64,
                    cfg.dir.display(),
                    free as f64 / (1 << 20) as f64
                ),
            ));
        }
        let path = live_path(cfg);
        let f = OffloadFile::create(&path, spec)?;
        match readers(cfg, &f) {
            Ok((shared, reader, prefetcher)) => Ok((f, shared, reader, prefetcher)),
            Err(e) => {
                drop(f);
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Whether the older KV is in a file.
    pub fn is_offloaded(&self) -> bool {
        self.off.is_some()
    }

    /// Why a read of the file failed, once one did (sticky; `None` in RAM or while reads
    /// succeed). A failed cache answers no more reads: the forward pass returns this as an
    /// error after the layer that hit it (`KvCache::read_failure`).
    pub fn offload_failure(&self) -> Option<String> {
        self.off.as_deref().and_then(Offloaded::failure)
    }

    /// The offload's counters (`None`: all in RAM).
    pub fn offload_stats(&self) -> Option<OffloadStats> {
        self.off.as_deref().map(Offloaded::stats)
    }

    /// Bytes of KV held in RAM: every key and value when not offloaded; else the sinks, the
    /// RAM tail (recent window and write buffer) and the cluster cache.
    pub fn ram_kv_bytes(&self) -> usize {
        let Some(off) = self.off.as_deref() else { return self.kv_bytes() };
        let row = self.dim * 4;
        let tail: usize = (0..self.layers).map(|l| self.lens[l] - self.origin[l]).sum::<usize>() * self.heads;
        (off.sinks * self.layers * self.heads + tail) * row + off.shared.cache.lock().expect("cache lock").used()
    }

    /// Bytes of the position → file row tables (RAM the offload adds besides the index).
    pub fn slot_table_bytes(&self) -> usize {
        self.off.as_deref().map_or(0, |o| o.slots.iter().map(|s| s.len() * 4).sum())
    }

    /// The offload file's path, if offloaded.
    pub fn offload_path(&self) -> Option<&std::path::Path> {
        self.off.as_deref().map(|o| o.file.path())
    }

    /// Syncs the file and drops it from the OS page cache, so the next reads hit the disk.
    pub fn evict_page_cache(&self) -> io::Result<()> {
        self.off.as_deref().map_or(Ok(()), |o| o.file.evict_page_cache())
    }

    /// After a token was written to `layer`: once the RAM tail holds the recent window plus
    /// `flush` tokens, its oldest `flush` tokens go to the file (one block per KV head). A
    /// failed write (disk full) keeps them in RAM, warns once and stops flushing.
    pub(crate) fn flush_if_due(&mut self, layer: usize) {
        let recent = self.cfg.map_or(0, |c| c.recent);
        let (heads, d, cap) = (self.heads, self.dim, self.cap);
        let Some(off) = self.off.as_deref_mut() else { return };
        let (o, held, n) = (self.origin[layer], self.lens[layer] - self.origin[layer], off.cfg.flush);
        if off.flush_failures > 0 || held < recent + n {
            return;
        }
        if off.cfg.layout == Layout::DualHead {
            return self.flush_regions(layer);
        }
        let mut firsts = Vec::with_capacity(heads);
        for h in 0..heads {
            let mut bytes = Vec::with_capacity(n * off.row_bytes);
            for t in 0..n {
                let at = (h * cap + t) * d;
                bytes.extend_from_slice(bytemuck::cast_slice(&self.keys[layer][at..at + d]));
                bytes.extend_from_slice(bytemuck::cast_slice(&self.values[layer][at..at + d]));
            }
            match off.file.append(&bytes) {
                Ok(first) => {
                    off.written += bytes.len() as u64;
                    firsts.push(first);
                }
                Err(e) => {
                    eprintln!("warning: DynaKV offload write failed ({e}); new tokens stay in RAM from now on");
                    off.flush_failures += 1;
                    return;
                }
            }
        }
        off.elsewhere_rows += (n * heads) as u64;
        for (h, first) in firsts.into_iter().enumerate() {
            let s = Arc::make_mut(&mut off.slots[layer * heads + h]);
            s.resize(o + n, u32::MAX);
            for t in 0..n {
                s[o + t] = (first + t as u64) as u32;
            }
        }
        self.drop_flushed(layer, n);
    }

    /// Drops the oldest `n` tokens of `layer`'s RAM tail (they are in the file now).
    pub(crate) fn drop_flushed(&mut self, layer: usize, n: usize) {
        let (heads, d, cap) = (self.heads, self.dim, self.cap);
        let held = self.lens[layer] - self.origin[layer];
        for h in 0..heads {
            for buf in [&mut self.keys[layer], &mut self.values[layer]] {
                buf.copy_within((h * cap + n) * d..(h * cap + held) * d, h * cap * d);
            }
        }
        self.origin[layer] += n;
    }

    /// The dual-head flush (`regions.rs`): per KV head, the flushed tokens grouped by cluster
    /// are written into their cluster's slack (or a new region at the end); the regions and
    /// the position → row tables change only once every write succeeded.
    fn flush_regions(&mut self, layer: usize) {
        let (heads, d, cap) = (self.heads, self.dim, self.cap);
        let Some(off) = self.off.as_deref_mut() else { return };
        let (o, n, rb) = (self.origin[layer], off.cfg.flush, off.row_bytes);
        let row = |h: usize, t: u32, out: &mut Vec<u8>| {
            if t == SLACK {
                return out.resize(out.len() + rb, 0);
            }
            let at = (h * cap + t as usize - o) * d;
            out.extend_from_slice(bytemuck::cast_slice(&self.keys[layer][at..at + d]));
            out.extend_from_slice(bytemuck::cast_slice(&self.values[layer][at..at + d]));
        };
        let mut done = Vec::with_capacity(heads);
        let (mut in_place, mut slack_used, mut slack_new, mut written) = (0u64, 0u64, 0u64, 0u64);
        for h in 0..heads {
            let hi = layer * heads + h;
            let mut pairs = Vec::new();
            self.index[hi].lock().expect("index lock").0.units_since(o as u32, &mut pairs);
            pairs.retain(|&(_, t)| (t as usize) < o + n);
            pairs.sort_unstable();
            let mut grouped = vec![false; n];
            let mut groups: Vec<(u32, Vec<u32>)> = Vec::new();
            for (c, t) in pairs {
                grouped[t as usize - o] = true;
                match groups.last_mut() {
                    Some((g, ts)) if *g == c => ts.push(t),
                    _ => groups.push((c, vec![t])),
                }
            }
            let loose: Vec<u32> = (0..n).filter(|&i| !grouped[i]).map(|i| (o + i) as u32).collect();
            let mut regions = off.regions[hi].clone();
            let plan = regions.place(groups, loose, off.file.rows());
            let result = (|| -> io::Result<()> {
                let mut bytes = Vec::with_capacity(plan.tail.len() * rb);
                plan.tail.iter().for_each(|&t| row(h, t, &mut bytes));
                let first = off.file.append(&bytes)?;
                written += bytes.len() as u64;
                for (at, ts) in &plan.in_place {
                    let mut bytes = Vec::with_capacity(ts.len() * rb);
                    ts.iter().for_each(|&t| row(h, t, &mut bytes));
                    off.file.write_rows(*at, &bytes)?;
                    written += bytes.len() as u64;
                }
                debug_assert!(plan.tail.is_empty() || first + plan.tail.len() as u64 == off.file.rows());
                Ok(())
            })();
            if let Err(e) = result {
                eprintln!("warning: DynaKV offload write failed ({e}); new tokens stay in RAM from now on");
                off.flush_failures += 1;
                return;
            }
            let tail_first = off.file.rows() - plan.tail.len() as u64;
            let placed: u64 = plan.in_place.iter().map(|(_, ts)| ts.len() as u64).sum();
            in_place += placed;
            slack_used += placed;
            slack_new += plan.tail.iter().filter(|&&t| t == SLACK).count() as u64;
            done.push((hi, regions, plan, tail_first));
        }
        for (hi, regions, plan, tail_first) in done {
            let s = Arc::make_mut(&mut off.slots[hi]);
            s.resize(o + n, u32::MAX);
            for (i, &t) in plan.tail.iter().enumerate().filter(|(_, &t)| t != SLACK) {
                s[t as usize] = (tail_first + i as u64) as u32;
            }
            for (at, ts) in plan.in_place {
                for (i, t) in ts.into_iter().enumerate() {
                    s[t as usize] = (at + i as u64) as u32;
                }
            }
            off.regions[hi] = regions;
        }
        off.written += written;
        off.in_place_rows += in_place;
        off.elsewhere_rows += (n * heads) as u64 - in_place;
        off.slack_rows = off.slack_rows + slack_new - slack_used;
        self.drop_flushed(layer, n);
    }

    /// Every head's stored keys of `layer` as one chunk (offloaded cache).
    pub(crate) fn gathered_exact(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let (n, d) = (self.lens[layer], self.dim);
        let (mut k, mut v) = (vec![f16::ZERO; self.heads * n * d], vec![f16::ZERO; self.heads * n * d]);
        let all: Vec<u32> = (0..n as u32).collect();
        for h in 0..self.heads {
            let src = self.source(layer, h, Purpose::Retrieval, n as u64).expect("offloaded");
            if let Err(e) = src.gather(&NoIndex, &all, &mut k[h * n * d..(h + 1) * n * d], &mut v[h * n * d..(h + 1) * n * d]) {
                // Recorded: the forward pass ends the step with it (`read_failure`).
                return src.off.record_failure(&e);
            }
        }
        f(&KvChunk {
            first_pos: 0,
            positions: None,
            key_index: 0,
            len: n,
            capacity: n,
            keys: KvData { elem: KvElem::F16, bytes: bytemuck::cast_slice(&k) },
            values: KvData { elem: KvElem::F16, bytes: bytemuck::cast_slice(&v) },
            mask: None,
            ahead: None,
        });
    }
}

/// A new name for a sequence's live file in `cfg.dir` (unique within the process).
pub(crate) fn live_path(cfg: &OffloadConfig) -> std::path::PathBuf {
    cfg.dir.join(format!("dynakv-{}-{}.kv", std::process::id(), FILES.fetch_add(1, Ordering::Relaxed)))
}

/// The cluster cache, the reader and the layer-ahead loader over an open file `f`.
pub(crate) fn readers(cfg: &OffloadConfig, f: &OffloadFile) -> io::Result<(Arc<Shared>, Reader, Option<Prefetcher>)> {
    let rb = f.spec().row_bytes();
    let shared = Arc::new(Shared::new(ClusterCache::new(cfg.cache_bytes, rb, cfg.policy)));
    let reader = Reader::new(f.reader()?, rb, cfg.backend)?;
    // The loader reads on its own thread: pread, or its own ring where the step's
    // reads go through io_uring (a reader thread would only add a hop).
    let prefetcher = if cfg.prefetch && cfg.cache_bytes > 0 {
        let own = if reader.backend() == Backend::Uring { Backend::Uring } else { Backend::Inline };
        Some(Prefetcher::new(shared.clone(), Reader::new(f.reader()?, rb, own)?, rb, cfg.gap)?)
    } else {
        None
    };
    Ok((shared, reader, prefetcher))
}
