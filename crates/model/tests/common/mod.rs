//! Shared test helpers: the `tiny` fixture generated once per test binary,
//! and a plain contiguous KV cache for exercising the model alone.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use engram_fixture::{FixtureFiles, GgufFormat, Shape};
use engram_kernels::DType;
use engram_model::weights::Storage;
use engram_model::{KvCache, KvChunk, KvData, KvElem, Logits, Model, SeqStep, Weight};

/// The tiny fixture (HF folder + f16/q8_0/q4_0 GGUF), generated once per process.
pub fn tiny() -> &'static FixtureFiles {
    static FILES: OnceLock<(tempfile::TempDir, FixtureFiles)> = OnceLock::new();
    &FILES
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("temp dir");
            let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &GgufFormat::DEFAULT, &mut |_| {})
                .expect("generate tiny fixture");
            (dir, files)
        })
        .1
}

pub fn tiny_hf() -> PathBuf {
    tiny().hf_dir.clone()
}

pub fn tiny_gguf(f: GgufFormat) -> PathBuf {
    tiny().gguf(f).expect("format written").to_path_buf()
}

/// The simplest possible cache: one growing f32 buffer per layer, all in one chunk.
/// Independent of `engram-kv`, so the model is tested on its own.
pub struct VecKv {
    kv_width: usize,
    head_dim: usize,
    /// Per layer: keys and values, token-major `[t][kv_width]`.
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    /// Head-major copies rebuilt after each write, as `KvChunk` wants.
    head_major: Vec<(Vec<f32>, Vec<f32>)>,
}

impl VecKv {
    pub fn new(model: &Model) -> VecKv {
        let c = &model.config;
        VecKv {
            kv_width: c.kv_width(),
            head_dim: c.head_dim,
            layers: vec![(Vec::new(), Vec::new()); c.num_layers],
            head_major: vec![(Vec::new(), Vec::new()); c.num_layers],
        }
    }
    fn len(&self, layer: usize) -> usize {
        self.layers[layer].0.len() / self.kv_width
    }
}

impl KvCache for VecKv {
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], n: usize) {
        let w = self.kv_width;
        let (k, v) = &mut self.layers[layer];
        k.truncate(first_pos * w);
        v.truncate(first_pos * w);
        k.extend_from_slice(&keys[..n * w]);
        v.extend_from_slice(&values[..n * w]);
        let t = k.len() / w;
        let heads = w / self.head_dim;
        let hd = self.head_dim;
        let mut hk = vec![0.0; t * w];
        let mut hv = vec![0.0; t * w];
        for pos in 0..t {
            for h in 0..heads {
                hk[h * t * hd + pos * hd..h * t * hd + (pos + 1) * hd].copy_from_slice(&k[pos * w + h * hd..pos * w + (h + 1) * hd]);
                hv[h * t * hd + pos * hd..h * t * hd + (pos + 1) * hd].copy_from_slice(&v[pos * w + h * hd..pos * w + (h + 1) * hd]);
            }
        }
        self.head_major[layer] = (hk, hv);
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let t = self.len(layer);
        if t == 0 {
            return;
        }
        let (k, v) = &self.head_major[layer];
        let (k, v): (Vec<u8>, Vec<u8>) =
            (k.iter().flat_map(|x| x.to_le_bytes()).collect(), v.iter().flat_map(|x| x.to_le_bytes()).collect());
        let (keys, values) = (KvData { elem: KvElem::F32, bytes: &k }, KvData { elem: KvElem::F32, bytes: &v });
        f(&KvChunk { first_pos: 0, positions: None, key_index: 0, len: t, capacity: t, keys, values, mask: None, ahead: None })
    }
}

/// Logits of every position of `tokens`, computed in one step on a fresh cache.
pub fn all_logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut kv = VecKv::new(model);
    let mut step = [SeqStep { tokens, first_pos: 0, positions: None, key_mask: None, kv: &mut kv, logits: Logits::All }];
    model.forward(&mut step).expect("forward").remove(0)
}

/// Greedy continuation of `prompt` for `n` tokens, one token per step.
pub fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut kv = VecKv::new(model);
    let mut step = [SeqStep { tokens: prompt, first_pos: 0, positions: None, key_mask: None, kv: &mut kv, logits: Logits::Last }];
    let mut logits = model.forward(&mut step).expect("forward").remove(0);
    let mut out = Vec::new();
    let mut pos = prompt.len();
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        let toks = [t];
        let mut step = [SeqStep { tokens: &toks, first_pos: pos, positions: None, key_mask: None, kv: &mut kv, logits: Logits::Last }];
        logits = model.forward(&mut step).expect("forward").remove(0);
        pos += 1;
    }
    out
}

pub fn argmax(x: &[f32]) -> u32 {
    let mut b = 0;
    for i in 0..x.len() {
        if x[i] > x[b] {
            b = i;
        }
    }
    b as u32
}

/// max |a - b| / max |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

pub const PROMPT: &str = "The persistent stream holds immutable system prompts — and a café's 日本語 menu.";

/// `m` with every matrix expanded to f32: isolates the kernels' activation quantization from
/// the weights' own rounding.
pub fn expanded_to_f32(mut m: Model) -> Model {
    let expand = |w: &Weight| {
        let bytes: Vec<u8> = w.to_f32().iter().flat_map(|x| x.to_le_bytes()).collect();
        Weight::new("test", "expanded", DType::F32, w.rows, w.cols, Storage::Owned(Arc::new(bytes))).unwrap()
    };
    let w = &mut m.weights;
    w.embed = expand(&w.embed);
    w.output = expand(&w.output);
    for l in &mut w.layers {
        for x in [&mut l.q, &mut l.k, &mut l.v, &mut l.o] {
            *x = expand(x);
        }
        let mlps: Vec<&mut engram_model::GatedMlp> = match &mut l.ffn {
            engram_model::FeedForward::Dense(m) => vec![m],
            engram_model::FeedForward::Moe(moe) => {
                moe.router = expand(&moe.router);
                moe.experts.iter_mut().collect()
            }
        };
        for m in mlps {
            for x in [&mut m.gate, &mut m.up, &mut m.down] {
                *x = expand(x);
            }
        }
    }
    m
}
