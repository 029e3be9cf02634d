//! f32 → block quantizers of the 32-element formats added beside Q4_0/Q8_0 (Q4_1, Q5_0, Q5_1,
//! IQ4_NL, MXFP4) and the IQ4 search IQ4_XS shares, each a port of llama.cpp's reference
//! (`quantize_row_*_ref` in `ggml-quants.c`, same float operations in the same order), so files
//! written with them decode in llama.cpp as they do here.
//!
//! Invariant: every function writes every byte of its block (no stale bytes from `b`).

use crate::blocks::*;
use crate::quantize::nearest_int;

/// `quantize_row_q4_1_ref`: d = (max − min)/15, m = min, q = min(15, trunc((x − min)/d + 0.5)).
pub(crate) fn q4_1_block(x: &[f32], b: &mut [u8]) {
    let (min, max) = x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (if v < lo { v } else { lo }, if v > hi { v } else { hi }));
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    for j in 0..16 {
        let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
        b[Q4_1_QS + j] = q0 | (q1 << 4);
    }
}

/// Packs 32 five-bit values into `qh` (bit j = fifth bit of element j) and Q4_0-style nibbles.
fn put_q5(q: &[u8; 32], b: &mut [u8], qh_off: usize, qs_off: usize) {
    let mut qh = 0u32;
    for j in 0..16 {
        b[qs_off + j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
        qh |= (((q[j] & 0x10) >> 4) as u32) << j;
        qh |= (((q[j + 16] & 0x10) >> 4) as u32) << (j + 16);
    }
    b[qh_off..qh_off + 4].copy_from_slice(&qh.to_le_bytes());
}

/// `quantize_row_q5_0_ref`: d = (signed value of max |x|)/−16, q = min(31, trunc(x/d + 16.5)).
pub(crate) fn q5_0_block(x: &[f32], b: &mut [u8]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    let mut q = [0u8; 32];
    for j in 0..32 {
        q[j] = ((x[j] * id + 16.5) as i8).min(31) as u8;
    }
    put_q5(&q, b, Q5_0_QH, Q5_0_QS);
}

/// `quantize_row_q5_1_ref`: d = (max − min)/31, m = min, q = trunc((x − min)/d + 0.5).
pub(crate) fn q5_1_block(x: &[f32], b: &mut [u8]) {
    let (min, max) = x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (if v < lo { v } else { lo }, if v > hi { v } else { hi }));
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let mut q = [0u8; 32];
    for j in 0..32 {
        q[j] = ((x[j] - min) * id + 0.5) as u8;
    }
    put_q5(&q, b, Q5_1_QH, Q5_1_QS);
}

/// `quantize_row_mxfp4_ref`: e = floor(log2(max |x|)) − 2 + 127, each value the nearest of the
/// 16 FP4 codes times `e8m0_half(e)` (first best on ties).
pub(crate) fn mxfp4_block(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| if m < v.abs() { v.abs() } else { m });
    let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
    let d = e8m0_half(e);
    b[0] = e;
    let best = |v: f32| -> u8 {
        let mut bi = 0;
        let mut be = (KVALUES_MXFP4[0] as f32 * d - v).abs();
        for i in 1..16 {
            let err = (KVALUES_MXFP4[i] as f32 * d - v).abs();
            if err < be {
                bi = i;
                be = err;
            }
        }
        bi as u8
    };
    for j in 0..16 {
        b[1 + j] = best(x[j]) | (best(x[j + 16]) << 4);
    }
}

/// ggml's `best_index_int8`: the index of the table value nearest `x` (table ascending).
fn best_index_int8(val: &[i8; 16], x: f32) -> u8 {
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < val[mu] as f32 - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// ggml's `quantize_row_iq4_nl_impl` without importance weights (weight = x²) over one
/// super-block of `x.len()` elements in 32-element sub-blocks. Returns the f32 super-block scale
/// stored as f16 by the caller, fills the 16-byte nibble groups `q4` and, for more than one
/// sub-block, the 6-bit sub-block scales (`scales_h`, `scales_l`).
pub(crate) fn iq4_impl(x: &[f32], ntry: i32, q4: &mut [u8], scales_h: &mut u16, scales_l: &mut [u8]) -> f32 {
    let values = &KVALUES_IQ4NL;
    let nsub = x.len() / 32;
    let mut l = [0u8; 256];
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    let v0 = values[0] as f32;
    for ib in 0..nsub {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut l[32 * ib..32 * ib + 32];
        let weight: [f32; 32] = std::array::from_fn(|j| xb[j] * xb[j]);
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax < 1e-15 {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for j in 0..32 {
            let li = best_index_int8(values, id * xb[j]);
            lb[j] = li;
            let q = values[li as usize] as f32;
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry as f32 + v0) / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let q = values[best_index_int8(values, id * xb[j]) as usize] as f32;
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let dh;
    if nsub > 1 {
        *scales_h = 0;
        scales_l[..nsub / 2].iter_mut().for_each(|v| *v = 0);
        let d = -max_scale / 32.0;
        dh = d;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nsub {
            let li = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                l[32 * ib + j] = best_index_int8(values, idl * x[32 * ib + j]);
            }
            let li = (li + 32) as u8;
            if ib % 2 == 0 {
                scales_l[ib / 2] = li & 0xF;
            } else {
                scales_l[ib / 2] |= (li & 0xF) << 4;
            }
            *scales_h |= ((li >> 4) as u16) << (2 * (ib % 8));
        }
    } else {
        dh = scales[0];
        if ntry > 0 {
            let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
            for j in 0..x.len() {
                l[j] = best_index_int8(values, id * x[j]);
            }
        }
    }
    for i in 0..nsub {
        for j in 0..16 {
            q4[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
    dh
}

/// `quantize_row_iq4_nl_ref`: one 32-element sub-block, no scale search (`ntry = −1`).
pub(crate) fn iq4nl_block(x: &[f32], b: &mut [u8]) {
    let (mut h, mut sl) = (0u16, [0u8; 0]);
    let d = iq4_impl(x, -1, &mut b[2..18], &mut h, &mut sl);
    put_f16(b, 0, d);
}

/// `quantize_row_iq4_xs_ref` (= `quantize_iq4_xs` without importance weights, `ntry = 7`).
pub(crate) fn iq4xs_block(x: &[f32], b: &mut [u8]) {
    let mut h = 0u16;
    let mut sl = [0u8; 4];
    let d = iq4_impl(x, 7, &mut b[IQ4XS_QS..IQ4XS_QS + 128], &mut h, &mut sl);
    put_f16(b, 0, d);
    b[2..4].copy_from_slice(&h.to_le_bytes());
    b[4..8].copy_from_slice(&sl);
}
