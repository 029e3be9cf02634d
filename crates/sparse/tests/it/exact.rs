//! Sparse reads against exact attention: with a budget covering the history every method's
//! logits equal the exact path's (the `tiny` fixture, whole forward passes); with a small
//! budget, attention over the cache equals an f64 reference over exactly the keys the read
//! chose; selections stay within their sinks, recent window and budget.

use crate::common;
use common::{decode, model, noise, prefill, tokens};
use engram_model::attention::{attend, AttnTask};
use engram_model::{AttentionPrecision, KvCache, KvRead, Model};
use engram_sparse::{Method, SparseConfig, SparseKv};

/// Prefills `prompt` (in chunks of 64), builds the index, decodes `rest` token by token;
/// returns the decoded tokens' logits.
fn run(model: &Model, kv: &mut SparseKv, prompt: &[u32], rest: &[u32]) -> Vec<Vec<f32>> {
    prefill(model, kv, prompt);
    decode(model, kv, rest)
}

#[test]
fn a_budget_covering_the_history_equals_exact_attention_for_every_method() {
    let (_d, model) = model();
    let ids = tokens(700);
    let (prompt, rest) = ids.split_at(620);
    let exact = run(&model, &mut SparseKv::new(&model.config, None), prompt, rest);
    let mut methods = Method::all();
    methods.push(Method::DynaKv { b_max: 4, eager: true });
    for m in methods {
        let cfg = SparseConfig { method: m, budget: 4096, sinks: 4, recent: 16 };
        let mut kv = SparseKv::new(&model.config, Some(cfg));
        let got = run(&model, &mut kv, prompt, rest);
        assert_eq!(got, exact, "{}: logits differ from exact attention", m.name());
        let (mean, reads) = kv.mean_attended();
        assert_eq!(reads, rest.len() * model.config.num_layers * model.config.num_kv_heads, "{}", m.name());
        assert!(mean > 620.0, "{}: attended {mean} keys", m.name());
    }
}

#[test]
fn a_small_budget_changes_the_logits_and_attends_fewer_keys() {
    let (_d, model) = model();
    let ids = tokens(700);
    let (prompt, rest) = ids.split_at(620);
    let exact = run(&model, &mut SparseKv::new(&model.config, None), prompt, rest);
    let cfg = SparseConfig { method: Method::Static, budget: 64, sinks: 4, recent: 16 };
    let mut kv = SparseKv::new(&model.config, Some(cfg));
    let got = run(&model, &mut kv, prompt, rest);
    assert_ne!(got, exact);
    let (mean, _) = kv.mean_attended();
    assert!(mean <= (64 + 4 + 16) as f64, "attended {mean}");
}

/// One layer, 2 KV heads of 16, `n` tokens of drifting keys (so clusters mean something).
fn filled(method: Method, n: usize, budget: usize) -> SparseKv {
    let (heads, d) = (2, 16);
    let mut kv = SparseKv::with_shape(1, heads, d, Some(SparseConfig { method, budget, sinks: 3, recent: 10 }));
    let keys: Vec<f32> =
        noise(1, n * heads * d).iter().enumerate().map(|(i, v)| v + ((i / (heads * d)) as f32 / 97.0).sin() * 2.0).collect();
    let values = noise(2, n * heads * d);
    kv.reserve(n);
    let pre = n * 3 / 4;
    kv.write(0, 0, &keys[..pre * heads * d], &values[..pre * heads * d], pre);
    kv.build_index();
    for t in pre..n {
        kv.reserve(1);
        kv.write(0, t, &keys[t * heads * d..(t + 1) * heads * d], &values[t * heads * d..(t + 1) * heads * d], 1);
    }
    kv
}

#[test]
fn attention_over_a_sparse_read_is_exact_over_the_keys_it_chose() {
    let (n, heads, group, d) = (1200, 2, 2, 16);
    for m in Method::all() {
        let kv = filled(m, n, 96);
        let q = noise(3, group * heads * d);
        let pos = [(n - 1) as u32];
        for h in 0..heads {
            let task = AttnTask {
                kv: &kv,
                layer: 0,
                q: &q,
                num_queries: 1,
                positions: &pos,
                key_mask: None,
                kv_head: h,
                group,
                head_dim: d,
                num_heads: group * heads,
                precision: AttentionPrecision::Exact,
            };
            let out = attend(&task);
            let sel = kv.last_selection(0, h);
            // Sinks and the recent window always; at most the budget besides.
            assert!((0..3).chain(n as u32 - 10..n as u32).all(|t| sel.contains(&t)), "{}", m.name());
            assert!(sel.len() <= 96 + 13 && sel.windows(2).all(|w| w[0] < w[1]), "{}: {} keys", m.name(), sel.len());
            if m != Method::Streaming {
                assert!(sel.len() > 13 + 48, "{}: only {} keys chosen", m.name(), sel.len());
            }
            // f64 reference over exactly the chosen keys (f16-rounded, as stored).
            let mut k = vec![0f32; d];
            let mut v = vec![0f32; d];
            for j in 0..group {
                let qh = &q[(h * group + j) * d..(h * group + j + 1) * d];
                let scores: Vec<f64> = sel
                    .iter()
                    .map(|&t| {
                        kv_row(&kv, 0, h, t as usize, true, &mut k);
                        qh.iter().zip(&k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let mx = scores.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                let z: f64 = scores.iter().map(|s| (s - mx).exp()).sum();
                let mut o = vec![0f64; d];
                for (&t, s) in sel.iter().zip(&scores) {
                    kv_row(&kv, 0, h, t as usize, false, &mut v);
                    o.iter_mut().zip(&v).for_each(|(a, b)| *a += (s - mx).exp() / z * *b as f64);
                }
                for (a, b) in out[j * d..(j + 1) * d].iter().zip(&o) {
                    assert!((*a as f64 - b).abs() < 2e-5, "{} head {h}.{j}: {a} vs {b}", m.name());
                }
            }
        }
    }
}

/// Key (or value) `t` of (layer, head), read back through the exact view.
fn kv_row(kv: &SparseKv, layer: usize, head: usize, t: usize, key: bool, out: &mut [f32]) {
    let d = out.len();
    kv.for_each_chunk(layer, &mut |c| {
        let data = if key { c.keys } else { c.values };
        let rb = data.elem.row_bytes(d);
        let row = head * c.capacity + t;
        data.elem.decode_row(&data.bytes[row * rb..(row + 1) * rb], out);
    });
}

#[test]
fn reads_of_several_tokens_and_exact_caches_see_every_key() {
    let kv = filled(Method::DynaKv { b_max: 8, eager: false }, 300, 32);
    let q = vec![0.1f32; 2 * 2 * 16];
    let read = KvRead { layer: 0, kv_head: 0, queries: &q, group: 2, positions: &[298, 299] };
    assert!(kv.selection(&read).is_none());
    let exact = SparseKv::with_shape(1, 2, 16, None);
    let read = KvRead { layer: 0, kv_head: 0, queries: &q[..32], group: 2, positions: &[0] };
    assert!(exact.selection(&read).is_none());
}
