//! Layer-ahead prefetch (DynaKV paper §6.1): once every KV head of layer `l` has
//! read its step's keys, a loader thread reads the clusters layer `l + 1` is predicted to
//! fetch — the ones it fetched at the previous step (queries move little from one token to the
//! next) — into the cluster cache, while this layer's output projection and FFN and the next
//! layer's q/k/v projections run. The last layer prefetches layer 0 of the next step.
//!
//! A job's cluster is marked in flight from submission until it has landed in the cache (or its
//! read failed); a step that needs a cluster in flight waits for it instead of reading it a
//! second time ([`Shared::wait_for`]), and a prefetch of a cluster the cache already holds
//! reads nothing. A failed prefetch read is dropped: the step's own read of that cluster then
//! fails and reports it.
//!
//! Invariant: prefetching only moves reads earlier — it puts into the cache exactly the bytes
//! of the rows it names (a lookup hits only on every row it asks for), so the keys attended,
//! and the logits, are the same with it and without it.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::unit_cache::Key;
use super::{coalesce, pick, ClusterCache, Counters, Reader};
use crate::SparseKv;

/// What the stepping threads and the loader thread share: the cluster cache, the counters and
/// the set of clusters in flight.
pub(crate) struct Shared {
    pub cache: Mutex<ClusterCache>,
    pub counters: Counters,
    inflight: Mutex<HashSet<Key>>,
    landed: Condvar,
}

impl Shared {
    /// The shared state around `cache`.
    pub fn new(cache: ClusterCache) -> Shared {
        Shared { cache: Mutex::new(cache), counters: Counters::default(), inflight: Mutex::new(HashSet::new()), landed: Condvar::new() }
    }

    /// Waits while `key` is being prefetched; returns whether it waited.
    pub fn wait_for(&self, key: Key) -> bool {
        let mut g = self.inflight.lock().expect("inflight lock");
        if !g.contains(&key) {
            return false;
        }
        while g.contains(&key) {
            g = self.landed.wait(g).expect("inflight lock");
        }
        self.counters.prefetch_waits.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn release(&self, key: Key) {
        self.inflight.lock().expect("inflight lock").remove(&key);
        self.landed.notify_all();
    }
}

/// One cluster to prefetch: its key, its file rows (sorted) and the step it is for.
pub(crate) struct Job {
    pub key: Key,
    pub rows: Vec<u64>,
    pub now: u64,
}

/// The loader thread (module doc). Jobs of one (layer, KV head) are read as one request.
pub(crate) struct Prefetcher {
    tx: Option<Mutex<Sender<Vec<Job>>>>,
    thread: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts the loader thread; it reads through `reader` (its own) and merges gaps of up
    /// to `gap` rows, as the step's reads do.
    pub fn new(shared: Arc<Shared>, reader: Reader, row_bytes: usize, gap: usize) -> io::Result<Prefetcher> {
        let (tx, rx) = channel::<Vec<Job>>();
        let thread = std::thread::Builder::new().name("dynakv-prefetch".into()).spawn(move || {
            for jobs in rx {
                // One request per (layer, KV head): its clusters' rows merged, so clusters
                // adjacent in the file are one read; released as soon as their head landed.
                for head in jobs.chunk_by(|a, b| (a.key.0, a.key.1) == (b.key.0, b.key.1)) {
                    load(&shared, &reader, row_bytes, gap, head);
                    head.iter().for_each(|j| shared.release(j.key));
                }
            }
        })?;
        Ok(Prefetcher { tx: Some(Mutex::new(tx)), thread: Some(thread) })
    }

    /// Queues `jobs` (those not already in flight), marking them in flight.
    pub fn submit(&self, shared: &Shared, mut jobs: Vec<Job>) {
        {
            let mut g = shared.inflight.lock().expect("inflight lock");
            jobs.retain(|j| g.insert(j.key));
        }
        if jobs.is_empty() {
            return;
        }
        let keys: Vec<Key> = jobs.iter().map(|j| j.key).collect();
        let sent = self.tx.as_ref().expect("a loader thread").lock().expect("prefetch lock").send(jobs);
        if sent.is_err() {
            keys.into_iter().for_each(|k| shared.release(k));
        }
    }
}

fn load(shared: &Shared, reader: &Reader, rb: usize, gap: usize, jobs: &[Job]) {
    let jobs: Vec<&Job> = {
        let cache = shared.cache.lock().expect("cache lock");
        jobs.iter().filter(|j| !cache.holds(j.key, &j.rows)).collect()
    };
    if jobs.is_empty() {
        return;
    }
    let mut all: Vec<u64> = jobs.iter().flat_map(|j| j.rows.iter().copied()).collect();
    all.sort_unstable();
    all.dedup();
    let runs = coalesce(&all, gap);
    let ops = runs.len() as u64;
    let Ok(data) = reader.read(runs.clone()) else { return };
    let c = &shared.counters;
    for (bytes, n) in [(&c.read_bytes, &c.read_ops), (&c.prefetch_bytes, &c.prefetch_ops)] {
        bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        n.fetch_add(ops, Ordering::Relaxed);
    }
    let mut cache = shared.cache.lock().expect("cache lock");
    for job in jobs {
        let bytes = pick(&job.rows, &runs, &data, rb);
        cache.insert_prefetched(job.key, job.rows.clone(), bytes, job.now);
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.tx = None; // closes the channel: the thread ends after the jobs queued
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl SparseKv {
    /// Called after each sparse read of (`layer`, some KV head) at step `now`: after the last
    /// head of the layer, queues the clusters the next layer fetched at its last step
    /// (module doc). Does nothing without a loader thread.
    pub(crate) fn read_done(&self, layer: usize, now: u64) {
        let Some(off) = self.off.as_deref() else { return };
        let Some(p) = &off.prefetcher else { return };
        if off.reads_done[layer].fetch_add(1, Ordering::AcqRel) + 1 < self.heads {
            return;
        }
        off.reads_done[layer].store(0, Ordering::Release);
        let next = (layer + 1) % self.layers;
        let now = now + (next == 0) as u64;
        let mut jobs = Vec::new();
        for h in 0..self.heads {
            let hi = next * self.heads + h;
            let idx = self.index[hi].lock().expect("index lock");
            idx.0.for_each_fetched(&mut |c, members| {
                let mut rows: Vec<u64> = members
                    .iter()
                    .map(|&t| t as usize)
                    .filter(|&t| t >= off.sinks && t < self.origin[next])
                    .map(|t| off.slots[hi][t] as u64)
                    .collect();
                rows.sort_unstable();
                if !rows.is_empty() {
                    jobs.push(Job { key: (next as u32, h as u32, c), rows, now });
                }
            });
        }
        {
            let cache = off.shared.cache.lock().expect("cache lock");
            jobs.retain(|j| !cache.holds(j.key, &j.rows));
        }
        p.submit(&off.shared, jobs);
    }
}
