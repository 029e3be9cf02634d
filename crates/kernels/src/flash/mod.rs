//! Attention on AMX-BF16 tiles: the online-softmax ("flash") accumulation of one group of query
//! rows over a sequence of key/value chunks of up to [`CHUNK`] tokens.
//!
//! Layout (transposed, so that every softmax step is a vertical vector op over 16 query rows):
//! * scores `Sᵀ[key][row] = K · Qᵀ`: `A` = the chunk's keys (16 keys × 32 dims per tile, as
//!   stored), `B` = the queries in the VNNI layout (packed once in [`Flash::new`]);
//! * output `Oᵀ[dim][row] += Vᵀ · Pᵀ`: `A` = the chunk's values transposed (16 dims × 32 keys),
//!   `B` = the probabilities, interleaved in key pairs straight from the softmax registers. The
//!   tile unit sums pairs of the reduction dimension together; here pair `j` is keys `j` and
//!   `j + 16` (not `2j`, `2j + 1`), so that f16 values can be paired by interleaving two rows
//!   ([`Flash::add_rows`] with [`Rows::F16`]) instead of transposing them word by word.
//!
//! Precision: bf16 keeps 8 significant bits, so every operand is split as `x = hi + lo` (both
//! bf16, round-to-nearest) and each product is `hi·hi + hi·lo + lo·hi`, accumulated in f32 by
//! the tile unit. An f16 key or value splits exactly; an f32 query or probability keeps ~16
//! bits; the dropped `lo·lo` term is below 2⁻¹⁶ of `|x||y|`. Scores and outputs agree with the
//! f32 reference to about 1e-5 relative (`engram-model`'s attention tests compare the two
//! paths), at several times its speed.
//!
//! [`Precision::Bf16`] (opt-in) drops the `lo` halves: one product per tile pair, operands
//! rounded to bf16 (8 significant bits) and accumulated in f32 — the precision of GPU
//! flash attention, where `P` is bf16 — with a cheaper `2^x` (relative error < 1e-4, below the
//! bf16 rounding of `P`). 4–8e-3 of the f32 reference at the output (tests), a mean KL of
//! ~5e-6 nats on a trained model (`engram bench fidelity`). With head dims up to 64 it is
//! grouped: chunks are queued eight at a time and each row block runs over all of them
//! with its accumulators held in tiles (`attend_group`); outputs are complete after
//! [`Flash::finish`].
//!
//! Invariant: every operation on one query row's scores, running max, sum and output
//! accumulator depends only on that row's query, its position and the chunks it sees — never
//! on the other rows sharing the tile — so a row's result is bitwise the same whether it is
//! computed alone (decode) or with any number of other rows (prefill).

/// Keys per chunk that one [`Flash::add_chunk`] call accepts (the K depth of one `Pᵀ` tile).
pub const CHUNK: usize = 32;

/// Whether the tile path runs on this machine for `head_dim`: AMX-BF16 tiles (with the OS
/// granting tile state), AVX-512 BF16/BW/DQ, and a head dimension that is a multiple of 16 up to 256.
pub fn supported(head_dim: usize) -> bool {
    head_dim % 16 == 0 && head_dim > 0 && head_dim <= 256 && imp::available()
}

pub use imp::Flash;

/// Where a chunk's keys sit and which query rows may see them, beyond causality (a row sees a
/// key only at or before its own position). The common case — keys at `pos0 ..`, no masks —
/// is [`KeyVisibility::at`].
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyVisibility<'a> {
    /// Position of key `i`: `pos0 + i`, unless `positions` is given.
    pub pos0: usize,
    /// Position of key `i` (at least `n` entries): for keys moved to arbitrary positions
    /// (a tree of drafts, a reused chunk, a cluster of keys from anywhere in the context).
    pub positions: Option<&'a [u32]>,
    /// `mask[i] == false` hides key `i` from every row.
    pub mask: Option<&'a [bool]>,
    /// Per query row: bit `r % 16` of `row_mask[(r / 16) * CHUNK + i]` set lets row `r` see
    /// key `i` (a tree of drafts: each draft sees its own branch). At least
    /// `rows.div_ceil(16) * CHUNK` entries.
    pub row_mask: Option<&'a [u16]>,
}

impl KeyVisibility<'static> {
    /// Keys at contiguous positions `pos0 ..`, no masks.
    pub fn at(pos0: usize) -> KeyVisibility<'static> {
        KeyVisibility { pos0, ..KeyVisibility::default() }
    }
}

impl KeyVisibility<'_> {
    /// Position of key `i`.
    #[inline]
    pub fn position(&self, i: usize) -> usize {
        self.positions.map_or(self.pos0 + i, |p| p[i] as usize)
    }

    /// The lowest and highest positions of keys `0..n` (`n > 0`).
    pub fn span(&self, n: usize) -> (usize, usize) {
        match self.positions {
            None => (self.pos0, self.pos0 + n - 1),
            Some(p) => p[..n].iter().fold((usize::MAX, 0), |(lo, hi), &x| (lo.min(x as usize), hi.max(x as usize))),
        }
    }
}

/// How exactly the tile path multiplies; chosen per model load, part of its fingerprint (a cache
/// computed one way is a miss for the other).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Every operand split into two bf16 halves (three products): ~1e-5 of the f32 reference.
    #[default]
    Exact,
    /// Operands rounded to bf16, one product, f32 accumulation: ~5e-3 of the reference at the
    /// output, about twice as fast at long context.
    Bf16,
}

impl Precision {
    /// The name the CLI and fingerprints use: `exact` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exact" => Ok(Precision::Exact),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(format!("unknown attention precision {s:?} (expected exact or bf16)")),
        }
    }
}

/// A chunk's keys or values as one KV head stores them: `n` rows of `head_dim` values, in one
/// of the KV formats. The tiles are packed straight from these rows (no f32 copy of the chunk).
#[derive(Clone, Copy, Debug)]
pub enum Rows<'a> {
    /// `[n * head_dim]` floats.
    F32(&'a [f32]),
    /// `[n * head_dim]` little-endian IEEE half floats.
    F16(&'a [u8]),
    /// ggml Q8_0 blocks of 32 (`head_dim % 32 == 0`): per block an f16 scale and 32 `i8`.
    Q8_0(&'a [u8]),
    /// ggml Q4_0 blocks of 32 (`head_dim % 32 == 0`): per block an f16 scale and 16 bytes of
    /// nibbles (byte `j`: value `j` low, value `j + 16` high, both offset by 8).
    Q4_0(&'a [u8]),
}

impl Rows<'_> {
    /// Whether the slice holds at least `n` rows of `head_dim` values (and the format can).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn holds(&self, n: usize, head_dim: usize) -> bool {
        match *self {
            Rows::F32(x) => x.len() >= n * head_dim,
            Rows::F16(x) => x.len() >= n * head_dim * 2,
            Rows::Q8_0(x) => head_dim % 32 == 0 && x.len() >= n * head_dim / 32 * 34,
            Rows::Q4_0(x) => head_dim % 32 == 0 && x.len() >= n * head_dim / 32 * 18,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod imp;

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    pub(super) fn available() -> bool {
        false
    }

    /// Not available on this architecture ([`super::supported`] is always false).
    pub struct Flash(());

    impl Flash {
        pub fn new(_q: &[f32], _rows: usize, _head_dim: usize, _pos0: usize, _rows_per_pos: usize) -> Flash {
            panic!("flash attention needs x86-64 AMX-BF16")
        }
        pub fn with_precision(_q: &[f32], _r: usize, _hd: usize, _p: usize, _g: usize, _x: super::Precision) -> Flash {
            panic!("flash attention needs x86-64 AMX-BF16")
        }
        pub fn add_chunk(&mut self, _k: &[f32], _v: &[f32], _n: usize, _key_pos0: usize, _mask: Option<&[bool]>) {}
        pub fn add_rows(&mut self, _k: super::Rows<'_>, _v: super::Rows<'_>, _n: usize, _key_pos0: usize, _mask: Option<&[bool]>) {}
        pub fn with_positions(_q: &[f32], _hd: usize, _pos: &[u32], _x: super::Precision) -> Flash {
            panic!("flash attention needs x86-64 AMX-BF16")
        }
        pub fn add_visible(&mut self, _k: super::Rows<'_>, _v: super::Rows<'_>, _n: usize, _vis: &super::KeyVisibility<'_>) {}
        pub fn prefetch(&mut self, _bytes: &[u8]) {}
        pub fn finish(&mut self, _out: &mut [f32]) {}
    }
}
