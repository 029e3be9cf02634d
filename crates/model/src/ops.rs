//! Small element-wise operations of the forward pass. They are a few percent
//! of a step's time, so they are plain loops written so the compiler
//! vectorises them (independent accumulators, no bounds checks in the body).

/// `out = x * rsqrt(mean(x^2) + eps) * w`, row by row (transformers' LlamaRMSNorm, f32).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss = dot(xr, xr);
        let scale = 1.0 / ((ss / d as f32) + eps).sqrt();
        for ((o, &xv), &wv) in or.iter_mut().zip(xr).zip(w) {
            *o = wv * (xv * scale);
        }
    }
}

/// [`rms_norm`] in place, over every `w.len()`-wide row of `x`: Qwen3's per-head norm of
/// queries and keys (`x` holds `rows * heads` head vectors of `head_dim = w.len()`).
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let ss = dot(xr, xr);
        let scale = 1.0 / ((ss / d as f32) + eps).sqrt();
        for (o, &wv) in xr.iter_mut().zip(w) {
            *o = wv * (*o * scale);
        }
    }
}

/// Dot product with eight independent accumulators (vectorises to one FMA chain per lane).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = 0.0;
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + s
}

/// `acc += p * v`.
#[inline]
pub fn axpy(acc: &mut [f32], p: f32, v: &[f32]) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a += p * x;
    }
}

/// `gate = silu(gate) * up` in place (SwiGLU; [`engram_kernels::activation::swiglu`]).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    engram_kernels::activation::swiglu(gate, up);
}

/// `gate = gelu_tanh(gate) * up` in place (Gemma's gated MLP; transformers'
/// `gelu_pytorch_tanh`: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`).
pub fn geglu_tanh(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh()) * u;
    }
}

/// `gate = clamped_gate · σ(1.702 · clamped_gate) · (clamped_up + 1)` in place: GPT-OSS's
/// SwiGLU, the gate clamped above at 7 and the up projection to ±7 (transformers'
/// `GptOssExperts._apply_gate`, llama.cpp's `swiglu_oai` with alpha 1.702, limit 7).
pub fn swiglu_oai(gate: &mut [f32], up: &[f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(LIMIT);
        let y = u.clamp(-LIMIT, LIMIT);
        *g = x / (1.0 + (-ALPHA * x).exp()) * (y + 1.0);
    }
}

/// `gate = act(gate) * up` in place for the feed-forward activation `act`.
pub fn gated_activation(act: crate::config::FfnActivation, gate: &mut [f32], up: &[f32]) {
    use crate::config::FfnActivation;
    match act {
        FfnActivation::Silu => swiglu(gate, up),
        FfnActivation::GeluTanh => geglu_tanh(gate, up),
        FfnActivation::SwigluOai => swiglu_oai(gate, up),
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Adds `bias` to every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}
