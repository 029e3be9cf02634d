//! f32 → block quantizers of the K-quant formats added beside Q4_K/Q6_K (Q2_K, Q3_K, Q5_K):
//! ports of llama.cpp's `quantize_row_q{2,3,5}_K_ref` (same float operations in the same
//! order), so the blocks decode in llama.cpp as they do here.
//!
//! Invariant: every function writes every byte of its 256-element block.

use crate::blocks::*;
use crate::quantize::{make_qkx2_quants, nearest_int};

/// Packs 256 two-bit values `l` (0..4) into the 64 `qs` bytes at `b[off..]`: element
/// `128n + 32k + l` in bits `2k` of byte `32n + l`.
fn put_2bit(l: &[u8], b: &mut [u8], off: usize) {
    for n in 0..2 {
        for i in 0..32 {
            let j = 128 * n + i;
            b[off + 32 * n + i] = l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref` for one super-block.
pub(crate) fn q2k_block(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut mins = [0f32; 16];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let w: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
        let (s, m) = make_qkx2_quants(xs, &w, 3, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            b[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(b, Q2K_D, max_scale / 15.0);
    } else {
        b[..16].iter_mut().for_each(|v| *v = 0);
        put_f16(b, Q2K_D, 0.0);
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            b[j] |= (nearest_int(iscale * mins[j]) as u8) << 4;
        }
        put_f16(b, Q2K_D + 2, max_min / 15.0);
    } else {
        put_f16(b, Q2K_D + 2, 0.0);
    }
    let (d, dmin) = (f16_at(b, Q2K_D), f16_at(b, Q2K_D + 2));
    for j in 0..16 {
        let dl = d * (b[j] & 0xF) as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * (b[j] >> 4) as f32;
        for i in 0..16 {
            l[16 * j + i] = nearest_int((x[16 * j + i] + dm) / dl).clamp(0, 3) as u8;
        }
    }
    put_2bit(&l, b, Q2K_QS);
}

/// ggml's `make_q3_quants` with `do_rmse`: symmetric quantization to `[−nmax, nmax − 1]` refined
/// by coordinate descent on the x²-weighted error. Fills `l` with `q + nmax`, returns the scale.
fn make_q3_quants(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
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
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..x.len() {
        let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = li as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for i in 0..x.len() {
            let w = x[i] * x[i];
            let li = l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for v in l.iter_mut() {
        *v += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `quantize_row_q3_K_ref` for one super-block.
pub(crate) fn q3k_block(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(&x[16 * j..16 * j + 16], 4, &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        let li: [u8; 16] = std::array::from_fn(|j| ((nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32) as u8);
        put_q3k_scales(b, &li);
        put_f16(b, Q3K_D, 1.0 / iscale);
    } else {
        put_q3k_scales(b, &[0; 16]);
        put_f16(b, Q3K_D, 0.0);
    }
    let d = f16_at(b, Q3K_D);
    let scs = q3k_scales(b);
    for j in 0..16 {
        let dl = d * scs[j] as f32;
        if dl == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / dl).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut lo = [0u8; QK_K];
    b[..32].iter_mut().for_each(|v| *v = 0);
    for j in 0..QK_K {
        let mut v = l[j] as u8;
        if v > 3 {
            b[j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        lo[j] = v;
    }
    put_2bit(&lo, b, Q3K_QS);
}

/// `quantize_row_q5_K_ref` for one super-block.
pub(crate) fn q5k_block(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0f32, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let w: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let (s, m) = make_qkx2_quants(xs, &w, 31, &mut l[32 * j..32 * j + 32], -0.5, 0.1, 15, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut b[Q4K_SCALES..Q4K_SCALES + 12];
    sc.iter_mut().for_each(|v| *v = 0);
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
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
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / dl).clamp(0, 31) as u8;
        }
    }
    b[Q5K_QH..Q5K_QH + 32].iter_mut().for_each(|v| *v = 0);
    for c in 0..4 {
        for i in 0..32 {
            let (mut l1, mut l2) = (l[64 * c + i], l[64 * c + 32 + i]);
            if l1 > 15 {
                l1 -= 16;
                b[Q5K_QH + i] |= 1 << (2 * c);
            }
            if l2 > 15 {
                l2 -= 16;
                b[Q5K_QH + i] |= 2 << (2 * c);
            }
            b[Q5K_QS + 32 * c + i] = l1 | (l2 << 4);
        }
    }
}
