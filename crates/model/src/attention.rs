//! Causal attention of a step's queries over a sequence's cached keys and
//! values, read chunk by chunk from the KV store (flash-attention-style
//! online softmax), so the cache is never gathered or expanded in full.
//!
//! Invariant: the result for a query depends only on the set of visible
//! cached tokens and their chunking, not on how many other queries share the
//! step, so prefilling in one chunk, several, or token by token agrees.
//! Visibility is the view contract (`view.rs`): per-key positions, chunk
//! masks and the step's per-row [`KeyMask`], and the layer's geometry
//! ([`LayerAttention`]): a sliding layer hides keys whose position is `window`
//! or more before the query's, judged by positions, never by slots.
//!
//! A layer with attention sinks (GPT-OSS) adds one learned logit per query head to every
//! softmax's denominator, with no value: `out = Σ e^(s_i - M) v_i / (Σ e^(s_i - M) + e^(sink - M))`.
//! It joins once, after the last chunk, so it is the same whatever the chunking, the KV
//! format or the view; a row that sees no key gives zeros, as without a sink.

use crate::config::LayerAttention;
use crate::kv::{KvCache, KvChunk, KvData, KvElem};
use crate::view::{KeyMask, KvRead};

/// What one attention task computes: the queries of one sequence for one KV head group.
pub struct AttnTask<'a> {
    pub kv: &'a dyn KvCache,
    pub layer: usize,
    /// Queries `[num_queries, num_heads * head_dim]` (already rotated).
    pub q: &'a [f32],
    pub num_queries: usize,
    /// Position of each query token (`num_queries` entries; any order, repeats allowed).
    pub positions: &'a [u32],
    /// Which view keys each query token may see; `None`: all (causality still applies).
    pub key_mask: Option<&'a KeyMask>,
    pub kv_head: usize,
    pub group: usize,
    pub head_dim: usize,
    pub num_heads: usize,
    /// The tile path's precision (the portable path is always f32).
    pub precision: crate::AttentionPrecision,
}

/// How a layer's attention scores: the factor on `q·k` and which positions a query sees.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerScoring<'a> {
    /// Factor on `q·k` (`1/√head_dim` for most models).
    pub scale: f32,
    /// Global, or a sliding window over positions.
    pub geometry: LayerAttention,
    /// Softcapping of the scaled scores (`cap · tanh(s / cap)`, Gemma 2), before any mask.
    pub softcap: Option<f32>,
    /// A sink logit per query head (`num_heads` entries, compared with the scaled scores),
    /// joining the softmax's denominator (GPT-OSS); `None`: no sinks.
    pub sinks: Option<&'a [f32]>,
}

impl LayerScoring<'static> {
    /// A global layer scaled by `1/√head_dim`.
    pub fn global(head_dim: usize) -> LayerScoring<'static> {
        LayerScoring { scale: 1.0 / (head_dim as f32).sqrt(), geometry: LayerAttention::Global, softcap: None, sinks: None }
    }
}

/// Returns `[num_queries, group, head_dim]` attention outputs for the task's heads.
///
/// Runs on AMX-BF16 tiles ([`engram_kernels::flash`]) where the CPU has them and the head
/// dimension is a multiple of 16, else the portable f32 path; both read the cache one chunk at a
/// time and agree to ~1e-5 (tested below). `ENGRAM_ATTENTION=portable` forces the portable path
/// (read once per process; for measuring one against the other).
pub fn attend(t: &AttnTask<'_>) -> Vec<f32> {
    attend_layer(t, LayerScoring::global(t.head_dim))
}

/// [`attend`] for a layer with its own scale and geometry (a sliding window hides keys
/// `window` or more positions before the query, on both paths). Softcapped scores and sinks
/// run on the portable path (the tile kernel keeps its scores and its running sums in tiles).
pub fn attend_layer(t: &AttnTask<'_>, l: LayerScoring<'_>) -> Vec<f32> {
    if l.softcap.is_none() && l.sinks.is_none() && tiles_enabled() && engram_kernels::flash::supported(t.head_dim) {
        attend_tiles(t, l)
    } else {
        attend_portable(t, l)
    }
}

fn tiles_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("ENGRAM_ATTENTION").map_or(true, |v| v != "portable"))
}

/// The task's query rows for its KV head, pre-scaled by the task's scale, gathered contiguously:
/// row `r = query * group + head_in_group`.
fn gather_queries(t: &AttnTask<'_>, scale: f32) -> Vec<f32> {
    let hd = t.head_dim;
    let q_width = t.num_heads * hd;
    let mut q = vec![0.0f32; t.num_queries * t.group * hd];
    for qi in 0..t.num_queries {
        for j in 0..t.group {
            let head = t.kv_head * t.group + j;
            let src = &t.q[qi * q_width + head * hd..qi * q_width + (head + 1) * hd];
            let dst = &mut q[(qi * t.group + j) * hd..(qi * t.group + j + 1) * hd];
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s * scale;
            }
        }
    }
    q
}

/// The tile path: each chunk's keys and values are handed to [`engram_kernels::flash::Flash`],
/// which keeps the online softmax per row — as stored where it can pack the format into tiles
/// itself (f16, Q8_0, Q4_0), else decoded to f32 first, one chunk at a time.
///
/// Long contexts are read from RAM, 32 tokens of one head at a time (8 KiB of f16 keys and
/// values per head and block, a whole block's stride apart), which the hardware prefetcher
/// barely follows; so the rows of the chunk the cache names as [`KvChunk::ahead`] are queued
/// with [`engram_kernels::flash::Flash::prefetch`], which issues them into L2 a few lines per
/// row block while this chunk is attended, and they arrive before they are needed.
fn attend_tiles(t: &AttnTask<'_>, l: LayerScoring<'_>) -> Vec<f32> {
    use engram_kernels::flash::{KeyVisibility, Rows, CHUNK};
    let hd = t.head_dim;
    let rows = t.num_queries * t.group;
    let q = gather_queries(t, l.scale);
    let row_pos: Vec<u32> = (0..rows).map(|r| t.positions[r / t.group]).collect();
    let mut flash = engram_kernels::flash::Flash::with_positions(&q, hd, &row_pos, t.precision);
    let (mut kf, mut vf) = (Vec::new(), Vec::new());
    let last_pos = t.positions.iter().copied().max().unwrap_or(0) as usize;
    let first_pos = t.positions.iter().copied().min().unwrap_or(0) as usize;
    let window = l.geometry.window();
    let mut row_mask = Vec::new();
    t.kv.for_each_chunk_of(&read(t, &q), &mut |chunk| {
        if chunk.len == 0 || lowest_position(chunk) > last_pos || outside_every_window(chunk, window, first_pos) {
            return;
        }
        if let Some((k, v)) = chunk.ahead {
            for (bytes, elem) in [(k, chunk.keys.elem), (v, chunk.values.elem)] {
                let rb = elem.row_bytes(hd);
                let row0 = t.kv_head * chunk.capacity;
                flash.prefetch(&bytes[row0 * rb..(row0 + chunk.capacity) * rb]);
            }
        }
        let elem = chunk.keys.elem;
        let packed = elem == chunk.values.elem && matches!(elem, KvElem::F16 | KvElem::Q8 { group: 32 } | KvElem::Q4 { group: 32 });
        let mut start = 0;
        while start < chunk.len {
            let n = (chunk.len - start).min(CHUNK);
            let row0 = t.kv_head * chunk.capacity + start;
            let mut vis = KeyVisibility {
                pos0: chunk.first_pos + start,
                positions: chunk.positions.map(|p| &p[start..start + n]),
                mask: chunk.mask.map(|m| &m[start..start + n]),
                row_mask: None,
            };
            // A sliding window is a per-row mask, needed only where some key may be too old for some row.
            let window = window.filter(|&w| vis.span(n).0 + w <= last_pos);
            if t.key_mask.is_some() || window.is_some() {
                tile_row_mask(t.key_mask, window, &vis, &row_pos, t.group, chunk.key_index + start, n, &mut row_mask);
                vis.row_mask = Some(&row_mask[..]);
            }
            if packed {
                let rb = elem.row_bytes(hd);
                let (k, v) = (&chunk.keys.bytes[row0 * rb..(row0 + n) * rb], &chunk.values.bytes[row0 * rb..(row0 + n) * rb]);
                match elem {
                    KvElem::F16 => flash.add_visible(Rows::F16(k), Rows::F16(v), n, &vis),
                    KvElem::Q8 { .. } => flash.add_visible(Rows::Q8_0(k), Rows::Q8_0(v), n, &vis),
                    _ => flash.add_visible(Rows::Q4_0(k), Rows::Q4_0(v), n, &vis),
                }
            } else {
                let k = view(chunk.keys, row0, n, hd, &mut kf);
                let v = view(chunk.values, row0, n, hd, &mut vf);
                flash.add_visible(Rows::F32(k), Rows::F32(v), n, &vis);
            }
            start += n;
        }
    });
    let mut out = vec![0.0f32; rows * hd];
    flash.finish(&mut out);
    out
}

/// The request a task makes of its cache (`view.rs`).
fn read<'a>(t: &'a AttnTask<'_>, q: &'a [f32]) -> KvRead<'a> {
    KvRead { layer: t.layer, kv_head: t.kv_head, queries: q, group: t.group, positions: t.positions }
}

/// The lowest position of a chunk's keys.
fn lowest_position(c: &KvChunk<'_>) -> usize {
    c.positions.map_or(c.first_pos, |p| p[..c.len].iter().copied().min().unwrap_or(u32::MAX) as usize)
}

/// Whether every key of a chunk is too old for every query of a sliding layer (the earliest
/// query at `first_query` included), so the chunk can be skipped whole.
fn outside_every_window(c: &KvChunk<'_>, window: Option<usize>, first_query: usize) -> bool {
    let highest = c.positions.map_or(c.first_pos + c.len.saturating_sub(1), |p| p[..c.len].iter().copied().max().unwrap_or(0) as usize);
    window.is_some_and(|w| highest + w <= first_query)
}

/// The tile kernel's per-row mask for keys `key0 .. key0 + n` of the view: bit `r % 16` of
/// `out[(r / 16) * CHUNK + i]` is query row `r`'s (token `r / group`, at `row_pos[r]`) bit for
/// key `key0 + i`: set when the step's mask lets the token see the key and, in a sliding layer,
/// the key's position is within the window (`row_pos[r] < position + window`; keys after the
/// row the kernel hides by causality).
#[allow(clippy::too_many_arguments)]
fn tile_row_mask(
    mask: Option<&KeyMask>,
    window: Option<usize>,
    vis: &engram_kernels::flash::KeyVisibility<'_>,
    row_pos: &[u32],
    group: usize,
    key0: usize,
    n: usize,
    out: &mut Vec<u16>,
) {
    use engram_kernels::flash::CHUNK;
    let rows = row_pos.len();
    out.clear();
    out.resize(rows.div_ceil(16) * CHUNK, 0);
    for r in 0..rows {
        for i in 0..n {
            let in_window = window.is_none_or(|w| (row_pos[r] as usize) < vis.position(i) + w);
            if in_window && mask.is_none_or(|m| m.sees(r / group, key0 + i)) {
                out[r / 16 * CHUNK + i] |= 1 << (r % 16);
            }
        }
    }
}

/// The portable path (any CPU, any head dimension).
///
/// Per chunk: keys and values are decoded once to f32 rows (L1-sized), then each query row
/// runs [`engram_kernels::attn_rows`]: its scores against the chunk's keys, the online-softmax
/// step, and its share of the values — AVX2 + FMA where the CPU has them. A row's arithmetic
/// never involves another row's, so the result of a query does not depend on how many other
/// queries share the step (chunked prefill = one-shot = token by token, bitwise).
fn attend_portable(t: &AttnTask<'_>, scoring: LayerScoring<'_>) -> Vec<f32> {
    use engram_kernels::attn_rows;
    let hd = t.head_dim;
    let rows = t.num_queries * t.group;
    let q = gather_queries(t, scoring.scale);
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    let mut acc = vec![0.0f32; rows * hd];
    let mut kbuf: Vec<f32> = Vec::new();
    let mut vbuf: Vec<f32> = Vec::new();
    let mut scores: Vec<f32> = Vec::new();
    let last_pos = t.positions.iter().copied().max().unwrap_or(0) as usize;
    let first_pos = t.positions.iter().copied().min().unwrap_or(0) as usize;
    let window = scoring.geometry.window();
    t.kv.for_each_chunk_of(&read(t, &q), &mut |chunk| {
        let n = chunk.len;
        if n == 0 || lowest_position(chunk) > last_pos || outside_every_window(chunk, window, first_pos) {
            return;
        }
        let row0 = t.kv_head * chunk.capacity;
        if let Some((k, v)) = chunk.ahead {
            for (bytes, elem) in [(k, chunk.keys.elem), (v, chunk.values.elem)] {
                let rb = elem.row_bytes(hd);
                attn_rows::prefetch(&bytes[row0 * rb..(row0 + chunk.capacity) * rb]);
            }
        }
        let keys = view(chunk.keys, row0, n, hd, &mut kbuf);
        let values = view(chunk.values, row0, n, hd, &mut vbuf);
        scores.resize(n, 0.0);
        for qi in 0..t.num_queries {
            let qpos = t.positions[qi] as usize;
            // Keys past `visible` are hidden from this query (causal, in a contiguous chunk;
            // with explicit positions or a row mask, key by key below).
            let visible = match chunk.positions {
                None if qpos < chunk.first_pos => continue,
                None => (qpos - chunk.first_pos + 1).min(n),
                Some(_) => n,
            };
            for j in 0..t.group {
                let r = qi * t.group + j;
                let s = &mut scores[..visible];
                attn_rows::scores(&q[r * hd..(r + 1) * hd], keys, hd, s);
                if let Some(cap) = scoring.softcap {
                    s.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
                }
                if let Some(mask) = chunk.mask {
                    for (x, &keep) in s.iter_mut().zip(mask) {
                        if !keep {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
                if let Some(pos) = chunk.positions {
                    for (x, &p) in s.iter_mut().zip(pos) {
                        if p as usize > qpos {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
                if let Some(w) = window {
                    // Keys at positions `<= qpos - w` are outside the window.
                    for (i, x) in s.iter_mut().enumerate() {
                        let kpos = chunk.positions.map_or(chunk.first_pos + i, |p| p[i] as usize);
                        if kpos + w <= qpos {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
                if let Some(mask) = t.key_mask {
                    for (i, x) in s.iter_mut().enumerate() {
                        if !mask.sees(qi, chunk.key_index + i) {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
                let mx = attn_rows::max(s);
                if mx == f32::NEG_INFINITY {
                    continue;
                }
                let m_new = m[r].max(mx);
                let corr = exp_approx(m[r] - m_new);
                let a = &mut acc[r * hd..(r + 1) * hd];
                if corr != 1.0 {
                    l[r] *= corr;
                    a.iter_mut().for_each(|x| *x *= corr);
                }
                l[r] += attn_rows::exp_shifted(s, m_new);
                attn_rows::accumulate(a, s, values, hd);
                m[r] = m_new;
            }
        }
    });
    for r in 0..rows {
        let inv = match scoring.sinks {
            // The sink joins the denominator against the row's running max: with
            // `M = max(m, sink)`, out = acc·e^(m-M) / (l·e^(m-M) + e^(sink-M)).
            Some(sinks) if l[r] > 0.0 => {
                let sink = sinks[t.kv_head * t.group + r % t.group];
                let top = m[r].max(sink);
                let kept = (m[r] - top).exp();
                kept / (l[r] * kept + (sink - top).exp())
            }
            _ if l[r] > 0.0 => 1.0 / l[r],
            _ => 0.0,
        };
        acc[r * hd..(r + 1) * hd].iter_mut().for_each(|x| *x *= inv);
    }
    acc
}

/// `e^x` for `x <= 0` (softmax arguments): [`engram_kernels::attn_rows::exp_approx`], whose
/// polynomial the AVX2 and AVX-512 paths evaluate lane by lane.
pub use engram_kernels::attn_rows::exp_approx;

/// Decodes rows `first_row .. first_row + n` into `buf` (one chunk at a
/// time, so the cache is never expanded in full). A head's rows are
/// contiguous, so ggml-layout formats decode in one call. f32 rows are
/// decoded too: mapped bytes carry no alignment guarantee, and the copy is
/// L1-sized.
fn view<'a>(data: KvData<'_>, first_row: usize, n: usize, hd: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
    let rb = data.elem.row_bytes(hd);
    buf.resize(n * hd, 0.0);
    let src = &data.bytes[first_row * rb..(first_row + n) * rb];
    match data.elem {
        KvElem::F32 | KvElem::F16 | KvElem::Q8 { group: 32 } | KvElem::Q4 { group: 32 } => data.elem.decode_row(src, buf),
        _ => {
            for (row, out) in src.chunks_exact(rb).zip(buf.chunks_exact_mut(hd)) {
                data.elem.decode_row(row, out);
            }
        }
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AttentionPrecision;

    /// A one-layer cache of 32-token chunks (the last one partial), keys/values encoded in `elem`.
    struct ChunkedKv {
        elem: KvElem,
        chunks: Vec<TestChunk>,
        /// Explicit positions per chunk (moved spans); `None`: `first_pos ..`.
        positions: Vec<Option<Vec<u32>>>,
    }

    /// First position, length, key bytes, value bytes, mask.
    type TestChunk = (usize, usize, Vec<u8>, Vec<u8>, Option<Vec<bool>>);

    impl ChunkedKv {
        fn new(elem: KvElem, heads: usize, hd: usize, tokens: usize, seed: u64, masked: bool) -> Self {
            let mut x = seed;
            let mut rnd = move || {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            };
            let rb = elem.row_bytes(hd);
            let mut chunks = Vec::new();
            let mut pos = 0;
            while pos < tokens {
                let len = (tokens - pos).min(32);
                let (mut k, mut v) = (vec![0u8; heads * 32 * rb], vec![0u8; heads * 32 * rb]);
                for row in 0..heads * 32 {
                    let kr: Vec<f32> = (0..hd).map(|_| rnd()).collect();
                    let vr: Vec<f32> = (0..hd).map(|_| rnd()).collect();
                    elem.encode_row(&kr, &mut k[row * rb..(row + 1) * rb]);
                    elem.encode_row(&vr, &mut v[row * rb..(row + 1) * rb]);
                }
                let mask = masked.then(|| (0..32).map(|i| (pos + i) % 7 != 3).collect());
                chunks.push((pos, len, k, v, mask));
                pos += len;
            }
            let positions = vec![None; chunks.len()];
            ChunkedKv { elem, chunks, positions }
        }

        /// The same keys moved: chunk `c`'s keys at positions `first_pos + 5c + (len - 1 - i)`
        /// (gaps between chunks, each chunk's order reversed), so positions differ from slots.
        fn moved(mut self) -> Self {
            self.positions = self
                .chunks
                .iter()
                .enumerate()
                .map(|(c, (first, len, ..))| Some((0..*len).map(|i| (first + 5 * c + (len - 1 - i)) as u32).collect()))
                .collect();
            self
        }

        /// Every key as (position, key row, value row, chunk-mask bit) for KV head `head`.
        fn keys(&self, head: usize, hd: usize) -> Vec<(usize, Vec<f32>, Vec<f32>, bool)> {
            let rb = self.elem.row_bytes(hd);
            let mut out = Vec::new();
            for ((first, len, k, v, mask), pos) in self.chunks.iter().zip(&self.positions) {
                for i in 0..*len {
                    let row = head * 32 + i;
                    let (mut kr, mut vr) = (vec![0.0; hd], vec![0.0; hd]);
                    self.elem.decode_row(&k[row * rb..(row + 1) * rb], &mut kr);
                    self.elem.decode_row(&v[row * rb..(row + 1) * rb], &mut vr);
                    let p = pos.as_ref().map_or(first + i, |p| p[i] as usize);
                    out.push((p, kr, vr, mask.as_ref().is_none_or(|m| m[i])));
                }
            }
            out
        }
    }

    impl KvCache for ChunkedKv {
        fn write(&mut self, _: usize, _: usize, _: &[f32], _: &[f32], _: usize) {
            unreachable!("read-only test cache")
        }
        fn for_each_chunk(&self, _layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
            for ((first_pos, len, k, v, mask), pos) in self.chunks.iter().zip(&self.positions) {
                f(&KvChunk {
                    first_pos: *first_pos,
                    positions: pos.as_deref(),
                    key_index: *first_pos,
                    len: *len,
                    capacity: 32,
                    keys: KvData { elem: self.elem, bytes: k },
                    values: KvData { elem: self.elem, bytes: v },
                    mask: mask.as_deref(),
                    ahead: None,
                });
            }
        }
    }

    fn queries(n: usize, width: usize, seed: u64) -> Vec<f32> {
        (0..n * width).map(|i| (((i as u64 * 2654435761 + seed) % 1000) as f32 / 500.0 - 1.0) * 3.0).collect()
    }

    #[test]
    fn tile_path_agrees_with_the_portable_path() {
        if !engram_kernels::flash::supported(16) {
            eprintln!("no AMX-BF16 here: tile path not tested");
            return;
        }
        for (hd, group, heads_kv, tokens, nq, masked, elem) in [
            (16, 2, 2, 70, 5, false, KvElem::F32),
            (64, 4, 2, 300, 40, false, KvElem::F16),
            (64, 4, 1, 97, 1, true, KvElem::F16),
            (128, 1, 1, 64, 17, false, KvElem::F32),
            (48, 3, 1, 45, 45, true, KvElem::F32),
            (64, 4, 1, 200, 3, false, KvElem::Q8 { group: 32 }),
            (64, 2, 1, 100, 9, false, KvElem::Q4 { group: 32 }),
        ] {
            let kv = ChunkedKv::new(elem, heads_kv, hd, tokens, hd as u64 + tokens as u64, masked);
            let num_heads = heads_kv * group;
            let q = queries(nq, num_heads * hd, tokens as u64);
            let positions: Vec<u32> = (tokens - nq..tokens).map(|p| p as u32).collect();
            for (kv_head, precision) in (0..heads_kv).flat_map(|h| [(h, AttentionPrecision::Exact), (h, AttentionPrecision::Bf16)]) {
                let task = AttnTask {
                    kv: &kv,
                    layer: 0,
                    q: &q,
                    num_queries: nq,
                    positions: &positions,
                    key_mask: None,
                    kv_head,
                    group,
                    head_dim: hd,
                    num_heads,
                    precision,
                };
                let (a, b) = (attend_tiles(&task, LayerScoring::global(hd)), attend_portable(&task, LayerScoring::global(hd)));
                let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                let err = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / amax;
                // Exact: ~1e-5 of f32. Bf16: operands rounded to 8 significant bits.
                let tolerance = if precision == AttentionPrecision::Exact { 2e-5 } else { 1e-2 };
                assert!(err < tolerance, "{precision:?} hd {hd} group {group} tokens {tokens} queries {nq} {elem:?}: {err:e}");
                // Row independence: the last query alone gives bitwise the batch's last row.
                let width = num_heads * hd;
                let alone = AttnTask { q: &q[(nq - 1) * width..], num_queries: 1, positions: &positions[nq - 1..], ..task };
                let span = group * hd;
                assert_eq!(attend_tiles(&alone, LayerScoring::global(hd)), a[(nq - 1) * span..].to_vec(), "hd {hd}: alone != in batch");
            }
        }
    }

    #[test]
    fn the_portable_path_gives_a_query_alone_bitwise_its_batch_row() {
        for (hd, group, tokens, nq, masked, elem) in [
            (64, 4, 300, 40, false, KvElem::F16),
            (64, 4, 97, 7, true, KvElem::F16),
            (128, 2, 70, 5, false, KvElem::F32),
            (48, 3, 45, 45, true, KvElem::F32),
            (64, 4, 200, 3, false, KvElem::Q8 { group: 32 }),
            (64, 2, 100, 9, false, KvElem::Q4 { group: 32 }),
        ] {
            let kv = ChunkedKv::new(elem, 1, hd, tokens, hd as u64 + tokens as u64, masked);
            let width = group * hd;
            let q = queries(nq, width, tokens as u64);
            let positions: Vec<u32> = (tokens - nq..tokens).map(|p| p as u32).collect();
            let task = AttnTask {
                kv: &kv,
                layer: 0,
                q: &q,
                num_queries: nq,
                positions: &positions,
                key_mask: None,
                kv_head: 0,
                group,
                head_dim: hd,
                num_heads: group,
                precision: AttentionPrecision::Exact,
            };
            let batch = attend_portable(&task, LayerScoring::global(hd));
            for i in [0, nq / 2, nq - 1] {
                let alone = AttnTask { q: &q[i * width..(i + 1) * width], num_queries: 1, positions: &positions[i..i + 1], ..task };
                let row = attend_portable(&alone, LayerScoring::global(hd));
                assert!(
                    row.iter().zip(&batch[i * width..(i + 1) * width]).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "hd {hd} {elem:?}: query {i} alone != in batch"
                );
            }
        }
    }

    /// A plain scalar attention in f64 over the cache's keys: the view contract spelled out
    /// (causal by position, chunk mask, step mask, sliding window), one row at a time.
    fn reference(t: &AttnTask<'_>, kv: &ChunkedKv, scoring: LayerScoring<'_>) -> Vec<f32> {
        let hd = t.head_dim;
        let keys = kv.keys(t.kv_head, hd);
        let mut out = vec![0.0f32; t.num_queries * t.group * hd];
        for qi in 0..t.num_queries {
            let qpos = t.positions[qi] as usize;
            for j in 0..t.group {
                let head = t.kv_head * t.group + j;
                let q = &t.q[qi * t.num_heads * hd + head * hd..][..hd];
                let mut scores: Vec<(f64, &[f32])> = Vec::new();
                for (key, (p, kr, vr, on)) in keys.iter().enumerate() {
                    let seen = *on && scoring.geometry.sees(qpos, *p) && t.key_mask.is_none_or(|m| m.sees(qi, key));
                    if seen {
                        let mut s: f64 = q.iter().zip(kr).map(|(&a, &b)| (a * scoring.scale) as f64 * b as f64).sum();
                        if let Some(cap) = scoring.softcap {
                            s = cap as f64 * (s / cap as f64).tanh();
                        }
                        scores.push((s, vr));
                    }
                }
                let sink = scoring.sinks.map(|s| s[head] as f64);
                let mx = scores.iter().fold(sink.unwrap_or(f64::NEG_INFINITY), |m, s| m.max(s.0));
                let sum: f64 = scores.iter().map(|s| (s.0 - mx).exp()).sum::<f64>() + sink.map_or(0.0, |s| (s - mx).exp());
                let o = &mut out[(qi * t.group + j) * hd..][..hd];
                for (s, vr) in &scores {
                    let w = (s - mx).exp() / sum;
                    for (x, &v) in o.iter_mut().zip(*vr) {
                        *x += (w * v as f64) as f32;
                    }
                }
            }
        }
        out
    }

    /// A sliding layer through both kernel paths (the SIMD portable path and, where the CPU
    /// has AMX, the tile path) against the scalar reference: every KV format, contiguous and
    /// moved positions, chunk masks, a step mask, query scales other than `1/√head_dim`, and
    /// windows smaller than, across and larger than a chunk.
    #[test]
    fn a_sliding_window_hides_keys_by_position_on_every_path() {
        for (hd, group, tokens, nq, masked, moved, window, elem) in [
            (64, 4, 300, 40, false, false, 16, KvElem::F16),
            (64, 2, 97, 7, true, false, 1, KvElem::F32),
            (32, 2, 130, 130, false, true, 40, KvElem::F32),
            (64, 4, 200, 3, false, true, 33, KvElem::Q8 { group: 32 }),
            (64, 2, 100, 9, true, true, 64, KvElem::Q4 { group: 32 }),
            (48, 3, 45, 45, false, false, 500, KvElem::F16),
        ] {
            let mut kv = ChunkedKv::new(elem, 1, hd, tokens, hd as u64 * 7 + tokens as u64, masked);
            if moved {
                kv = kv.moved();
            }
            let width = group * hd;
            let q = queries(nq, width, tokens as u64 + 1);
            let top = kv.keys(0, hd).iter().map(|k| k.0).max().unwrap();
            let positions: Vec<u32> = (top + 1 - nq..=top).map(|p| p as u32).collect();
            // Every third query token is also kept from every fifth key.
            let mut mask = KeyMask::all(nq, tokens);
            for r in (0..nq).step_by(3) {
                for key in (0..tokens).step_by(5) {
                    mask.set(r, key, false);
                }
            }
            for key_mask in [None, Some(&mask)] {
                let task = AttnTask {
                    kv: &kv,
                    layer: 0,
                    q: &q,
                    num_queries: nq,
                    positions: &positions,
                    key_mask,
                    kv_head: 0,
                    group,
                    head_dim: hd,
                    num_heads: group,
                    precision: AttentionPrecision::Exact,
                };
                let scoring = LayerScoring {
                    scale: 0.3 / (hd as f32).sqrt(),
                    geometry: LayerAttention::Sliding { window },
                    softcap: None,
                    sinks: None,
                };
                let want = reference(&task, &kv, scoring);
                let amax = want.iter().fold(0f32, |m, x| m.max(x.abs()));
                let what = format!("hd {hd} window {window} {elem:?} moved {moved} masked {masked} step mask {}", key_mask.is_some());
                let mut paths = vec![("portable", attend_portable(&task, scoring))];
                if engram_kernels::flash::supported(hd) {
                    paths.push(("tiles", attend_tiles(&task, scoring)));
                }
                for (path, got) in paths {
                    let err = got.iter().zip(&want).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / amax;
                    assert!(err < 2e-5, "{path} {what}: {err:e} from the scalar reference");
                }
                // Softcapped scores (Gemma 2's 50, and a cap of 2 that bites) on the portable path.
                for cap in [50.0, 2.0] {
                    let capped = LayerScoring { softcap: Some(cap), ..scoring };
                    let (got, want) = (attend_layer(&task, capped), reference(&task, &kv, capped));
                    let err = got.iter().zip(&want).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / amax;
                    assert!(err < 2e-5, "softcap {cap} {what}: {err:e} from the scalar reference");
                }
                // Sinks (GPT-OSS): below, near and above the scores, per head, with the window
                // and globally; they change the answer.
                let sinks: Vec<f32> = (0..group).map(|j| [-3.0, 0.5, 4.0][j % 3] + 0.25 * j as f32).collect();
                for geometry in [scoring.geometry, LayerAttention::Global] {
                    let sunk = LayerScoring { sinks: Some(&sinks), geometry, ..scoring };
                    let (got, want_sunk) = (attend_layer(&task, sunk), reference(&task, &kv, sunk));
                    let err = got.iter().zip(&want_sunk).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / amax;
                    assert!(err < 2e-5, "sinks {geometry:?} {what}: {err:e} from the scalar reference");
                }
                let sunk = attend_layer(&task, LayerScoring { sinks: Some(&sinks), ..scoring });
                let moved_by_sinks = sunk.iter().zip(&want).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / amax;
                assert!(moved_by_sinks > 1e-3, "{what}: sinks change nothing ({moved_by_sinks:e})");
                // The window matters: the same task as a global layer is another answer (unless
                // the window covers every key).
                let global = attend_portable(&task, LayerScoring { geometry: LayerAttention::Global, ..scoring });
                let diff = global.iter().zip(&want).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / amax;
                assert_eq!(diff > 1e-3, window < top, "{what}: global vs sliding differ by {diff:e}");
            }
        }
    }

    #[test]
    fn exp_approx_is_accurate_on_softmax_arguments() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (a, b) = (exp_approx(x) as f64, (x as f64).exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.001;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(exp_approx(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_approx(-100.0), 0.0);
        assert_eq!(exp_approx(0.0), 1.0);
    }
}
