//! Co-retrieval placement (DynaKV paper §5): clusters that are retrieved
//! together lie next to each other in the offload file, so one step's misses merge into long
//! contiguous reads instead of one short read per cluster.
//!
//! What "together" means is measured at the end of the prefill: the prefill's last
//! [`CALIB`] query tokens (all query heads of the KV group, captured from its multi-token
//! reads by [`Calib::record`]) are scored against the fresh index exactly as a decode step
//! would score them ([`crate::HeadIndex::calibrate`]), and each cluster keeps a signature, one
//! bit per calibration token that would fetch it. The file order sorts clusters by signature,
//! the latest token's bit most significant ([`co_retrieval_order`]): the clusters the last
//! prefill token fetches come first as one run, and within it and after it clusters fetched
//! by the same tokens stay adjacent. Decode queries move little from one token to the next,
//! so a step's fetched set is mostly a few such runs.
//!
//! Invariant: placement only permutes clusters in the file; every token is written once and
//! read back by position, so logits are the same whatever the order.

use engram_model::KvRead;

/// Calibration query tokens kept from the prefill (one signature bit each; at most 64).
pub const CALIB: usize = 32;

/// The last [`CALIB`] query tokens a (layer, KV head) saw before its index was built.
#[derive(Clone, Debug, Default)]
pub(crate) struct Calib {
    /// `[tokens × group, dim]`, oldest token first.
    pub queries: Vec<f32>,
    pub group: usize,
}

impl Calib {
    /// Keeps `read`'s query tokens, dropping the oldest beyond [`CALIB`].
    pub fn record(&mut self, read: &KvRead<'_>) {
        let per = read.queries.len() / read.positions.len().max(1);
        if per == 0 {
            return;
        }
        if self.group != read.group {
            self.queries.clear();
            self.group = read.group;
        }
        let take = read.positions.len().min(CALIB) * per;
        self.queries.extend_from_slice(&read.queries[read.queries.len() - take..]);
        let over = self.queries.len().saturating_sub(CALIB * per);
        self.queries.drain(..over);
    }
}

impl Calib {
    /// Scores the kept queries against `index` ([`crate::HeadIndex::calibrate`]) over the
    /// tokens a decode step could retrieve of a history of `n`: past the sinks, before the
    /// recent window, under `cfg`'s budget. Nothing when no query was kept.
    pub fn apply(&self, index: &mut dyn crate::HeadIndex, n: usize, cfg: &crate::SparseConfig) {
        if !self.queries.is_empty() {
            let sinks = cfg.sinks.min(n);
            index.calibrate(&self.queries, self.group, sinks..n.saturating_sub(cfg.recent).max(sinks), cfg.budget);
        }
    }
}

/// Cluster ids in file order for `signatures` (one per cluster, bit `j` = calibration token
/// `j` fetches it): descending signature, ties (and clusters no token fetched) in index order.
pub fn co_retrieval_order(signatures: &[u64]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..signatures.len() as u32).collect();
    order.sort_by(|&a, &b| signatures[b as usize].cmp(&signatures[a as usize]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_token_s_clusters_come_first_and_together() {
        // Token 1 (latest) fetches clusters 0 and 3, token 0 fetches 1 and 3.
        let order = co_retrieval_order(&[0b10, 0b01, 0, 0b11, 0]);
        assert_eq!(order, vec![3, 0, 1, 2, 4]);
    }

    #[test]
    fn record_keeps_the_last_tokens() {
        let mut c = Calib::default();
        let q: Vec<f32> = (0..40 * 2 * 4).map(|i| i as f32).collect();
        let pos: Vec<u32> = (0..40).collect();
        c.record(&KvRead { layer: 0, kv_head: 0, queries: &q[..10 * 8], group: 2, positions: &pos[..10] });
        c.record(&KvRead { layer: 0, kv_head: 0, queries: &q[10 * 8..], group: 2, positions: &pos[10..] });
        assert_eq!(c.queries.len(), CALIB * 8);
        assert_eq!(c.queries[..], q[(40 - CALIB) * 8..]);
    }
}
