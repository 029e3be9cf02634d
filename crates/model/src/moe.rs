//! The mixture-of-experts feed-forward block (Qwen3-MoE, Mixtral, GPT-OSS), as transformers
//! computes it: per token the router's logits (`router · x`, plus GPT-OSS's bias), then by
//! [`MoeGating`] either their softmax in f32 and the `top_k` most probable experts (ties to
//! the lower index), renormalized to sum to 1 when the config says so, or (GPT-OSS) the
//! `top_k` largest logits and a softmax over those alone; then, expert by expert in index
//! order, the tokens routed to it run its gated MLP (with its biases, where it has them) and
//! its output, times the token's weight for it, is added to the token's row.
//!
//! Invariant: a token's output depends only on its own row (every matmul is row-independent,
//! bitwise, and each row sums its experts in index order), so it is the same bits whatever
//! else shares the step: results do not depend on the tokens per call.

use crate::config::{FfnActivation, MoeConfig, MoeGating};
use crate::ops::{add_bias, gated_activation};
use crate::weights::{GatedMlp, MoeWeights};
use engram_kernels::{matmul, matmul_grouped, MatmulItem};

/// The top `k` experts of one token's router `logits` under `gating`: (expert, weight) by
/// falling weight.
pub fn route_by(gating: MoeGating, logits: &[f32], k: usize, normalize: bool) -> Vec<(usize, f32)> {
    match gating {
        MoeGating::SoftmaxThenTopK => route(logits, k, normalize),
        MoeGating::TopKThenSoftmax => {
            let mut ranked: Vec<(usize, f32)> = logits.iter().copied().enumerate().collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            ranked.truncate(k);
            let max = ranked.first().map_or(0.0, |&(_, l)| l);
            ranked.iter_mut().for_each(|(_, l)| *l = (*l - max).exp());
            let sum: f32 = ranked.iter().map(|&(_, e)| e).sum();
            ranked.iter_mut().for_each(|(_, e)| *e /= sum);
            ranked
        }
    }
}

/// The top `k` experts of one token's router `logits`: (expert, weight) by falling
/// probability, weights renormalized when `normalize`.
pub fn route(logits: &[f32], k: usize, normalize: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    let mut ranked: Vec<(usize, f32)> = exp.iter().map(|&e| e / sum).enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(k);
    if normalize {
        let total: f32 = ranked.iter().map(|&(_, p)| p).sum();
        ranked.iter_mut().for_each(|(_, p)| *p /= total);
    }
    ranked
}

/// `out` (`rows × hidden`) = the mixture's output for the normed rows `xn`.
pub fn moe_ffn(moe: &MoeWeights, cfg: MoeConfig, act: FfnActivation, xn: &[f32], rows: usize, hidden: usize, out: &mut [f32]) {
    let mut logits = vec![0.0f32; rows * cfg.experts];
    matmul(&moe.router.matrix(), xn, rows, &mut logits);
    if let Some(b) = &moe.router_bias {
        add_bias(&mut logits, b);
    }
    // Per expert, the rows routed to it and their weights, in row order.
    let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); cfg.experts];
    for (row, l) in logits.chunks_exact(cfg.experts).enumerate() {
        for (e, w) in route_by(cfg.gating, l, cfg.top_k, cfg.norm_top_k) {
            routed[e].push((row, w));
        }
    }
    out.fill(0.0);
    let f = cfg.expert_ffn;
    // The chosen experts, each with the rows routed to it (in row order).
    let chosen: Vec<(&GatedMlp, &[(usize, f32)])> =
        moe.experts.iter().zip(&routed).filter(|(_, r)| !r.is_empty()).map(|(e, r)| (e, r.as_slice())).collect();
    let xs: Vec<Vec<f32>> = chosen
        .iter()
        .map(|(_, rows_of)| rows_of.iter().flat_map(|&(row, _)| xn[row * hidden..(row + 1) * hidden].iter().copied()).collect())
        .collect();
    // Every chosen expert's gate and up, then every down, each as one parallel region (one
    // synchronisation per step, not one per expert: a decoded token reads 8 or so small
    // experts). Each product is bitwise what its own `matmul` gives (`matmul_grouped`).
    let mut gates: Vec<Vec<f32>> = chosen.iter().map(|(_, r)| vec![0.0f32; r.len() * f]).collect();
    let mut ups: Vec<Vec<f32>> = chosen.iter().map(|(_, r)| vec![0.0f32; r.len() * f]).collect();
    let gate_w: Vec<_> = chosen.iter().map(|(e, _)| e.gate.matrix()).collect();
    let up_w: Vec<_> = chosen.iter().map(|(e, _)| e.up.matrix()).collect();
    let mut items = Vec::with_capacity(2 * chosen.len());
    for (i, (g, u)) in gates.iter_mut().zip(ups.iter_mut()).enumerate() {
        let n = chosen[i].1.len();
        items.push(MatmulItem { w: &gate_w[i], x: &xs[i], n_tokens: n, out: g });
        items.push(MatmulItem { w: &up_w[i], x: &xs[i], n_tokens: n, out: u });
    }
    matmul_grouped(&mut items);
    drop(items);
    for ((expert, _), (gate, up)) in chosen.iter().zip(gates.iter_mut().zip(ups.iter_mut())) {
        if let Some(b) = &expert.bias {
            add_bias(gate, &b.gate);
            add_bias(up, &b.up);
        }
        gated_activation(act, gate, up);
    }
    let mut ys: Vec<Vec<f32>> = chosen.iter().map(|(_, r)| vec![0.0f32; r.len() * hidden]).collect();
    let down_w: Vec<_> = chosen.iter().map(|(e, _)| e.down.matrix()).collect();
    let mut items: Vec<MatmulItem> =
        ys.iter_mut().enumerate().map(|(i, y)| MatmulItem { w: &down_w[i], x: &gates[i], n_tokens: chosen[i].1.len(), out: y }).collect();
    matmul_grouped(&mut items);
    drop(items);
    // Summed into each row in expert index order, as before.
    for ((expert, rows_of), y) in chosen.iter().zip(&mut ys) {
        if let Some(b) = &expert.bias {
            add_bias(y, &b.down);
        }
        for (i, &(row, w)) in rows_of.iter().enumerate() {
            for (o, &v) in out[row * hidden..(row + 1) * hidden].iter_mut().zip(&y[i * hidden..(i + 1) * hidden]) {
                *o += v * w;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{route, route_by};
    use crate::config::MoeGating;

    /// GPT-OSS: the largest logits first, then a softmax over those alone.
    #[test]
    fn top_k_then_softmax_weighs_only_the_chosen() {
        let r = route_by(MoeGating::TopKThenSoftmax, &[0.5, 3.0, -1.0, 2.0], 2, false);
        assert_eq!(r.iter().map(|&(e, _)| e).collect::<Vec<_>>(), [1, 3]);
        let want = 1.0 / (1.0 + (-1.0f32).exp());
        assert!((r[0].1 - want).abs() < 1e-6 && (r[0].1 + r[1].1 - 1.0).abs() < 1e-6, "{r:?}");
    }

    #[test]
    fn routing_picks_the_most_probable_and_renormalizes() {
        let r = route(&[0.0, 2.0, 1.0, 2.0], 2, false);
        assert_eq!(r.iter().map(|&(e, _)| e).collect::<Vec<_>>(), [1, 3], "ties go to the lower index");
        let total: f32 = [0.0f32, 2.0, 1.0, 2.0].iter().map(|l| l.exp()).sum();
        assert!((r[0].1 - 2f32.exp() / total).abs() < 1e-6);
        let n = route(&[0.0, 2.0, 1.0, 2.0], 2, true);
        assert!((n[0].1 - 0.5).abs() < 1e-6 && (n[1].1 - 0.5).abs() < 1e-6);
        assert_eq!(route(&[5.0, 1.0, 3.0], 1, true), vec![(0, 1.0)]);
    }
}
