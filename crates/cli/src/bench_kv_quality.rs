//! `engram bench kv-quality`: how much each 4/8-bit KV scheme changes the model's
//! next-token distribution, against f32 KV, over the same text — the measurement
//! behind the choice of `q8`/`q4` (README, "KV formats").
//!
//! Rows: the shipped formats (`q8`, `q4`: ggml Q8_0/Q4_0 groups of 32 along
//! each token's head dimension, quantized as written, with the sequence's
//! partial last block also kept in f16 — the recent window) through the real
//! KV pool; and alternatives simulated by [`SimQuantKv`] (values quantized and
//! dequantized at the point a real format would, attention then reads f32):
//! * `q4-no-window`: `q4` without the window (what it was before);
//! * `q4-sim`: the shipped `q4` simulated (a check that the simulation is
//!   faithful: it should match the `q4` row closely);
//! * `q4_1+window`: asymmetric 4-bit (scale + minimum per group of 32, like
//!   ggml Q4_1) per token, with the window;
//! * `kivi4`: KIVI — keys per channel (each head dimension's 32 values of a
//!   block share a scale and minimum), values per token, both asymmetric
//!   4-bit, with the window (KIVI needs it: a channel group is only complete
//!   when the block is);
//! * `kivi4-sym`: the same split with symmetric groups (one scale, Q4_0
//!   arithmetic), so it costs exactly what `q4` costs.
//!
//! And the opt-in bf16 attention (`--attention bf16`, [`engram_model::AttentionPrecision`]) with
//! each shipped format (`f16+bf16-attn`, ...), against the same exact f32 reference. Where the
//! CPU has no AMX-BF16 tiles attention runs the portable f32 path and those rows equal the
//! plain ones.

use std::path::PathBuf;

use anyhow::{Context, Result};
use engram_engine::Generator;
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::kv::{KvCache, KvChunk, KvData, KvElem};
use engram_model::{AttentionPrecision, Logits, Model, SeqStep};
use half::f16;
use serde_json::json;

use crate::common::{load_model, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Text to run (e.g. a Python file for pycode-7m). Default: the fixture corpus.
    #[arg(long)]
    text: Option<PathBuf>,
    /// Tokens of the text to use: the first half is prefilled, the second half is scored one
    /// token at a time, as decoding reads the cache (so a recent window matters as it would).
    #[arg(long, default_value_t = 1024)]
    tokens: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// Tokens per block, as in the KV store.
const BLOCK: usize = 32;

/// A quantization scheme simulated by [`SimQuantKv`].
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scheme {
    /// ggml Q4_0 per token as each row is written, no window (what `q4` was before the window).
    Q4NoWindow,
    /// ggml Q4_0 per token, applied when a block fills: the shipped `q4` (a check of the simulation).
    Q4Window,
    /// Asymmetric 4-bit per token (group 32 along dims), when a block fills.
    Q41Window,
    /// Keys per channel over the block's 32 tokens, values per token; asymmetric 4-bit.
    Kivi4,
    /// As `Kivi4` but symmetric (Q4_0 arithmetic: one scale per group), so it costs what `q4` does.
    Kivi4Sym,
}

impl Scheme {
    fn name(self) -> &'static str {
        match self {
            Scheme::Q4NoWindow => "q4-no-window",
            Scheme::Q4Window => "q4-sim",
            Scheme::Q41Window => "q4_1+window",
            Scheme::Kivi4 => "kivi4",
            Scheme::Kivi4Sym => "kivi4-sym",
        }
    }

    /// Stored bytes per token per KV head (keys + values) for head dimension `hd`, sealed blocks.
    fn bytes_per_head_token(self, hd: usize) -> f64 {
        let data = hd as f64 / 2.0;
        let per_token_groups = (hd / 32) as f64;
        match self {
            Scheme::Q4NoWindow | Scheme::Q4Window => 2.0 * (data + 2.0 * per_token_groups),
            Scheme::Q41Window => 2.0 * (data + 4.0 * per_token_groups),
            // Keys: one (scale, min) f16 pair per channel per 32-token block.
            Scheme::Kivi4 => (data + 4.0 * hd as f64 / BLOCK as f64) + (data + 4.0 * per_token_groups),
            Scheme::Kivi4Sym => (data + 2.0 * hd as f64 / BLOCK as f64) + (data + 2.0 * per_token_groups),
        }
    }
}

/// An f32 KV cache holding exactly what `scheme` would give back: tokens of the last, partial
/// block are kept as written (except `Q4NoWindow`, quantized at once); when a block fills, its
/// keys and values are replaced by their quantize → dequantize round trip.
struct SimQuantKv {
    scheme: Scheme,
    heads: usize,
    hd: usize,
    /// Per layer: blocks of `[heads][BLOCK][hd]` f32 (keys, values).
    blocks: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    len: Vec<usize>,
}

impl SimQuantKv {
    fn new(scheme: Scheme, layers: usize, heads: usize, hd: usize) -> Self {
        SimQuantKv { scheme, heads, hd, blocks: vec![Vec::new(); layers], len: vec![0; layers] }
    }

    fn seal(&mut self, layer: usize, block: usize) {
        let (hd, scheme) = (self.hd, self.scheme);
        let (k, v) = &mut self.blocks[layer][block];
        // Per head: `BLOCK` rows of `hd`.
        for (kf, vf) in k.chunks_exact_mut(BLOCK * hd).zip(v.chunks_exact_mut(BLOCK * hd)) {
            match scheme {
                Scheme::Q4NoWindow => {} // quantized as written, in `write`
                Scheme::Q4Window => {
                    kf.chunks_exact_mut(hd).for_each(q4_row_round_trip);
                    vf.chunks_exact_mut(hd).for_each(q4_row_round_trip);
                }
                Scheme::Q41Window => {
                    kf.chunks_exact_mut(32).for_each(asym4_round_trip);
                    vf.chunks_exact_mut(32).for_each(asym4_round_trip);
                }
                Scheme::Kivi4 | Scheme::Kivi4Sym => {
                    let sym = scheme == Scheme::Kivi4Sym;
                    // Channel d of this head's block: elements d, d + hd, ... (stride hd).
                    for d in 0..hd {
                        let mut ch: Vec<f32> = (0..BLOCK).map(|t| kf[t * hd + d]).collect();
                        if sym {
                            q4_row_round_trip(&mut ch);
                        } else {
                            asym4_round_trip(&mut ch);
                        }
                        for t in 0..BLOCK {
                            kf[t * hd + d] = ch[t];
                        }
                    }
                    if sym {
                        vf.chunks_exact_mut(hd).for_each(q4_row_round_trip);
                    } else {
                        vf.chunks_exact_mut(32).for_each(asym4_round_trip);
                    }
                }
            }
        }
    }
}

impl KvCache for SimQuantKv {
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        let (heads, hd) = (self.heads, self.hd);
        let width = heads * hd;
        for t in 0..num_tokens {
            let pos = first_pos + t;
            let (b, slot) = (pos / BLOCK, pos % BLOCK);
            while self.blocks[layer].len() <= b {
                let size = heads * BLOCK * hd;
                self.blocks[layer].push((vec![0.0; size], vec![0.0; size]));
            }
            let (k, v) = &mut self.blocks[layer][b];
            for h in 0..heads {
                let (dst, src) = ((h * BLOCK + slot) * hd, t * width + h * hd);
                let (kr, vr) = (&mut k[dst..dst + hd], &mut v[dst..dst + hd]);
                kr.copy_from_slice(&keys[src..src + hd]);
                vr.copy_from_slice(&values[src..src + hd]);
                if self.scheme == Scheme::Q4NoWindow {
                    q4_row_round_trip(kr);
                    q4_row_round_trip(vr);
                }
            }
            self.len[layer] = self.len[layer].max(pos + 1);
            if slot == BLOCK - 1 {
                self.seal(layer, b);
            }
        }
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        for (b, (k, v)) in self.blocks[layer].iter().enumerate() {
            let len = self.len[layer].saturating_sub(b * BLOCK).min(BLOCK);
            // `KvElem::F32` rows are little-endian f32: the native layout on every target we build.
            f(&KvChunk {
                first_pos: b * BLOCK,
                positions: None,
                key_index: b * BLOCK,
                len,
                capacity: BLOCK,
                keys: KvData { elem: KvElem::F32, bytes: bytemuck::cast_slice(k) },
                values: KvData { elem: KvElem::F32, bytes: bytemuck::cast_slice(v) },
                mask: None,
                ahead: None,
            });
        }
    }
}

/// The shipped `q4` round trip of one row (`KvFormat::Q4`'s groups: 32 where the row divides).
fn q4_row_round_trip(row: &mut [f32]) {
    let elem = KvFormat::Q4.elem(row.len());
    let mut enc = vec![0u8; elem.row_bytes(row.len())];
    elem.encode_row(row, &mut enc);
    elem.decode_row(&enc, row);
}

/// Asymmetric 4-bit round trip of one group: `x ≈ min + q·scale`, `q ∈ 0..=15`, scale and
/// minimum stored as f16 (as ggml Q4_1 and KIVI's kernels do).
fn asym4_round_trip(g: &mut [f32]) {
    let (mn, mx) = g.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    let scale = f16::from_f32((mx - mn) / 15.0).to_f32();
    let min = f16::from_f32(mn).to_f32();
    for x in g.iter_mut() {
        let q = if scale > 0.0 { ((*x - min) / scale).round().clamp(0.0, 15.0) } else { 0.0 };
        *x = min + q * scale;
    }
}

pub fn run(a: Args) -> Result<()> {
    // The reference and the format rows run exact attention whatever `--attention` says.
    let mut model = load_model(&a.model)?.with_attention(AttentionPrecision::Exact);
    let text = match &a.text {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        None => engram_tokenizer::FIXTURE_CORPUS.to_string(),
    };
    let mut ids = model.tokenizer.encode(&text, true)?.ids;
    anyhow::ensure!(ids.len() >= 2, "the text has fewer than 2 tokens");
    ids.truncate(a.tokens);
    let c = &model.config;
    let layout = KvLayout::of(c);
    let half = ids.len() / 2;
    let (prefix, rest) = ids.split_at(half);
    let pool_of = |format| KvPool::new(layout, format, 1 << 34);
    let decode = |model: &Model, format| -> Result<Vec<f32>> {
        let mut g = Generator::new(model, &pool_of(format));
        g.feed(prefix, false)?;
        Ok(g.with_prefill_chunk(1).feed(rest, true)?)
    };
    let exact = decode(&model, KvFormat::F32)?;
    let f16_bytes = 2.0 * 2.0 * c.head_dim as f64;
    let bytes_vs_f16 = |format| pool_of(format).bytes_per_token() as f64 / (layout.num_layers * layout.num_kv_heads) as f64 / f16_bytes;
    let mut rows = Vec::new();
    for format in [KvFormat::F16, KvFormat::Q8, KvFormat::Q4] {
        let logits = decode(&model, format)?;
        rows.push(compare(format.name(), &exact, &logits, c.vocab, bytes_vs_f16(format)));
    }
    for scheme in [Scheme::Q4NoWindow, Scheme::Q4Window, Scheme::Q41Window, Scheme::Kivi4, Scheme::Kivi4Sym] {
        let mut kv = SimQuantKv::new(scheme, c.num_layers, c.num_kv_heads, c.head_dim);
        let mut pos = 0;
        for chunk in prefix.chunks(engram_engine::DEFAULT_PREFILL_CHUNK) {
            model.forward(&mut [SeqStep {
                tokens: chunk,
                first_pos: pos,
                positions: None,
                key_mask: None,
                kv: &mut kv,
                logits: Logits::None,
            }])?;
            pos += chunk.len();
        }
        let mut logits = Vec::with_capacity(rest.len() * c.vocab);
        for t in rest.chunks(1) {
            logits.extend(
                model
                    .forward(&mut [SeqStep {
                        tokens: t,
                        first_pos: pos,
                        positions: None,
                        key_mask: None,
                        kv: &mut kv,
                        logits: Logits::Last,
                    }])?
                    .remove(0),
            );
            pos += 1;
        }
        rows.push(compare(scheme.name(), &exact, &logits, c.vocab, scheme.bytes_per_head_token(c.head_dim) / f16_bytes));
    }
    let vocab = c.vocab;
    model.set_attention(AttentionPrecision::Bf16);
    for format in [KvFormat::F32, KvFormat::F16, KvFormat::Q8, KvFormat::Q4] {
        let logits = decode(&model, format)?;
        rows.push(compare(&format!("{}+bf16-attn", format.name()), &exact, &logits, vocab, bytes_vs_f16(format)));
    }
    for r in &rows {
        if a.json {
            println!("{r}");
        }
    }
    if !a.json {
        println!("{} tokens prefilled, {} scored one at a time; each scheme vs f32 KV", prefix.len(), rest.len());
        println!("{:<17} {:>8} {:>12} {:>14} {:>10}", "scheme", "top-1", "mean KL", "max rel err", "bytes/f16");
        for r in &rows {
            println!(
                "{:<17} {:>8.4} {:>12.3e} {:>14.3e} {:>10.3}",
                r["scheme"].as_str().unwrap(),
                r["top1_agreement"].as_f64().unwrap(),
                r["mean_kl_nats"].as_f64().unwrap(),
                r["max_rel_logit_err"].as_f64().unwrap(),
                r["bytes_vs_f16"].as_f64().unwrap()
            );
        }
    }
    Ok(())
}

/// One row: top-1 agreement, mean KL and worst relative logit error of `approx` vs `exact`.
pub fn compare(name: &str, exact: &[f32], approx: &[f32], vocab: usize, bytes_vs_f16: f64) -> serde_json::Value {
    let (mut agree, mut max_err, mut kl) = (0usize, 0f32, 0f64);
    let n = exact.len() / vocab;
    for (e, q) in exact.chunks_exact(vocab).zip(approx.chunks_exact(vocab)) {
        agree += (engram_engine::argmax(e) == engram_engine::argmax(q)) as usize;
        let scale = e.iter().fold(0f32, |m, x| m.max(x.abs()));
        max_err = max_err.max(e.iter().zip(q).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale);
        kl += kl_div(e, q);
    }
    json!({
        "scheme": name,
        "positions": n,
        "top1_agreement": (agree as f64 / n as f64 * 1e4).round() / 1e4,
        "mean_kl_nats": kl / n as f64,
        "max_rel_logit_err": max_err,
        "bytes_vs_f16": (bytes_vs_f16 * 1e3).round() / 1e3,
    })
}

/// `KL(p || q)` in nats between the softmax distributions of two logit vectors.
pub fn kl_div(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lse = |x: &[f32]| {
        let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p_logits), lse(q_logits));
    p_logits
        .iter()
        .zip(q_logits)
        .map(|(&a, &b)| {
            let pa = a as f64 - lp;
            pa.exp() * (pa - (b as f64 - lq))
        })
        .sum()
}
