//! Causal attention of a step's queries over a sequence's cached keys and
//! values, read chunk by chunk from the KV store (flash-attention-style
//! online softmax), so the cache is never gathered or expanded in full.
//!
//! Invariant: the result for a query depends only on the set of visible
//! cached tokens and their chunking, not on how many other queries share the
//! step, so prefilling in one chunk, several, or token by token agrees.

use crate::kv::{KvCache, KvData, KvElem};
use crate::ops::{axpy, dot};

/// What one attention task computes: the queries of one sequence for one KV head group.
pub struct AttnTask<'a> {
    pub kv: &'a dyn KvCache,
    pub layer: usize,
    /// Queries `[num_queries, num_heads * head_dim]` (already rotated).
    pub q: &'a [f32],
    pub num_queries: usize,
    /// Position of the first query; query `t` sits at `first_pos + t`.
    pub first_pos: usize,
    pub kv_head: usize,
    pub group: usize,
    pub head_dim: usize,
    pub num_heads: usize,
}

/// Returns `[num_queries, group, head_dim]` attention outputs for the task's heads.
pub fn attend(t: &AttnTask<'_>) -> Vec<f32> {
    let hd = t.head_dim;
    let rows = t.num_queries * t.group;
    let scale = 1.0 / (hd as f32).sqrt();
    // Queries of this KV head's group, pre-scaled, gathered contiguously: row r = (query, head-in-group).
    let q_width = t.num_heads * hd;
    let mut q = vec![0.0f32; rows * hd];
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
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    let mut acc = vec![0.0f32; rows * hd];
    let mut kbuf: Vec<f32> = Vec::new();
    let mut vbuf: Vec<f32> = Vec::new();
    let mut scores: Vec<f32> = Vec::new();
    t.kv.for_each_chunk(t.layer, &mut |chunk| {
        let n = chunk.len;
        let last_pos = t.first_pos + t.num_queries - 1;
        if n == 0 || chunk.first_pos > last_pos {
            return;
        }
        let keys = view(chunk.keys, t.kv_head * chunk.capacity, n, hd, &mut kbuf);
        let values = view(chunk.values, t.kv_head * chunk.capacity, n, hd, &mut vbuf);
        scores.resize(n, 0.0);
        for qi in 0..t.num_queries {
            let qpos = t.first_pos + qi;
            if qpos < chunk.first_pos {
                continue;
            }
            let visible = (qpos - chunk.first_pos + 1).min(n);
            for j in 0..t.group {
                let r = qi * t.group + j;
                let qr = &q[r * hd..(r + 1) * hd];
                let mut mx = f32::NEG_INFINITY;
                for (i, s) in scores[..visible].iter_mut().enumerate() {
                    *s = dot(qr, &keys[i * hd..(i + 1) * hd]);
                }
                if let Some(mask) = chunk.mask {
                    for (s, &keep) in scores[..visible].iter_mut().zip(mask) {
                        if !keep {
                            *s = f32::NEG_INFINITY;
                        }
                    }
                }
                for &s in &scores[..visible] {
                    mx = mx.max(s);
                }
                if mx == f32::NEG_INFINITY {
                    continue;
                }
                let m_new = m[r].max(mx);
                let corr = (m[r] - m_new).exp();
                let a = &mut acc[r * hd..(r + 1) * hd];
                if corr != 1.0 {
                    l[r] *= corr;
                    a.iter_mut().for_each(|x| *x *= corr);
                }
                let mut sum = 0.0;
                for (i, s) in scores[..visible].iter().enumerate() {
                    let p = (s - m_new).exp();
                    sum += p;
                    axpy(a, p, &values[i * hd..(i + 1) * hd]);
                }
                l[r] += sum;
                m[r] = m_new;
            }
        }
    });
    for r in 0..rows {
        let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
        acc[r * hd..(r + 1) * hd].iter_mut().for_each(|x| *x *= inv);
    }
    acc
}

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
