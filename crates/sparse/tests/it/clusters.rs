//! The clustered index on its own: every token in exactly one cluster whatever the update;
//! adaptive update splits clusters whose variance passes the prefill threshold; delayed splits
//! read less than splitting on every flag; local update adds `k` clusters per window.

use crate::common;
use common::noise;
use engram_sparse::clusters::{ClusterIndex, Update};
use engram_sparse::{HeadIndex, HeadKeys};
use half::f16;

/// `n` keys of 16 whose mean drifts after `pre` tokens (the decode's distribution shift).
fn keys(n: usize, pre: usize) -> Vec<f16> {
    let d = 16;
    noise(7, n * d)
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let t = i / d;
            let shift = if t >= pre { 3.0 * ((t - pre) as f32 / 50.0).min(1.0) * if i % 2 == 0 { 1.0 } else { -1.0 } } else { 0.0 };
            f16::from_f32(v + shift)
        })
        .collect()
}

/// Builds over `pre` tokens, appends the rest, retrieving with a fixed query every step.
fn grow(update: Update, n: usize, pre: usize) -> ClusterIndex {
    let d = 16;
    let rows = keys(n, pre);
    let mut idx = ClusterIndex::new(d, update);
    idx.build(HeadKeys::new(&rows[..pre * d], d));
    let q = noise(9, 2 * d);
    for t in pre..n {
        let k = HeadKeys::new(&rows[..(t + 1) * d], d);
        idx.append(k);
        let mut out = Vec::new();
        idx.select(k, &q, 0..t + 1, 256, &mut out);
    }
    idx
}

fn assert_partition(idx: &ClusterIndex, n: usize, pending: usize) {
    let mut seen = vec![0u8; n];
    for c in 0..idx.len() {
        for &t in idx.members(c) {
            seen[t as usize] += 1;
        }
    }
    assert!(seen.iter().all(|&s| s <= 1), "a token in two clusters");
    assert_eq!(seen.iter().filter(|&&s| s == 1).count(), n - pending);
}

#[test]
fn every_update_keeps_every_token_in_one_cluster() {
    let (n, pre) = (2000, 1000);
    for update in [Update::Static, Update::Adaptive { b_max: 16, eager: false }, Update::Adaptive { b_max: 16, eager: true }] {
        let idx = grow(update, n, pre);
        assert_partition(&idx, n, 0);
    }
    let local = grow(Update::Local { window: 320, k: 8 }, n, pre);
    assert_partition(&local, n, 1000 % 320);
    assert_eq!(local.len(), 1000usize.div_ceil(64) + 3 * 8);
}

#[test]
fn adaptive_update_splits_drifting_clusters_and_delaying_reads_less() {
    let (n, pre) = (2000, 1000);
    let stat = grow(Update::Static, n, pre);
    let delayed = grow(Update::Adaptive { b_max: 16, eager: false }, n, pre);
    let eager = grow(Update::Adaptive { b_max: 16, eager: true }, n, pre);
    let (sd, se) = (delayed.stats(), eager.stats());
    assert!(sd.splits > 0 && se.splits > 0, "no split: {sd:?} {se:?}");
    assert_eq!(stat.len(), 1000usize.div_ceil(64));
    assert!(delayed.len() > stat.len());
    assert!(sd.split_fetch_tokens < se.split_fetch_tokens, "delayed {sd:?} vs eager {se:?}");
    // Splitting keeps clusters tighter than static update.
    let mean_var = |i: &ClusterIndex| (0..i.len()).map(|c| i.variance(c) * i.members(c).len() as f64).sum::<f64>() / n as f64;
    assert!(mean_var(&delayed) < mean_var(&stat), "{} vs {}", mean_var(&delayed), mean_var(&stat));
}

/// Co-retrieval placement: the clusters the last calibration query token would fetch are the
/// first run of the file order, and either order holds every token once.
#[test]
fn co_retrieval_placement_puts_the_clusters_fetched_together_side_by_side() {
    let (d, n, group, budget) = (16, 600, 2, 128);
    let rows = keys(n, n);
    let k = HeadKeys::new(&rows, d);
    let mut idx = ClusterIndex::new(d, Update::Static);
    idx.build(k);
    let q = noise(11, 4 * group * d);
    idx.calibrate(&q, group, 0..n, budget);
    // What a decode step with the last calibration token's queries fetches.
    let mut step = idx.clone();
    let mut out = Vec::new();
    step.select(k, &q[3 * group * d..], 0..n, budget, &mut out);
    let mut fetched = Vec::new();
    step.for_each_fetched(&mut |_, m| fetched.extend_from_slice(m));
    assert!(!fetched.is_empty() && fetched.len() < n / 2, "{} of {n} fetched", fetched.len());
    let flat = |p: Vec<(u32, Vec<u32>)>| -> Vec<u32> { p.into_iter().flat_map(|(_, m)| m).collect() };
    let co = flat(idx.placement(true).unwrap());
    let plain = flat(idx.placement(false).unwrap());
    for order in [&co, &plain] {
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>(), "every token once");
    }
    let mut head = co[..fetched.len()].to_vec();
    head.sort_unstable();
    fetched.sort_unstable();
    assert_eq!(head, fetched, "the last token's clusters are the first run");
    assert_ne!(co, plain, "calibration changed the order");
}

#[test]
fn an_index_s_saved_length_is_the_length_it_saves() {
    // Built, grown with splits and delayed-split buffers, local windows part-filled: the
    // computed length (what the KV pool charges, measured without serializing) equals the
    // bytes `save` appends.
    let (n, pre) = (2000, 1000);
    for update in [
        Update::Static,
        Update::Adaptive { b_max: 16, eager: false },
        Update::Adaptive { b_max: 16, eager: true },
        Update::Local { window: 320, k: 8 },
    ] {
        for idx in [ClusterIndex::new(16, update), grow(update, pre, pre), grow(update, n, pre)] {
            let mut out = vec![1, 2, 3];
            idx.save(&mut out);
            assert_eq!(idx.saved_len(), out.len() - 3, "{update:?}, {} clusters", idx.len());
        }
    }
}
