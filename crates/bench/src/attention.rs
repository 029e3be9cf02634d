//! `engram bench attention`: the attention kernel alone, at two depths, side by side.
//!
//! A decode step's attention reads every cached key and value of every layer once, so its cost
//! grows with the history while the weights' cost stays fixed; this bench isolates it. A cache
//! of random keys and values in the `llama-1b` layout (16 layers, 8 KV heads of 64 dims,
//! 32 query heads) is built at `--depths` tokens, stored as the dual-stream ring stores turns:
//! blocks of 32 token rows per head, filled `--turn-tokens` at a time, each turn's tokens at
//! explicit positions (a moved span). The forward pass's attention tasks (one per KV head, on
//! the kernel pool) then run for every layer of one step with `--queries` query tokens, the
//! depths alternating, and each row reports the median step time, the KV bytes it read and
//! the rate (GB/s) — the quantity to hold near the machine's bandwidth (`bench membw`).
//!
//! Reproduce: `engram bench attention --threads 2 --depths 512,1536`.

use std::time::Instant;

use anyhow::{ensure, Result};
use engram_model::attention::{attend, AttnTask};
use engram_model::{AttentionPrecision, KvCache, KvChunk, KvData, KvElem};
use rayon::prelude::*;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Cached tokens at each measured depth, comma-separated.
    #[arg(long, default_value = "512,1536", value_delimiter = ',')]
    depths: Vec<usize>,
    /// Query tokens per step (1: decode).
    #[arg(long, default_value_t = 1)]
    queries: usize,
    /// Tokens per stored turn (a turn's rows start a fresh block, as the ring stores them);
    /// 0: one contiguous run of full blocks at positions 0.. (a plain session cache).
    #[arg(long, default_value_t = 44)]
    turn_tokens: usize,
    /// KV format: f16 (default), q8, q4 or f32.
    #[arg(long, default_value = "f16")]
    kv_format: String,
    /// Layers per step.
    #[arg(long, default_value_t = 16)]
    layers: usize,
    /// Kernel threads (default: physical cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Timed steps per depth (median reported).
    #[arg(long, default_value_t = 15)]
    reps: usize,
    /// One JSON object per row.
    #[arg(long)]
    json: bool,
}

const KV_HEADS: usize = 8;
const HEADS: usize = 32;
const HEAD_DIM: usize = 64;
const BLOCK: usize = 32;

pub fn run(a: Args) -> Result<()> {
    ensure!(!a.depths.is_empty() && a.depths.iter().all(|&d| d > 0), "--depths needs positive token counts");
    ensure!(a.queries >= 1 && a.layers >= 1 && a.reps >= 1, "--queries, --layers and --reps must be at least 1");
    let elem = match a.kv_format.as_str() {
        "f16" => KvElem::F16,
        "f32" => KvElem::F32,
        "q8" => KvElem::Q8 { group: 32 },
        "q4" => KvElem::Q4 { group: 32 },
        other => anyhow::bail!("unknown --kv-format {other:?} (expected f16, f32, q8 or q4)"),
    };
    if let Some(t) = a.threads {
        engram_kernels::set_num_threads(t.max(1));
    }
    let caches: Vec<RingLike> = a.depths.iter().map(|&d| RingLike::new(elem, a.layers, d, a.turn_tokens)).collect();
    let q = random_f32(a.queries * HEADS * HEAD_DIM, 7);
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); caches.len()];
    for rep in 0..a.reps + 1 {
        for (i, c) in caches.iter().enumerate() {
            let t = Instant::now();
            std::hint::black_box(step(c, &q, a.queries, a.layers));
            if rep > 0 {
                times[i].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    if !a.json {
        println!(
            "attention only: {} layers, {KV_HEADS} KV heads x {HEAD_DIM} dims, {HEADS} query heads, {} query token(s), {} KV, {} threads",
            a.layers,
            a.queries,
            a.kv_format,
            engram_kernels::num_threads()
        );
        println!("| depth (tokens) | chunks per head | ms per step | KV read (MiB) | GB/s | vs first depth |");
        println!("|---|---|---|---|---|---|");
    }
    let base = median(&mut times[0].clone());
    for (c, t) in caches.iter().zip(&mut times) {
        let ms = median(t);
        let bytes = c.bytes_per_step();
        let gbs = bytes as f64 / (ms * 1e-3) / 1e9;
        if a.json {
            println!(
                "{}",
                serde_json::json!({"depth": c.depth, "chunks_per_head": c.chunks[0].len(), "ms_per_step": ms, "kv_mib": bytes as f64 / (1 << 20) as f64, "gb_s": gbs, "ratio": ms / base, "queries": a.queries, "kv_format": a.kv_format, "threads": engram_kernels::num_threads()})
            );
        } else {
            println!(
                "| {} | {} | {ms:.3} | {:.1} | {gbs:.1} | {:.2}x |",
                c.depth,
                c.chunks[0].len(),
                bytes as f64 / (1 << 20) as f64,
                ms / base
            );
        }
    }
    Ok(())
}

/// One step's attention over every layer: the forward pass's tasks, one per KV head, on the
/// kernel pool.
fn step(c: &RingLike, q: &[f32], queries: usize, layers: usize) -> f32 {
    let positions: Vec<u32> = (0..queries).map(|i| (c.next_pos + i) as u32).collect();
    let mut sum = 0.0;
    for layer in 0..layers {
        let tasks: Vec<AttnTask<'_>> = (0..KV_HEADS)
            .map(|g| AttnTask {
                kv: c,
                layer,
                q,
                num_queries: queries,
                positions: &positions,
                key_mask: None,
                kv_head: g,
                group: HEADS / KV_HEADS,
                head_dim: HEAD_DIM,
                num_heads: HEADS,
                precision: AttentionPrecision::Exact,
            })
            .collect();
        let outs: Vec<Vec<f32>> = engram_kernels::pool().install(|| tasks.par_iter().map(attend).collect());
        sum += outs.iter().map(|o| o[0]).sum::<f32>();
    }
    sum
}

/// A cache laid out as the dual-stream ring keeps turns: per layer, blocks of [`BLOCK`] rows per
/// KV head, each turn starting a fresh block, its tokens at explicit positions.
struct RingLike {
    depth: usize,
    next_pos: usize,
    elem: KvElem,
    /// Per layer, its chunks in view order.
    chunks: Vec<Vec<Chunk>>,
}

struct Chunk {
    key_index: usize,
    positions: Option<Vec<u32>>,
    first_pos: usize,
    len: usize,
    keys: Vec<u8>,
    values: Vec<u8>,
}

impl RingLike {
    fn new(elem: KvElem, layers: usize, depth: usize, turn_tokens: usize) -> RingLike {
        // Chunk lengths: turns cut into blocks, or full blocks.
        let mut lens = Vec::new();
        let mut left = depth;
        while left > 0 {
            let turn = if turn_tokens == 0 { left } else { turn_tokens.min(left) };
            let mut t = turn;
            while t > 0 {
                lens.push(t.min(BLOCK));
                t -= t.min(BLOCK);
            }
            left -= turn;
        }
        let rb = elem.row_bytes(HEAD_DIM);
        let mut chunks = Vec::new();
        let mut seed = 11u64;
        for _ in 0..layers {
            let mut layer_chunks = Vec::new();
            let mut pos = 0;
            for &len in &lens {
                let mut kv = [Vec::new(), Vec::new()];
                for part in &mut kv {
                    let mut bytes = vec![0u8; KV_HEADS * BLOCK * rb];
                    for row in 0..KV_HEADS * BLOCK {
                        seed += 1;
                        elem.encode_row(&random_f32(HEAD_DIM, seed), &mut bytes[row * rb..(row + 1) * rb]);
                    }
                    *part = bytes;
                }
                let [keys, values] = kv;
                let positions = (turn_tokens > 0).then(|| (pos as u32..(pos + len) as u32).collect());
                layer_chunks.push(Chunk { key_index: pos, positions, first_pos: pos, len, keys, values });
                pos += len;
            }
            chunks.push(layer_chunks);
        }
        RingLike { depth, next_pos: depth, elem, chunks }
    }

    /// Key and value bytes one step reads (every layer, every head, valid rows only).
    fn bytes_per_step(&self) -> usize {
        self.chunks.iter().flatten().map(|c| 2 * KV_HEADS * c.len * self.elem.row_bytes(HEAD_DIM)).sum()
    }
}

impl KvCache for RingLike {
    fn write(&mut self, _: usize, _: usize, _: &[f32], _: &[f32], _: usize) {
        unreachable!("the bench cache is read-only")
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let chunks = &self.chunks[layer];
        for (i, c) in chunks.iter().enumerate() {
            // As the ring's view does: the block 8 spans on, for attention to prefetch.
            let ahead = chunks.get(i + 8).map(|a| (&a.keys[..], &a.values[..]));
            f(&KvChunk {
                first_pos: c.first_pos,
                positions: c.positions.as_deref(),
                key_index: c.key_index,
                len: c.len,
                capacity: BLOCK,
                keys: KvData { elem: self.elem, bytes: &c.keys },
                values: KvData { elem: self.elem, bytes: &c.values },
                mask: None,
                ahead,
            });
        }
    }
}

fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
