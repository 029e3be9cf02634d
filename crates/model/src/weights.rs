//! Weight storage: every matrix is a byte range of a memory-mapped file (or an
//! owned buffer) in its on-disk format, so F16 stays F16 and quantized
//! weights are never expanded. The kernels read a copy in anonymous huge-page
//! memory where the machine grants huge pages: the CPU's packed layout where it
//! has one (`Packed`), else the same bytes verbatim; the file's pages are then
//! dropped from the process (they stay in the page cache).
//!
//! Invariant: a `Weight`'s byte length equals `rows * dtype.row_bytes(cols)`,
//! checked when it is created.

use std::ops::Range;
use std::sync::Arc;

use engram_kernels::{DType, HugeBytes, Packed, WeightMatrix};
use memmap2::Mmap;

use crate::error::{tensor_err, Result};

/// Where a weight's bytes live.
#[derive(Clone)]
pub enum Storage {
    /// A range of a read-only file mapping shared by all tensors of that file.
    Mapped(Arc<Mmap>, Range<usize>),
    /// Bytes owned by the model (converted or generated tensors).
    Owned(Arc<Vec<u8>>),
}

impl Storage {
    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(map, r) => &map[r.clone()],
            Storage::Owned(v) => v,
        }
    }

    /// Drops a mapped range's pages from this process (they stay in the page cache and are
    /// read back on the next access): once a weight is repacked its file bytes are not read by
    /// the GEMV, so the process's RSS does not count the model twice. Advice only; owned
    /// bytes are kept.
    fn release_resident(&self) {
        #[cfg(unix)]
        if let Storage::Mapped(map, r) = self {
            // SAFETY: the mapping is a read-only file mapping: MADV_DONTNEED only drops this
            // process's page-table entries, and a later read faults the same bytes back in
            // from the file, so every reference into the map stays valid and unchanged.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, r.start, r.len()) };
        }
    }
}

/// A [`Weight`] constructor: [`Weight::new`], or [`Weight::for_rows`] for a matrix only read
/// row by row (loaders pick one per tensor).
pub type WeightCtor = fn(&str, &str, DType, usize, usize, Storage) -> Result<Weight>;

/// A 2-D weight matrix `[rows = out features, cols = in features]`.
#[derive(Clone)]
pub struct Weight {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    storage: Storage,
    /// Repacked for the packed AVX2 kernels where this CPU runs them (`Packed::for_this_cpu`), in anonymous memory
    /// beside the untouched storage; `None` elsewhere.
    packed: Option<Arc<Packed>>,
    /// A mapped weight the kernels read unpacked, copied verbatim into anonymous memory in
    /// huge pages where the OS grants them ([`HugeBytes`]: a step streams every byte, and 4 KiB
    /// pages of the file mapping cost a page walk each); `None` for packed or owned weights.
    resident: Option<Arc<HugeBytes>>,
}

impl Weight {
    /// Wraps storage after checking its length against shape and format, with the copy the
    /// kernels read where this machine has one (a packing, or a verbatim huge-page copy).
    pub fn new(file: &str, name: &str, dtype: DType, rows: usize, cols: usize, storage: Storage) -> Result<Self> {
        let mut w = Weight::for_rows(file, name, dtype, rows, cols, storage)?;
        w.packed = Packed::for_this_cpu(&w.matrix()).map(Arc::new);
        if w.packed.is_some() {
            w.storage.release_resident();
        } else if matches!(w.storage, Storage::Mapped(..)) && engram_kernels::huge_pages_enabled() {
            w.resident = Some(Arc::new(HugeBytes::copy_of(w.storage.bytes())));
            w.storage.release_resident();
        }
        Ok(w)
    }

    /// [`Weight::new`] without a packing or resident copy, for a matrix that is only read row
    /// by row (an embedding not tied to the output): the GEMV never reads it, so a copy would
    /// be load time and anonymous memory for nothing. Rows are read from the storage.
    pub fn for_rows(file: &str, name: &str, dtype: DType, rows: usize, cols: usize, storage: Storage) -> Result<Self> {
        let row_bytes = dtype
            .row_bytes(cols)
            .ok_or_else(|| tensor_err(file, name, format!("{cols} columns are not a whole number of {} blocks", dtype.name())))?;
        let want = rows.checked_mul(row_bytes).ok_or_else(|| tensor_err(file, name, "size overflows"))?;
        let have = storage.bytes().len();
        if have != want {
            return Err(tensor_err(file, name, format!("holds {have} bytes, shape [{rows}, {cols}] {} needs {want}", dtype.name())));
        }
        Ok(Weight { dtype, rows, cols, storage, packed: None, resident: None })
    }

    /// A fused matrix (`storage` holding `parts.iter().sum()` rows of `cols`) split into one
    /// matrix per part, in order, each a view of its rows of the same bytes (a row of every
    /// format is a whole number of blocks). Phi-3's fused q/k/v and gate/up projections are
    /// split this way at load, so the forward pass sees separate matrices and nothing is copied.
    pub fn split_rows(file: &str, name: &str, dtype: DType, parts: &[usize], cols: usize, storage: Storage) -> Result<Vec<Weight>> {
        let rows: usize = parts.iter().sum();
        let rb = dtype
            .row_bytes(cols)
            .ok_or_else(|| tensor_err(file, name, format!("{cols} columns are not a whole number of {} blocks", dtype.name())))?;
        let have = storage.bytes().len();
        if Some(have) != rows.checked_mul(rb) {
            return Err(tensor_err(file, name, format!("holds {have} bytes, shape [{rows}, {cols}] {} needs {}", dtype.name(), rows * rb)));
        }
        let mut out = Vec::with_capacity(parts.len());
        let mut first = 0;
        for &n in parts {
            let part = match &storage {
                Storage::Mapped(map, r) => Storage::Mapped(map.clone(), r.start + first * rb..r.start + (first + n) * rb),
                Storage::Owned(v) => Storage::Owned(Arc::new(v[first * rb..(first + n) * rb].to_vec())),
            };
            out.push(Weight::new(file, name, dtype, n, cols, part)?);
            first += n;
        }
        Ok(out)
    }

    /// Bytes of the repacked copy this weight holds (0 without one).
    pub fn packed_bytes(&self) -> usize {
        self.packed.as_ref().map_or(0, |p| p.num_bytes())
    }

    /// Bytes of the verbatim huge-page copy this weight holds (0 without one).
    pub fn resident_bytes(&self) -> usize {
        self.resident.as_ref().map_or(0, |r| r.len())
    }

    /// The bytes the kernels read in the source format: the resident copy if any, else the
    /// storage (the same bytes either way).
    fn source_bytes(&self) -> &[u8] {
        self.resident.as_deref().map_or_else(|| self.storage.bytes(), |r| &r[..])
    }

    /// A kernel view of the whole matrix.
    pub fn matrix(&self) -> WeightMatrix<'_> {
        let m = WeightMatrix { dtype: self.dtype, rows: self.rows, cols: self.cols, data: self.source_bytes(), packed: None };
        match &self.packed {
            Some(p) => m.with_packed(p),
            None => m,
        }
    }

    /// Dequantizes row `r` into `out` (`cols` floats): used for embedding lookup.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        let rb = self.dtype.row_bytes(self.cols).expect("validated at construction");
        engram_kernels::dequantize_row(self.dtype, &self.source_bytes()[r * rb..(r + 1) * rb], out);
    }

    /// All elements as f32 (for small tensors such as norms and biases).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for r in 0..self.rows {
            self.row_f32(r, &mut out[r * self.cols..(r + 1) * self.cols]);
        }
        out
    }

    /// Bytes of weight data.
    pub fn num_bytes(&self) -> usize {
        self.storage.bytes().len()
    }
}

/// The tensors of one decoder layer.
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub q: Weight,
    pub k: Weight,
    pub v: Weight,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    /// Qwen3's per-head RMSNorm weights on queries and keys (`head_dim` each), applied
    /// after the projections and before RoPE.
    pub q_norm: Option<Vec<f32>>,
    /// The key side of `q_norm`.
    pub k_norm: Option<Vec<f32>>,
    pub o: Weight,
    /// GPT-OSS's bias on the attention output projection.
    pub o_bias: Option<Vec<f32>>,
    /// GPT-OSS's attention sinks: one learned logit per query head (`num_heads`), joining
    /// each softmax's denominator only (no value).
    pub sinks: Option<Vec<f32>>,
    /// Gemma's norm of the attention output before the residual add (`post_attention_layernorm`).
    pub post_attn_norm: Option<Vec<f32>>,
    /// The norm before the MLP (Gemma's `pre_feedforward_layernorm`, Llama's `post_attention_layernorm`).
    pub ffn_norm: Vec<f32>,
    /// Gemma's norm of the MLP output before the residual add (`post_feedforward_layernorm`).
    pub post_ffn_norm: Option<Vec<f32>>,
    /// The feed-forward block after `ffn_norm`.
    pub ffn: FeedForward,
}

impl LayerWeights {
    /// Every matrix of the layer: the attention projections, then the feed-forward block's
    /// (a mixture's router, then each expert's gate, up and down).
    pub fn matrices(&self) -> Vec<&Weight> {
        let mut out = vec![&self.q, &self.k, &self.v, &self.o];
        match &self.ffn {
            FeedForward::Dense(m) => out.extend(m.matrices()),
            FeedForward::Moe(moe) => {
                out.push(&moe.router);
                out.extend(moe.experts.iter().flat_map(GatedMlp::matrices));
            }
        }
        out
    }

    /// Weight bytes one token reads in this layer: every matrix of a dense layer; in a
    /// mixture, the router and `experts_per_token` experts' worth (the mean expert's bytes).
    pub fn bytes_read_per_token(&self, experts_per_token: usize) -> usize {
        let attn: usize = [&self.q, &self.k, &self.v, &self.o].iter().map(|w| w.num_bytes()).sum();
        let ffn = match &self.ffn {
            FeedForward::Dense(m) => m.matrices().iter().map(|w| w.num_bytes()).sum(),
            FeedForward::Moe(moe) => {
                let all: usize = moe.experts.iter().flat_map(GatedMlp::matrices).map(Weight::num_bytes).sum();
                moe.router.num_bytes() + all * experts_per_token.min(moe.experts.len()) / moe.experts.len().max(1)
            }
        };
        attn + ffn
    }
}

/// A gated MLP: `down(act(gate(x) + b_gate) * (up(x) + b_up)) + b_down`, the biases only
/// where `bias` is given (GPT-OSS's experts).
pub struct GatedMlp {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    pub bias: Option<MlpBias>,
}

/// The biases of a [`GatedMlp`]: `gate` and `up` of its width, `down` of the hidden size.
pub struct MlpBias {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

impl GatedMlp {
    /// Its gate, up and down matrices.
    pub fn matrices(&self) -> [&Weight; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

/// A mixture of experts (`crate::config::MoeConfig`): the router scores each expert per
/// token (`experts` rows of `hidden`), and each expert is a gated MLP.
pub struct MoeWeights {
    pub router: Weight,
    /// GPT-OSS's router bias (`experts` entries), added to the router's logits.
    pub router_bias: Option<Vec<f32>>,
    pub experts: Vec<GatedMlp>,
}

/// A layer's feed-forward block.
pub enum FeedForward {
    /// One gated MLP for every token.
    Dense(GatedMlp),
    /// A mixture of experts, a few of them per token.
    Moe(MoeWeights),
}

/// All tensors of a model. The output matrix may be the embedding (tied).
pub struct ModelWeights {
    pub embed: Weight,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    pub output: Weight,
}

impl ModelWeights {
    /// Total bytes of weight data (the tied output is counted once).
    pub fn num_bytes(&self) -> usize {
        self.sum_over_matrices(Weight::num_bytes)
    }

    /// Bytes of repacked copies held in anonymous memory (`Weight::packed_bytes`; the tied
    /// output counted once).
    pub fn packed_bytes(&self) -> usize {
        self.sum_over_matrices(Weight::packed_bytes)
    }

    /// Bytes of verbatim huge-page copies over all matrices (tied output counted once).
    pub fn resident_bytes(&self) -> usize {
        self.sum_over_matrices(Weight::resident_bytes)
    }

    /// `f` summed over every matrix: embedding, each layer's projections, and the output
    /// unless it is tied to the embedding (the same bytes, counted once).
    fn sum_over_matrices(&self, f: impl Fn(&Weight) -> usize) -> usize {
        let layers: usize = self.layers.iter().map(|l| l.matrices().into_iter().map(&f).sum::<usize>()).sum();
        let tied = std::ptr::eq(self.output.storage.bytes().as_ptr(), self.embed.storage.bytes().as_ptr());
        f(&self.embed) + layers + if tied { 0 } else { f(&self.output) }
    }

    /// Weight bytes one token reads: every layer's matrices (in a mixture, the router and
    /// `experts_per_token` experts' worth) and the output matrix; the embedding contributes
    /// one row, neglected, and norms are tiny.
    pub fn bytes_read_per_token(&self, experts_per_token: usize) -> usize {
        self.layers.iter().map(|l| l.bytes_read_per_token(experts_per_token)).sum::<usize>() + self.output.num_bytes()
    }

    /// The dominant weight format (that of the first layer's q projection), for display.
    pub fn main_dtype(&self) -> DType {
        self.layers.first().map(|l| l.q.dtype).unwrap_or(self.embed.dtype)
    }
}
