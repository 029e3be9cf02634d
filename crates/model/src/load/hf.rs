//! Hugging Face folders: `config.json` (parsed in `hf_config.rs`), `tokenizer.json` (+ config
//! and chat template files, read by `engram-tokenizer`), and `model.safetensors` or a
//! sharded `model.safetensors.index.json`. Tensors are memory-mapped and
//! used in their stored dtype (f32, f16, bf16).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use engram_kernels::DType;
use memmap2::Mmap;
use safetensors::SafeTensors;
use serde_json::Value as Json;

pub use super::hf_config::parse_config;
use super::Loaded;
use crate::config::{Arch, ModelConfig};
use crate::error::{config_err, tensor_err, ModelError, Result};
use crate::weights::{FeedForward, GatedMlp, LayerWeights, MlpBias, ModelWeights, MoeWeights, Storage, Weight, WeightCtor};

/// Loads a Hugging Face model folder.
pub fn load_hf(dir: &Path) -> Result<Loaded> {
    let config_path = dir.join("config.json");
    let config_text = read(&config_path)?;
    let file = config_path.display().to_string();
    let json: Json = serde_json::from_str(&config_text).map_err(|e| config_err(&file, "(json)", e.to_string()))?;
    let mut config = parse_config(&json, &file)?;
    let tokenizer = engram_tokenizer::Tokenizer::from_hf_dir(dir)?;
    let tensors = TensorSet::open(dir)?;
    let weights = build_weights(&config, &tensors)?;
    // transformers multiplies the embeddings by the scale cast to their dtype.
    config.embed_scale = match weights.embed.dtype {
        DType::BF16 => half::bf16::from_f32(config.embed_scale).to_f32(),
        DType::F16 => half::f16::from_f32(config.embed_scale).to_f32(),
        _ => config.embed_scale,
    };
    let mut identity = config_text.into_bytes();
    identity.extend_from_slice(&tensors.identity);
    Ok(Loaded { config, weights, tokenizer, source: format!("hf:{}", dir.display()), identity })
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })
}

/// A tensor of a safetensors file: file label, mapping, shape, byte range.
type Mapped = (String, Arc<Mmap>, Vec<usize>, std::ops::Range<usize>);

/// A float tensor of a safetensors file: file label, mapping, dtype, shape, byte range.
type MappedFloat = (String, Arc<Mmap>, DType, Vec<usize>, std::ops::Range<usize>);

/// The union of the safetensors files of a folder, by tensor name.
struct TensorSet {
    tensors: HashMap<String, MappedFloat>,
    /// GPT-OSS's MXFP4 experts as its checkpoints ship them: the u8 `*_blocks` and `*_scales`.
    packed: HashMap<String, Mapped>,
    identity: Vec<u8>,
}

impl TensorSet {
    fn open(dir: &Path) -> Result<TensorSet> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index.exists() {
            let text = read(&index)?;
            let file = index.display().to_string();
            let j: Json = serde_json::from_str(&text).map_err(|e| config_err(&file, "(json)", e.to_string()))?;
            let map = j.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| config_err(&file, "weight_map", "missing"))?;
            let mut names: Vec<String> = map.values().filter_map(|v| v.as_str().map(str::to_string)).collect();
            names.sort();
            names.dedup();
            for n in &names {
                if n.contains('/') || n.contains("..") {
                    return Err(config_err(&file, "weight_map", format!("shard name \"{n}\" leaves the folder")));
                }
            }
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            return Err(ModelError::Io {
                path: single,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "missing (nor is there model.safetensors.index.json)"),
            });
        };
        let mut set = TensorSet { tensors: HashMap::new(), packed: HashMap::new(), identity: Vec::new() };
        for path in files {
            let f = std::fs::File::open(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
            // SAFETY: the mapping is read-only; a model file modified while mapped is the
            // user's error, exactly as for llama.cpp and candle.
            let map = Arc::new(unsafe { Mmap::map(&f) }.map_err(|source| ModelError::Io { path: path.clone(), source })?);
            let label = path.display().to_string();
            let st = SafeTensors::deserialize(&map).map_err(|e| tensor_err(&label, "(header)", e.to_string()))?;
            let base = map.as_ptr() as usize;
            let mut names: Vec<(String, safetensors::tensor::TensorView)> = st.tensors();
            names.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, view) in names {
                let start = view.data().as_ptr() as usize - base;
                let range = start..start + view.data().len();
                if view.dtype() == safetensors::Dtype::U8 && (name.ends_with("_blocks") || name.ends_with("_scales")) {
                    set.identity.extend_from_slice(format!("{name}:U8:{:?};", view.shape()).as_bytes());
                    set.identity.extend_from_slice(&view.data()[..view.data().len().min(64)]);
                    set.packed.insert(name, (label.clone(), map.clone(), view.shape().to_vec(), range));
                    continue;
                }
                let dtype = match view.dtype() {
                    safetensors::Dtype::F32 => DType::F32,
                    safetensors::Dtype::F16 => DType::F16,
                    safetensors::Dtype::BF16 => DType::BF16,
                    other => return Err(tensor_err(&label, &name, format!("dtype {other:?} is not supported (f32, f16, bf16)"))),
                };
                set.identity.extend_from_slice(format!("{name}:{dtype:?}:{:?};", view.shape()).as_bytes());
                // A content sample makes two fixtures of the same shape but different seeds differ.
                let d = view.data();
                set.identity.extend_from_slice(&d[..d.len().min(64)]);
                set.tensors.insert(name, (label.clone(), map.clone(), dtype, view.shape().to_vec(), range));
            }
        }
        Ok(set)
    }

    fn get(&self, name: &str, shape: &[usize]) -> Result<Weight> {
        self.get_with(name, shape, Weight::new)
    }

    /// [`Self::get`] through constructor `make` (`Weight::new`, or `Weight::for_rows` for a
    /// matrix only read row by row).
    fn get_with(&self, name: &str, shape: &[usize], make: WeightCtor) -> Result<Weight> {
        let (file, map, dtype, have, range) = self.tensors.get(name).ok_or_else(|| tensor_err("model.safetensors", name, "missing"))?;
        if have.as_slice() != shape {
            return Err(tensor_err(file, name, format!("shape {have:?}, expected {shape:?}")));
        }
        let (rows, cols) = match shape {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            _ => return Err(tensor_err(file, name, "expected a 1-D or 2-D tensor")),
        };
        make(file, name, *dtype, rows, cols, Storage::Mapped(map.clone(), range.clone()))
    }

    /// A fused `[sum(parts), cols]` matrix split into one matrix per part (`Weight::split_rows`).
    fn get_split(&self, name: &str, parts: &[usize], cols: usize) -> Result<Vec<Weight>> {
        let (file, map, dtype, have, range) = self.tensors.get(name).ok_or_else(|| tensor_err("model.safetensors", name, "missing"))?;
        let rows: usize = parts.iter().sum();
        if have.as_slice() != [rows, cols] {
            return Err(tensor_err(file, name, format!("shape {have:?}, expected {:?}", [rows, cols])));
        }
        Weight::split_rows(file, name, *dtype, parts, cols, Storage::Mapped(map.clone(), range.clone()))
    }

    /// Tensor `name`'s file label, dtype and bytes, checked to have `shape` (any rank).
    fn raw(&self, name: &str, shape: &[usize]) -> Result<(&str, DType, &[u8])> {
        let (file, map, dtype, have, range) = self.tensors.get(name).ok_or_else(|| tensor_err("model.safetensors", name, "missing"))?;
        if have.as_slice() != shape {
            return Err(tensor_err(file, name, format!("shape {have:?}, expected {shape:?}")));
        }
        Ok((file, *dtype, &map[range.clone()]))
    }

    /// Packed (u8) tensor `name`'s file label and bytes, checked to have `shape`; `None` when absent.
    fn packed(&self, name: &str, shape: &[usize]) -> Result<Option<(&str, &[u8])>> {
        let Some((file, map, have, range)) = self.packed.get(name) else { return Ok(None) };
        if have.as_slice() != shape {
            return Err(tensor_err(file, name, format!("shape {have:?}, expected {shape:?}")));
        }
        Ok(Some((file, &map[range.clone()])))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        Ok(self.get(name, &[len])?.to_f32())
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
}

/// GPT-OSS's experts under `p` (`{p}.gate_up_proj` `[experts, hidden, 2·ffn]` with gate and up
/// interleaved by column, `{p}.down_proj` `[experts, ffn, hidden]`, both applied as `x @ W`,
/// and their biases): each expert's gate, up and down as `[out, in]` matrices in the stored
/// dtype, copied out transposed (`super::experts`).
fn gpt_oss_experts(t: &TensorSet, p: &str, experts: usize, ffn: usize, hidden: usize) -> Result<Vec<GatedMlp>> {
    use super::experts::columns_as_rows;
    if t.packed.contains_key(&format!("{p}.gate_up_proj_blocks")) {
        return gpt_oss_mxfp4_experts(t, p, experts, ffn, hidden);
    }
    let gate_up_name = format!("{p}.gate_up_proj");
    let (file, dtype, gate_up) = t.raw(&gate_up_name, &[experts, hidden, 2 * ffn])?;
    let down_name = format!("{p}.down_proj");
    let (_, down_dtype, down) = t.raw(&down_name, &[experts, ffn, hidden])?;
    let gate_up_bias = t.get(&format!("{p}.gate_up_proj_bias"), &[experts, 2 * ffn])?.to_f32();
    let down_bias = t.get(&format!("{p}.down_proj_bias"), &[experts, hidden])?.to_f32();
    let owned = |name: &str, dtype: DType, rows: usize, cols: usize, bytes: Vec<u8>| {
        Weight::new(file, name, dtype, rows, cols, Storage::Owned(Arc::new(bytes)))
    };
    (0..experts)
        .map(|e| {
            let gu = &gate_up[e * gate_up.len() / experts..(e + 1) * gate_up.len() / experts];
            let dn = &down[e * down.len() / experts..(e + 1) * down.len() / experts];
            let bias = &gate_up_bias[e * 2 * ffn..(e + 1) * 2 * ffn];
            Ok(GatedMlp {
                gate: owned(&gate_up_name, dtype, ffn, hidden, columns_as_rows(gu, dtype, hidden, 2 * ffn, 0, 2))?,
                up: owned(&gate_up_name, dtype, ffn, hidden, columns_as_rows(gu, dtype, hidden, 2 * ffn, 1, 2))?,
                down: owned(&down_name, down_dtype, hidden, ffn, columns_as_rows(dn, down_dtype, ffn, hidden, 0, 1))?,
                bias: Some(MlpBias {
                    gate: bias.iter().step_by(2).copied().collect(),
                    up: bias.iter().skip(1).step_by(2).copied().collect(),
                    down: down_bias[e * hidden..(e + 1) * hidden].to_vec(),
                }),
            })
        })
        .collect()
}

/// GPT-OSS's experts as its checkpoints ship them (`quant_method: mxfp4`): `gate_up_proj_blocks`
/// `[experts, 2·ffn, hidden/32, 16]` with `_scales` `[experts, 2·ffn, hidden/32]` (rows
/// `[out, in]`, gate and up interleaved by row), `down_proj_blocks` / `_scales` likewise with
/// `hidden` rows of `ffn`, and float biases: each expert's matrices repacked into ggml's MXFP4
/// blocks (as llama.cpp's converter repacks them), kept 4-bit.
fn gpt_oss_mxfp4_experts(t: &TensorSet, p: &str, experts: usize, ffn: usize, hidden: usize) -> Result<Vec<GatedMlp>> {
    use engram_kernels::mxfp4_rows_from_hf;
    if !hidden.is_multiple_of(32) || !ffn.is_multiple_of(32) {
        return Err(tensor_err("model.safetensors", &format!("{p}.gate_up_proj_blocks"), "MXFP4 rows need multiples of 32"));
    }
    let packed = |name: &str, rows: usize, cols: usize| -> Result<(&str, &[u8], &[u8])> {
        let missing = || tensor_err("model.safetensors", name, "missing");
        let (file, blocks) = t.packed(&format!("{name}_blocks"), &[experts, rows, cols / 32, 16])?.ok_or_else(missing)?;
        let (_, scales) = t.packed(&format!("{name}_scales"), &[experts, rows, cols / 32])?.ok_or_else(missing)?;
        Ok((file, blocks, scales))
    };
    let (gate_up_name, down_name) = (format!("{p}.gate_up_proj"), format!("{p}.down_proj"));
    let (file, gu_blocks, gu_scales) = packed(&gate_up_name, 2 * ffn, hidden)?;
    let (_, dn_blocks, dn_scales) = packed(&down_name, hidden, ffn)?;
    let gate_up_bias = t.get(&format!("{p}.gate_up_proj_bias"), &[experts, 2 * ffn])?.to_f32();
    let down_bias = t.get(&format!("{p}.down_proj_bias"), &[experts, hidden])?.to_f32();
    let owned = |name: &str, rows: usize, cols: usize, bytes: Vec<u8>| {
        Weight::new(file, name, DType::MXFP4, rows, cols, Storage::Owned(Arc::new(bytes)))
    };
    let part = |x: &'_ [u8], e: usize| -> Vec<u8> { x[e * x.len() / experts..(e + 1) * x.len() / experts].to_vec() };
    (0..experts)
        .map(|e| {
            let (gb, gs, db, ds) = (part(gu_blocks, e), part(gu_scales, e), part(dn_blocks, e), part(dn_scales, e));
            let bias = &gate_up_bias[e * 2 * ffn..(e + 1) * 2 * ffn];
            Ok(GatedMlp {
                gate: owned(&gate_up_name, ffn, hidden, mxfp4_rows_from_hf(&gb, &gs, 2 * ffn, hidden, 0, 2))?,
                up: owned(&gate_up_name, ffn, hidden, mxfp4_rows_from_hf(&gb, &gs, 2 * ffn, hidden, 1, 2))?,
                down: owned(&down_name, hidden, ffn, mxfp4_rows_from_hf(&db, &ds, hidden, ffn, 0, 1))?,
                bias: Some(MlpBias {
                    gate: bias.iter().step_by(2).copied().collect(),
                    up: bias.iter().skip(1).step_by(2).copied().collect(),
                    down: down_bias[e * hidden..(e + 1) * hidden].to_vec(),
                }),
            })
        })
        .collect()
}

fn build_weights(c: &ModelConfig, t: &TensorSet) -> Result<ModelWeights> {
    // Gemma's RMSNorm multiplies by `1 + w` (in f32, as transformers' Gemma3RMSNorm); the
    // stored `w` becomes `1 + w` here, as llama.cpp's converter writes it into GGUF files.
    let gemma_norm = |mut w: Vec<f32>| -> Vec<f32> {
        if c.sandwich_norms {
            w.iter_mut().for_each(|x| *x += 1.0);
        }
        w
    };
    // An embedding not tied to the output is only read row by row: no copy for the kernels.
    let untied = t.has("lm_head.weight");
    let embed = t.get_with("model.embed_tokens.weight", &[c.vocab, c.hidden], if untied { Weight::for_rows } else { Weight::new })?;
    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        let p = format!("model.layers.{i}");
        let bias = |n: &str, len: usize| -> Result<Option<Vec<f32>>> {
            let name = format!("{p}.self_attn.{n}.bias");
            if c.qkv_bias || t.has(&name) {
                Ok(Some(t.vector(&name, len)?))
            } else {
                Ok(None)
            }
        };
        let norm = |n: &str| -> Result<Option<Vec<f32>>> {
            if c.qk_norm {
                Ok(Some(gemma_norm(t.vector(&format!("{p}.self_attn.{n}.weight"), c.head_dim)?)))
            } else {
                Ok(None)
            }
        };
        let block_norm = |n: &str| -> Result<Vec<f32>> { Ok(gemma_norm(t.vector(&format!("{p}.{n}.weight"), c.hidden)?)) };
        // Phi-3 stores q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj` (gate first).
        let (q, k, v, ffn) = if c.arch == Arch::Phi3 {
            let [q, k, v]: [Weight; 3] = t
                .get_split(&format!("{p}.self_attn.qkv_proj.weight"), &[c.q_width(), c.kv_width(), c.kv_width()], c.hidden)?
                .try_into()
                .map_err(|_| tensor_err("model.safetensors", "qkv_proj", "split into three"))?;
            let [gate, up]: [Weight; 2] = t
                .get_split(&format!("{p}.mlp.gate_up_proj.weight"), &[c.ffn, c.ffn], c.hidden)?
                .try_into()
                .map_err(|_| tensor_err("model.safetensors", "gate_up_proj", "split into two"))?;
            let down = t.get(&format!("{p}.mlp.down_proj.weight"), &[c.hidden, c.ffn])?;
            (q, k, v, FeedForward::Dense(GatedMlp { gate, up, down, bias: None }))
        } else {
            let mlp = |p: &str, ffn: usize| -> Result<GatedMlp> {
                Ok(GatedMlp {
                    gate: t.get(&format!("{p}.gate_proj.weight"), &[ffn, c.hidden])?,
                    up: t.get(&format!("{p}.up_proj.weight"), &[ffn, c.hidden])?,
                    down: t.get(&format!("{p}.down_proj.weight"), &[c.hidden, ffn])?,
                    bias: None,
                })
            };
            // Mixtral's expert e: `w1` gate, `w3` up, `w2` down.
            let mixtral_expert = |p: &str, ffn: usize| -> Result<GatedMlp> {
                Ok(GatedMlp {
                    gate: t.get(&format!("{p}.w1.weight"), &[ffn, c.hidden])?,
                    up: t.get(&format!("{p}.w3.weight"), &[ffn, c.hidden])?,
                    down: t.get(&format!("{p}.w2.weight"), &[c.hidden, ffn])?,
                    bias: None,
                })
            };
            let ffn = match c.moe {
                Some(m) if c.arch == Arch::GptOss => FeedForward::Moe(MoeWeights {
                    router: t.get(&format!("{p}.mlp.router.weight"), &[m.experts, c.hidden])?,
                    router_bias: Some(t.vector(&format!("{p}.mlp.router.bias"), m.experts)?),
                    experts: gpt_oss_experts(t, &format!("{p}.mlp.experts"), m.experts, m.expert_ffn, c.hidden)?,
                }),
                Some(m) if c.arch == Arch::Mixtral => FeedForward::Moe(MoeWeights {
                    router: t.get(&format!("{p}.block_sparse_moe.gate.weight"), &[m.experts, c.hidden])?,
                    router_bias: None,
                    experts: (0..m.experts)
                        .map(|e| mixtral_expert(&format!("{p}.block_sparse_moe.experts.{e}"), m.expert_ffn))
                        .collect::<Result<_>>()?,
                }),
                // Qwen3-MoE: the router is `mlp.gate`, expert e's MLP `mlp.experts.{e}.*_proj`.
                Some(m) => FeedForward::Moe(MoeWeights {
                    router: t.get(&format!("{p}.mlp.gate.weight"), &[m.experts, c.hidden])?,
                    router_bias: None,
                    experts: (0..m.experts).map(|e| mlp(&format!("{p}.mlp.experts.{e}"), m.expert_ffn)).collect::<Result<_>>()?,
                }),
                None => FeedForward::Dense(mlp(&format!("{p}.mlp"), c.ffn)?),
            };
            (
                t.get(&format!("{p}.self_attn.q_proj.weight"), &[c.q_width(), c.hidden])?,
                t.get(&format!("{p}.self_attn.k_proj.weight"), &[c.kv_width(), c.hidden])?,
                t.get(&format!("{p}.self_attn.v_proj.weight"), &[c.kv_width(), c.hidden])?,
                ffn,
            )
        };
        // Gemma's `post_attention_layernorm` norms the attention output; its MLP's input norm
        // is `pre_feedforward_layernorm` (Llama's is `post_attention_layernorm`).
        let (post_attn_norm, ffn_norm, post_ffn_norm) = if c.sandwich_norms {
            (
                Some(block_norm("post_attention_layernorm")?),
                block_norm("pre_feedforward_layernorm")?,
                Some(block_norm("post_feedforward_layernorm")?),
            )
        } else {
            (None, block_norm("post_attention_layernorm")?, None)
        };
        layers.push(LayerWeights {
            attn_norm: block_norm("input_layernorm")?,
            q,
            k,
            v,
            q_bias: bias("q_proj", c.q_width())?,
            k_bias: bias("k_proj", c.kv_width())?,
            v_bias: bias("v_proj", c.kv_width())?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            o: t.get(&format!("{p}.self_attn.o_proj.weight"), &[c.hidden, c.q_width()])?,
            o_bias: if t.has(&format!("{p}.self_attn.o_proj.bias")) {
                Some(t.vector(&format!("{p}.self_attn.o_proj.bias"), c.hidden)?)
            } else {
                None
            },
            sinks: if c.arch == Arch::GptOss { Some(t.vector(&format!("{p}.self_attn.sinks"), c.num_heads)?) } else { None },
            post_attn_norm,
            ffn_norm,
            post_ffn_norm,
            ffn,
        });
    }
    let final_norm = gemma_norm(t.vector("model.norm.weight", c.hidden)?);
    let (output, embed) = if untied { (t.get("lm_head.weight", &[c.vocab, c.hidden])?, embed) } else { (embed.clone(), embed) };
    Ok(ModelWeights { embed, layers, final_norm, output })
}
