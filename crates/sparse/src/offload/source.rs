//! One offloaded (layer, KV head) as its index and its reads see it: keys by position from
//! the sinks, the RAM tail, the rows staged this step, the cluster cache or the file.
//!
//! Invariant: every position yields the bytes written for it, or the read fails and the
//! failure is returned or recorded on the cache (never a panic, never other bytes); rows
//! staged for a step are dropped after it ([`HeadSource::finish`]), so staging never outlives
//! one read or append.

use std::collections::HashMap;
use std::io;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::Offloaded;
use crate::keys::RowSource;
use crate::method::HeadIndex;

/// Why rows are read (what they are counted as).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A decode step's retrieval (and the delayed splits of what it fetched).
    Retrieval,
    /// A split of a cluster the step did not fetch (eager, or forced by `B_max`).
    Split,
    /// Every key of a head (not a retrieval: `OffloadStats::full_bytes`).
    Full,
}

/// Rows read during one step of one head: file row → offset in `bytes`.
#[derive(Default)]
pub(crate) struct Staging {
    at: HashMap<u64, usize>,
    bytes: Vec<u8>,
}

impl Staging {
    fn put(&mut self, rows: &[u64], bytes: &[u8], rb: usize) {
        for (i, &r) in rows.iter().enumerate() {
            let at = self.bytes.len();
            self.bytes.extend_from_slice(&bytes[i * rb..(i + 1) * rb]);
            self.at.insert(r, at);
        }
    }

    fn get(&self, row: u64, rb: usize) -> Option<&[u8]> {
        self.at.get(&row).map(|&a| &self.bytes[a..a + rb])
    }

    /// Empties the staging for the next step; storage past [`STAGING_KEEP`] bytes is released,
    /// so the 128-odd heads' stagings do not each keep their largest step's rows (a retrieval
    /// budget's worth) in RAM between steps, uncharged to the pool.
    fn clear(&mut self) {
        if self.bytes.capacity() > STAGING_KEEP {
            *self = Staging::default();
        } else {
            self.at.clear();
            self.bytes.clear();
        }
    }
}

/// Bytes of rows one head's [`Staging`] keeps allocated between steps (more is freed).
pub(crate) const STAGING_KEEP: usize = 64 << 10;

/// The view of one offloaded head for one step (module doc).
pub(crate) struct HeadSource<'a> {
    pub off: &'a Offloaded,
    pub layer: usize,
    pub head: usize,
    pub heads: usize,
    pub dim: usize,
    /// Positions `origin..` are in the RAM tail.
    pub origin: usize,
    pub tail_k: &'a [f16],
    pub tail_v: &'a [f16],
    pub purpose: Purpose,
    pub now: u64,
}

impl HeadSource<'_> {
    fn hi(&self) -> usize {
        self.layer * self.heads + self.head
    }

    fn file_row(&self, t: usize) -> Option<u64> {
        (t >= self.off.sinks && t < self.origin).then(|| self.off.slots[self.hi()][t] as u64)
    }

    /// Key (`value = false`) or value of position `t`, as f16 bits, into `out`.
    fn copy(&self, t: usize, value: bool, staging: &Staging, out: &mut [f16]) {
        let d = self.dim;
        if t < self.off.sinks {
            let src = if value { &self.off.sink_v[self.layer] } else { &self.off.sink_k[self.layer] };
            let at = (self.head * self.off.sinks + t) * d;
            out.copy_from_slice(&src[at..at + d]);
        } else if t >= self.origin {
            let src = if value { self.tail_v } else { self.tail_k };
            out.copy_from_slice(&src[(t - self.origin) * d..(t - self.origin + 1) * d]);
        } else {
            let row = staging.get(self.off.slots[self.hi()][t] as u64, self.off.row_bytes).expect("row staged before copy");
            let half = if value { &row[2 * d..] } else { &row[..2 * d] };
            bytemuck::cast_slice_mut::<f16, u8>(out).copy_from_slice(half);
        }
    }

    /// Stages file rows `rows` (sorted) for cluster `unit` if this step's staging or the
    /// cache holds them all; else returns them (a miss, to be read from the file).
    fn stage_held(&self, unit: u32, rows: Vec<u64>, staging: &mut Staging) -> Option<Vec<u64>> {
        let rb = self.off.row_bytes;
        if rows.is_empty() {
            return None;
        }
        let key = (self.layer as u32, self.head as u32, unit);
        if rows.iter().all(|&r| staging.at.contains_key(&r)) {
            // Staged this step already (the read of the cluster it was split from): cached
            // under its own key too, or the next step would read the new half again.
            let mut cache = self.off.shared.cache.lock().expect("cache lock");
            if !cache.holds(key, &rows) {
                let bytes: Vec<u8> = rows.iter().flat_map(|&r| staging.get(r, rb).expect("staged")).copied().collect();
                cache.insert(key, rows, bytes, self.now);
            }
            return None;
        }
        let mut buf = Vec::with_capacity(rows.len() * rb);
        // A cluster the layer-ahead loader is reading lands in the cache: wait, not re-read.
        self.off.shared.wait_for(key);
        if self.off.shared.cache.lock().expect("cache lock").get(key, &rows, self.now, &mut buf) {
            staging.put(&rows, &buf, rb);
            return None;
        }
        Some(rows)
    }

    /// Reads the missed clusters `misses` (unit, sorted rows) from the file in **one**
    /// request — their rows merged and sorted, so clusters adjacent in the file (co-retrieval
    /// placement) become one contiguous read — stages them and caches each under its key.
    fn read_units(&self, misses: Vec<(u32, Vec<u64>)>, staging: &mut Staging) -> io::Result<()> {
        if misses.is_empty() {
            return Ok(());
        }
        let rb = self.off.row_bytes;
        let mut all: Vec<u64> = misses.iter().flat_map(|(_, r)| r.iter().copied()).collect();
        all.sort_unstable();
        all.dedup();
        let bytes = self.off.read(&all, self.purpose)?;
        staging.put(&all, &bytes, rb);
        let mut cache = self.off.shared.cache.lock().expect("cache lock");
        for (unit, rows) in misses {
            let bytes: Vec<u8> = rows.iter().flat_map(|&r| staging.get(r, rb).expect("staged")).copied().collect();
            cache.insert((self.layer as u32, self.head as u32, unit), rows, bytes, self.now);
        }
        Ok(())
    }

    /// Stages file rows `rows` (sorted) for cluster `unit`: from the cache if it holds them
    /// all, else from the file (then cached).
    fn fetch_unit(&self, unit: u32, rows: Vec<u64>, staging: &mut Staging) -> io::Result<()> {
        match self.stage_held(unit, rows, staging) {
            Some(rows) => self.read_units(vec![(unit, rows)], staging),
            None => Ok(()),
        }
    }

    fn unit_rows(&self, tokens: &[u32]) -> Vec<u64> {
        let mut rows: Vec<u64> = tokens.iter().filter_map(|&t| self.file_row(t as usize)).collect();
        rows.sort_unstable();
        rows
    }

    /// Fills `gk`/`gv` (`sel.len() × dim` each) with the keys and values of `sel`: the
    /// clusters `index` fetched come whole through the cache or the file (all the step's
    /// missed clusters in one coalesced request), any other file row
    /// is read alone (coalesced); then the step's staging is dropped. A failed read is
    /// returned (and `gk`/`gv` are not filled).
    pub fn gather(&self, index: &dyn HeadIndex, sel: &[u32], gk: &mut [f16], gv: &mut [f16]) -> io::Result<()> {
        let d = self.dim;
        let mut staging = self.off.staging[self.hi()].lock().expect("staging lock");
        let mut units = Vec::new();
        index.for_each_fetched(&mut |c, members| units.push((c, self.unit_rows(members))));
        let read = (|| {
            let misses: Vec<(u32, Vec<u64>)> =
                units.into_iter().filter_map(|(c, rows)| Some((c, self.stage_held(c, rows, &mut staging)?))).collect();
            self.read_units(misses, &mut staging)?;
            let mut loose: Vec<u64> =
                sel.iter().filter_map(|&t| self.file_row(t as usize)).filter(|r| !staging.at.contains_key(r)).collect();
            loose.sort_unstable();
            if !loose.is_empty() {
                let bytes = self.off.read(&loose, self.purpose)?;
                staging.put(&loose, &bytes, self.off.row_bytes);
            }
            Ok(())
        })();
        if read.is_ok() {
            for (i, &t) in sel.iter().enumerate() {
                self.copy(t as usize, false, &staging, &mut gk[i * d..(i + 1) * d]);
                self.copy(t as usize, true, &staging, &mut gv[i * d..(i + 1) * d]);
            }
        }
        staging.clear();
        read
    }

    /// Drops the rows staged this step (after an append's splits).
    pub fn finish(&self) {
        self.off.staging[self.hi()].lock().expect("staging lock").clear();
    }
}

impl RowSource for HeadSource<'_> {
    /// A key the file cannot give (a failed read, recorded) reads as zeros: the index may
    /// go on, but the cache is failed and the forward pass ends the step.
    fn row(&self, t: usize, out: &mut [f32]) {
        let mut staging = self.off.staging[self.hi()].lock().expect("staging lock");
        if let Some(r) = self.file_row(t) {
            if staging.get(r, self.off.row_bytes).is_none() {
                match self.off.read(&[r], self.purpose) {
                    Ok(bytes) => staging.put(&[r], &bytes, self.off.row_bytes),
                    Err(e) => {
                        self.off.record_failure(&e);
                        out.fill(0.0);
                        return;
                    }
                }
            }
        }
        let mut k = vec![f16::ZERO; self.dim];
        self.copy(t, false, &staging, &mut k);
        k.convert_to_f32_slice(out);
    }

    fn prefetch(&self, unit: u32, tokens: &[u32]) {
        let rows = self.unit_rows(tokens);
        let mut staging = self.off.staging[self.hi()].lock().expect("staging lock");
        if let Err(e) = self.fetch_unit(unit, rows, &mut staging) {
            self.off.record_failure(&e);
        }
    }
}
