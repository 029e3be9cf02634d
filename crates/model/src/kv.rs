//! The interface through which attention reads and writes keys and values.
//!
//! The model never owns a cache (STYLE.md: "the cache is passed in from
//! outside"): the KV store implements [`KvCache`] for one sequence and the
//! forward pass calls it. Keys are stored *after* RoPE, so attention reads
//! them without rotating; moving cached tokens to new positions is the KV
//! store's job (it re-rotates by the position delta).
//!
//! Invariant: within one [`KvChunk`] positions are contiguous
//! (`first_pos .. first_pos + len`); a chunk may be masked per position, and
//! chunks arrive in increasing position order. A query at position `p`
//! attends exactly to the stored positions `<= p` whose mask is set.

use half::f16;

/// The element storage of one chunk's keys or values, laid out
/// `[num_kv_heads][stride / head_dim][head_dim]` (head-major, so one head's
/// keys are contiguous and attention streams them).
#[derive(Clone, Copy, Debug)]
pub enum KvData<'a> {
    /// Exact f32.
    F32(&'a [f32]),
    /// Exact-enough f16 (one rounding of each stored value).
    F16(&'a [f16]),
}

/// A run of cached tokens for one layer, as attention sees it.
#[derive(Clone, Copy, Debug)]
pub struct KvChunk<'a> {
    /// Position of the first token.
    pub first_pos: usize,
    /// Number of valid tokens.
    pub len: usize,
    /// Elements between the starts of consecutive heads (>= `len * head_dim`).
    pub head_stride: usize,
    pub keys: KvData<'a>,
    pub values: KvData<'a>,
    /// `Some(mask)`: token `i` is attended only if `mask[i]`.
    pub mask: Option<&'a [bool]>,
}

/// One sequence's KV cache, as the forward pass uses it.
pub trait KvCache: Send + Sync {
    /// Stores `num_tokens` tokens' keys and values for `layer` at positions
    /// `first_pos ..`. `keys`/`values` are `[num_tokens, num_kv_heads * head_dim]`,
    /// keys already rotated. Space must have been reserved by the caller of
    /// the forward pass, so this does not fail for lack of room.
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize);

    /// Calls `f` with every chunk of `layer`, in increasing position order.
    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>));
}
