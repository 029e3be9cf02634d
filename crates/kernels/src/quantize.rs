//! f32 → block conversion: the weight quantizers behind [`quantize`] (ggml reference
//! algorithms, so files we write load in llama.cpp) and the *activation* quantizers the
//! integer matmul paths use ([`ActQ8`], [`ActQ8K`]).
//!
//! Why activations are quantized: a quantized weight block is an integer vector times a scale.
//! If the activations are also "integer vector × scale", a block's dot product becomes one
//! integer dot product (a handful of `vpdpbusd`/`vpmaddubsw` instructions for 32–64 elements)
//! and one float multiply-add, instead of decoding every weight to f32 first. That is what
//! makes prefill compute-bound at integer throughput and lets decode run at memory bandwidth.
//! The cost is a relative activation error ≤ 1/254 of the block's max per element, which the
//! tests bound explicitly.
//!
//! Invariant: each activation row is quantized independently of every other row, so the result
//! for a token never depends on which other tokens share the call.

use crate::blocks::*;
use crate::dtype::{DType, KernelError};
use crate::quantize32::{iq4nl_block, iq4xs_block, mxfp4_block, q4_1_block, q5_0_block, q5_1_block};
use crate::quantize_k::{q2k_block, q3k_block, q5k_block};
use half::{bf16, f16};

/// ggml's `nearest_int`: round-half-to-even via the 1.5·2^23 trick (valid for |x| < 2^22).
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = (x + 12582912.0f32).to_bits() as i32;
    (v & 0x007f_ffff).wrapping_sub(0x0040_0000)
}

/// Quantizes `src` (`rows × cols` f32, row-major) to `dtype` blocks; returns `rows * row_bytes`
/// bytes. F32/F16/BF16 are plain conversions (round-to-nearest-even).
pub fn quantize(dtype: DType, src: &[f32], cols: usize) -> Result<Vec<u8>, KernelError> {
    let rb = dtype.row_bytes(cols).ok_or(KernelError::BadCols { dtype, cols, block: dtype.block_elems() })?;
    let rows = src.len().checked_div(cols).unwrap_or(0);
    if cols == 0 || src.len() % cols != 0 {
        return Err(KernelError::BadLength { dtype, rows, cols, expected: rows * cols, got: src.len() });
    }
    let mut out = vec![0u8; rows * rb];
    for (x, y) in src.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
        quantize_row_into(dtype, x, y);
    }
    Ok(out)
}

/// Quantizes one row (whole blocks) into `y` (exactly the row's bytes).
pub(crate) fn quantize_row_into(dtype: DType, x: &[f32], y: &mut [u8]) {
    match dtype {
        DType::F32 => {
            for (v, o) in x.iter().zip(y.chunks_exact_mut(4)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for (v, o) in x.iter().zip(y.chunks_exact_mut(2)) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        DType::BF16 => {
            for (v, o) in x.iter().zip(y.chunks_exact_mut(2)) {
                o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        DType::Q8_0 => x.chunks_exact(QK).zip(y.chunks_exact_mut(34)).for_each(|(x, b)| q8_0_block(x, b)),
        DType::Q4_0 => x.chunks_exact(QK).zip(y.chunks_exact_mut(18)).for_each(|(x, b)| q4_0_block(x, b)),
        DType::Q4K => x.chunks_exact(QK_K).zip(y.chunks_exact_mut(144)).for_each(|(x, b)| q4k_block(x, b)),
        DType::Q6K => x.chunks_exact(QK_K).zip(y.chunks_exact_mut(210)).for_each(|(x, b)| q6k_block(x, b)),
        DType::Q4_1 => x.chunks_exact(QK).zip(y.chunks_exact_mut(20)).for_each(|(x, b)| q4_1_block(x, b)),
        DType::Q5_0 => x.chunks_exact(QK).zip(y.chunks_exact_mut(22)).for_each(|(x, b)| q5_0_block(x, b)),
        DType::Q5_1 => x.chunks_exact(QK).zip(y.chunks_exact_mut(24)).for_each(|(x, b)| q5_1_block(x, b)),
        DType::IQ4NL => x.chunks_exact(QK).zip(y.chunks_exact_mut(18)).for_each(|(x, b)| iq4nl_block(x, b)),
        DType::MXFP4 => x.chunks_exact(QK).zip(y.chunks_exact_mut(17)).for_each(|(x, b)| mxfp4_block(x, b)),
        DType::Q2K => x.chunks_exact(QK_K).zip(y.chunks_exact_mut(84)).for_each(|(x, b)| q2k_block(x, b)),
        DType::Q3K => x.chunks_exact(QK_K).zip(y.chunks_exact_mut(110)).for_each(|(x, b)| q3k_block(x, b)),
        DType::Q5K => x.chunks_exact(QK_K).zip(y.chunks_exact_mut(176)).for_each(|(x, b)| q5k_block(x, b)),
        DType::IQ4XS => x.chunks_exact(QK_K).zip(y.chunks_exact_mut(136)).for_each(|(x, b)| iq4xs_block(x, b)),
        DType::IQ3XXS | DType::IQ3S => {
            x.chunks_exact(QK_K).zip(y.chunks_exact_mut(dtype.block_bytes())).for_each(|(x, b)| crate::quantize_iq3::iq3_block(dtype, x, b))
        }
    }
}

/// `quantize_row_q8_0_ref`: d = amax/127, q = round(x/d) (half away from zero) — the codes of
/// [`q8_block_scalar`], the scale stored as f16.
fn q8_0_block(x: &[f32], b: &mut [u8]) {
    let mut q = [0i8; QK];
    let (d, _) = q8_block_scalar(x, &mut q);
    put_f16(b, 0, d);
    for (o, q) in b[2..2 + QK].iter_mut().zip(q) {
        *o = q as u8;
    }
}

/// `quantize_row_q4_0_ref`: d = (signed value of max |x|) / −8, q = min(15, trunc(x/d + 8.5)).
fn q4_0_block(x: &[f32], b: &mut [u8]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    for j in 0..QK / 2 {
        let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = q0 | (q1 << 4);
    }
}

/// ggml's `make_qkx2_quants`: weighted least-squares search for (scale, min) of an
/// asymmetric `nmax`-level quantization (errors squared, or absolute with `use_mad`). Returns
/// (scale, −min) and fills `l`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants(
    x: &[f32],
    w: &[f32],
    nmax: i32,
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].iter_mut().for_each(|v| *v = 0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best += w[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let q = q as f32;
            sum_l += w[i] * q;
            sum_l2 += w[i] * q * q;
            sum_xl += w[i] * q * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur += w[i] * err(diff);
            }
            if cur < best {
                l[..n].copy_from_slice(&laux[..n]);
                best = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `quantize_row_q4_K_ref` for one 256-element super-block.
fn q4k_block(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut weights = [0f32; 32];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().map(|v| v * v).sum();
        let av_x = (sum_x2 / 32.0).sqrt();
        for i in 0..32 {
            weights[i] = av_x + xs[i].abs();
        }
        let (s, m) = make_qkx2_quants(xs, &weights, 15, &mut l[32 * j..32 * j + 32], -1.0, 0.1, 20, false);
        scales[j] = s;
        mins[j] = m;
        max_scale = max_scale.max(s);
        max_min = max_min.max(m);
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut b[Q4K_SCALES..Q4K_SCALES + 12];
    sc.iter_mut().for_each(|v| *v = 0);
    for j in 0..8 {
        let ls = nearest_int(inv_scale * scales[j]).min(63) as u8;
        let lm = nearest_int(inv_min * mins[j]).min(63) as u8;
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d = put_f16(b, 0, max_scale / 63.0);
    let dmin = put_f16(b, 2, max_min / 63.0);
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &b[Q4K_SCALES..]);
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / dl).clamp(0, 15) as u8;
        }
    }
    let qs = &mut b[Q4K_QS..Q4K_QS + 128];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
        }
    }
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights (w = x²):
/// symmetric quantization to [−nmax, nmax−1] with a small scale search. Fills `l` with
/// `q + nmax` and returns the scale.
fn make_qx_quants_rmse1(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        l.iter_mut().for_each(|v| *v = 0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..x.len() {
        let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (q + nmax) as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * q as f32;
        suml2 += w * (q * q) as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &xi in x {
            let q = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
            let w = xi * xi;
            sumlx += w * xi * q as f32;
            suml2 += w * (q * q) as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..x.len() {
                let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
                l[i] = (q + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `quantize_row_q6_K_ref` for one 256-element super-block.
fn q6k_block(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs) = (0f32, 0f32);
    for ib in 0..16 {
        let s = make_qx_quants_rmse1(&x[16 * ib..16 * ib + 16], 32, &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if s.abs() > max_abs {
            max_abs = s.abs();
            max_scale = s;
        }
    }
    b.iter_mut().for_each(|v| *v = 0);
    if max_abs < 1e-15 {
        return; // all-zero block, d = 0
    }
    let iscale = -128.0 / max_scale;
    let d = put_f16(b, Q6K_D, 1.0 / iscale);
    for ib in 0..16 {
        b[Q6K_SCALES + ib] = (nearest_int(iscale * scales[ib]).min(127) as i8) as u8;
    }
    for j in 0..16 {
        let dl = d * (b[Q6K_SCALES + j] as i8) as f32;
        if dl == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / dl).clamp(-32, 31) + 32) as i8;
        }
    }
    for h in 0..2 {
        let (lo, hi) = (128 * h, 64 * h);
        for i in 0..32 {
            let q = |k: usize| l[lo + i + 32 * k] as u8;
            b[hi + i] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
            b[hi + i + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
            b[Q6K_QH + 32 * h + i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Activation quantization
// ---------------------------------------------------------------------------------------------

/// Activations of `n` tokens quantized to Q8_0-style 32-element blocks, laid out for the
/// integer kernels of Q4_0 / Q8_0 weights.
///
/// Per block `b` (global index `t * blocks_per_row + i`): `qs[32b..32b+32]` are the i8 values,
/// `d[b]` the f32 scale (kept f32, more precise than ggml's f16, free for us), `sum[b]` = `Σ
/// qs`, `bias1[b]` = `-k·Σ qs` and `s[b]` = `d·Σ qs`. The VNNI kernels compute `Σ u·x` with
/// *unsigned* weights `u = w + k` (k = 8 for Q4_0 nibbles, 128 for Q8_0 via `w ^ 0x80`) and
/// start the `vpdpbusd` accumulator at the bias, which removes the offset exactly in integers.
/// The unpacked kernels load 8-lane rows of these ([`ActQ8::lanes8`]), built on first use.
pub struct ActQ8 {
    /// Blocks per token row.
    pub blocks_per_row: usize,
    /// i8 values, 32 per block.
    pub qs: Vec<i8>,
    /// Per-block scale.
    pub d: Vec<f32>,
    /// Σ qs per block (used by the scalar kernel).
    pub sum: Vec<i32>,
    /// `-k·Σqs` per block, one i32 each: what the packed kernels broadcast. Compact on
    /// purpose: read from 8-lane rows (32 bytes a block), a token's activation data spanned
    /// 17 KiB at 8192 columns instead of 10, and 8-token calls of such a matrix cost ~1.4×
    /// (`docs/cpu-kernels.md`).
    pub bias1: Vec<i32>,
    /// `d · Σ qs` per block: ggml's Q8_1 `s`, the activation term of the min in Q4_1 / Q5_1.
    pub s: Vec<f32>,
    /// The weight offset `k` the biases remove.
    k: i32,
    /// The 8-lane rows of the unpacked kernels, built on first use ([`ActQ8::lanes8`]).
    lanes8: std::sync::OnceLock<Lanes8>,
}

/// Per block of an [`ActQ8`], three 8-lane rows an AVX2 register (or half an AVX-512 one) loads
/// with no shuffle: a rearrangement of its `d`, `bias1` and `s`, never different data.
pub(crate) struct Lanes8 {
    /// `d[b]` in all 8 lanes.
    pub dv: Vec<f32>,
    /// `[bias1[b], 0, …, 0]`.
    pub bias: Vec<i32>,
    /// `[s[b], 0, …, 0]`, so a SIMD kernel adds `m · s` to lane 0 with one load.
    pub sv: Vec<f32>,
}

/// Blocks one piece of an activation quantization takes: pieces run on the kernel threads
/// (`pool::in_pieces`) once a call has two of them.
const ACT_PIECE_BLOCKS: usize = 256;

/// One 32-value activation block to Q8_0 codes, the reference: the scale `amax / 127` (`amax`
/// the largest magnitude, NaN values skipped), each code `round(v / scale)` (half away from
/// zero, saturated to i8, NaN → 0); returns the scale and `Σ qs`.
pub(crate) fn q8_block_scalar(xb: &[f32], qs: &mut [i8]) -> (f32, i32) {
    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
    let dd = amax / 127.0;
    let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
    let mut s = 0i32;
    for (q, v) in qs.iter_mut().zip(xb) {
        *q = (v * id).round() as i8;
        s += *q as i32;
    }
    (dd, s)
}

/// [`q8_block_scalar`] on this CPU: the AVX2 version where the CPU runs the AVX2 path
/// (bitwise the same, `simd/act_q8.rs`), else the reference itself.
fn q8_block_fn() -> fn(&[f32], &mut [i8]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::Isa::Avx2.is_available() {
        return |xb, qs| {
            assert!(xb.len() >= QK && qs.len() >= QK);
            // SAFETY: returned only where the AVX2 path is available; both slices hold a block.
            unsafe { crate::simd::act_q8::block(xb.as_ptr(), qs.as_mut_ptr()) }
        };
    }
    q8_block_scalar
}

impl ActQ8 {
    /// Quantizes `n` rows of `cols` f32 (cols % 32 == 0); `k` is the weight offset (8 or 128).
    /// Calls of at least two [`ACT_PIECE_BLOCKS`] pieces run on the kernel threads; every
    /// block's result is the same either way.
    pub fn new(x: &[f32], n: usize, cols: usize, k: i32) -> ActQ8 {
        let bpr = cols / QK;
        let nb = n * bpr;
        let mut a = ActQ8 {
            blocks_per_row: bpr,
            qs: vec![0; nb * QK],
            d: vec![0.0; nb],
            sum: vec![0; nb],
            bias1: vec![0; nb],
            s: vec![0.0; nb],
            k,
            lanes8: std::sync::OnceLock::new(),
        };
        let block = q8_block_fn();
        let piece = |(((xb, qs), (d, sum)), (bias1, s)): PieceQ8<'_>| {
            let blocks = xb.chunks_exact(QK).zip(qs.chunks_exact_mut(QK));
            for ((((xb, qs), d), sum), (bias1, sd)) in blocks.zip(d.iter_mut()).zip(sum.iter_mut()).zip(bias1.iter_mut().zip(s.iter_mut()))
            {
                let (dd, total) = block(xb, qs);
                *d = dd;
                *sum = total;
                *bias1 = -k * total;
                *sd = dd * total as f32;
            }
        };
        let pb = ACT_PIECE_BLOCKS;
        let pieces = x[..nb * QK]
            .chunks(pb * QK)
            .zip(a.qs.chunks_mut(pb * QK))
            .zip(a.d.chunks_mut(pb).zip(a.sum.chunks_mut(pb)))
            .zip(a.bias1.chunks_mut(pb).zip(a.s.chunks_mut(pb)));
        crate::pool::in_pieces(pieces, &piece);
        a
    }

    /// The 8-lane rows of the unpacked kernels (`dv`, `bias`, `sv`), built on first use.
    pub(crate) fn lanes8(&self) -> &Lanes8 {
        self.lanes8.get_or_init(|| {
            let nb = self.d.len();
            let mut l = Lanes8 { dv: vec![0.0; nb * 8], bias: vec![0; nb * 8], sv: vec![0.0; nb * 8] };
            for (b, ((dv, bias), sv)) in l.dv.chunks_exact_mut(8).zip(l.bias.chunks_exact_mut(8)).zip(l.sv.chunks_exact_mut(8)).enumerate()
            {
                dv.fill(self.d[b]);
                bias[0] = -self.k * self.sum[b];
                sv[0] = self.s[b];
            }
            l
        })
    }
}

/// One piece of [`ActQ8::new`]: its input floats, then its blocks' codes, scales, sums, biases
/// and `s`.
type PieceQ8<'a> = (((&'a [f32], &'a mut [i8]), (&'a mut [f32], &'a mut [i32])), (&'a mut [i32], &'a mut [f32]));

/// Activations of `n` tokens quantized to ggml's Q8_K (256-element blocks, f32 scale, i8
/// values, i16 sums of each 16 values) for the K-quant kernels.
pub struct ActQ8K {
    /// Blocks per token row.
    pub blocks_per_row: usize,
    /// i8 values, 256 per block.
    pub qs: Vec<i8>,
    /// Per-block scale.
    pub d: Vec<f32>,
    /// Per-block sums of each group of 16 values (16 per block).
    pub bsums: Vec<i16>,
    /// The same values by 16-token groups, built on first use by the AVX-512 VNNI prefill
    /// kernel (a rearrangement of the fields above, never different data): `[0]` the values as
    /// they are, `[1]` each plus 128 (`TokenLanes::new`).
    pub(crate) lanes: [std::sync::OnceLock<crate::token_lanes::TokenLanes>; 2],
    /// `qs` in packed Q3_K's piece order, built on first use by its kernel (the same values,
    /// moved): [`ActQ8K::q3k_pieces`].
    q3k_pieces: std::sync::OnceLock<Vec<i8>>,
}

impl ActQ8K {
    /// `quantize_row_q8_K` on `n` rows of `cols` f32 (cols % 256 == 0).
    pub fn new(x: &[f32], n: usize, cols: usize) -> ActQ8K {
        let bpr = cols / QK_K;
        let nb = n * bpr;
        let mut a = ActQ8K {
            blocks_per_row: bpr,
            qs: vec![0; nb * QK_K],
            d: vec![0.0; nb],
            bsums: vec![0; nb * 16],
            lanes: [std::sync::OnceLock::new(), std::sync::OnceLock::new()],
            q3k_pieces: std::sync::OnceLock::new(),
        };
        let work = |((xb, qs), (d, bs)): ((&[f32], &mut [i8]), (&mut f32, &mut [i16]))| {
            // The reference's `max` is the first value of the largest magnitude: the magnitude
            // is found 8 lanes at a time (vectorized), then its first value.
            let lanes = xb.chunks_exact(8).fold([0f32; 8], |mut m, c| {
                for (m, v) in m.iter_mut().zip(c) {
                    *m = m.max(v.abs());
                }
                m
            });
            let amax = lanes.iter().fold(0f32, |a, &b| a.max(b));
            if amax == 0.0 {
                *d = 0.0;
                qs.iter_mut().for_each(|q| *q = 0);
                bs.iter_mut().for_each(|q| *q = 0);
                return;
            }
            let max = *xb.iter().find(|v| v.abs() == amax).expect("a value has the largest magnitude");
            let iscale = -127.0 / max;
            for (q, v) in qs.iter_mut().zip(xb) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            for (j, s) in bs.iter_mut().enumerate() {
                *s = qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
            }
            *d = 1.0 / iscale;
        };
        // Pieces of 32 super-blocks (8,192 values, as many as an ActQ8 piece).
        const PB: usize = ACT_PIECE_BLOCKS * QK / QK_K;
        let pieces =
            x[..nb * QK_K].chunks(PB * QK_K).zip(a.qs.chunks_mut(PB * QK_K)).zip(a.d.chunks_mut(PB).zip(a.bsums.chunks_mut(PB * 16)));
        crate::pool::in_pieces(pieces, &|((xs, qs), (d, bs)): ((&[f32], &mut [i8]), (&mut [f32], &mut [i16]))| {
            xs.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K)).zip(d.iter_mut().zip(bs.chunks_exact_mut(16))).for_each(work)
        });
        a
    }

    /// `qs` with each 32-value run's 4-byte words in the order 0, 4, 1, 5, 2, 6, 3, 7, so 8
    /// bytes at `8m` are values `4m..4m + 4` and `16 + 4m..16 + 4m + 4`: the columns of packed
    /// Q3_K's piece `m` (`repack_k.rs`), one broadcast each. Built once per call, on first use.
    pub(crate) fn q3k_pieces(&self) -> &[i8] {
        self.q3k_pieces.get_or_init(|| {
            let mut out = vec![0i8; self.qs.len()];
            for (o, q) in out.chunks_exact_mut(32).zip(self.qs.chunks_exact(32)) {
                for m in 0..4 {
                    o[8 * m..8 * m + 4].copy_from_slice(&q[4 * m..4 * m + 4]);
                    o[8 * m + 4..8 * m + 8].copy_from_slice(&q[16 + 4 * m..16 + 4 * m + 4]);
                }
            }
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Activations with a spread of magnitudes, zero blocks and a NaN.
    fn acts(n: usize, cols: usize) -> Vec<f32> {
        let mut x: Vec<f32> = (0..n * cols).map(|i| ((i * 7919 % 2001) as f32 - 1000.0) / (1.0 + (i % 97) as f32)).collect();
        x[..64].fill(0.0);
        x[100] = f32::NAN;
        x
    }

    #[test]
    fn act_q8_blocks_are_the_reference_in_one_piece_or_many() {
        // 64 blocks (one piece, quantized here) and 1,088 (five pieces, on the kernel threads).
        for (n, cols) in [(1, 2048), (17, 2048), (3, 4096)] {
            let x = acts(n, cols);
            for k in [0, 8, 128] {
                let a = ActQ8::new(&x, n, cols, k);
                let l = a.lanes8();
                for (b, xb) in x.chunks_exact(QK).enumerate() {
                    let mut qs = [0i8; QK];
                    let (d, sum) = q8_block_scalar(xb, &mut qs);
                    assert_eq!(&a.qs[QK * b..QK * b + QK], &qs, "n {n} cols {cols} block {b}");
                    assert_eq!((a.d[b].to_bits(), a.sum[b], a.bias1[b]), (d.to_bits(), sum, -k * sum), "block {b}");
                    assert_eq!(a.s[b].to_bits(), (d * sum as f32).to_bits(), "block {b}");
                    assert!(l.dv[8 * b..8 * b + 8].iter().all(|v| v.to_bits() == d.to_bits()));
                    assert_eq!(&l.bias[8 * b..8 * b + 8], &[-k * sum, 0, 0, 0, 0, 0, 0, 0]);
                    assert_eq!(l.sv[8 * b].to_bits(), a.s[b].to_bits());
                    assert!(l.sv[8 * b + 1..8 * b + 8].iter().all(|&v| v == 0.0));
                }
            }
        }
    }

    #[test]
    fn act_q8k_is_the_same_row_by_row_or_in_pieces() {
        // 40 rows of 8 super-blocks: ten pieces on the kernel threads; each row alone is one.
        let (n, cols) = (40, 2048);
        let x = acts(n, cols);
        let all = ActQ8K::new(&x, n, cols);
        let bpr = cols / QK_K;
        for r in 0..n {
            let one = ActQ8K::new(&x[r * cols..(r + 1) * cols], 1, cols);
            assert_eq!(&all.qs[r * cols..(r + 1) * cols], &one.qs[..], "row {r}");
            assert_eq!(&all.bsums[r * bpr * 16..(r + 1) * bpr * 16], &one.bsums[..], "row {r}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all.d[r * bpr..(r + 1) * bpr]), bits(&one.d), "row {r}");
        }
    }
}
