//! [`HugeBytes`]: a zeroed byte buffer in anonymous memory that asks the kernel for 2 MiB
//! pages, for weights the kernels stream every step.
//!
//! A decode step reads every weight byte once; with 4 KiB pages a 1 GiB model is 262,144 page
//! translations per step, far beyond the data TLB, so each new page costs a page walk on the
//! critical path. Linux backs an anonymous range advised `MADV_HUGEPAGE` with 2 MiB pages
//! when transparent huge pages are `always` or `madvise` (the common default), 512× fewer
//! translations. On Zen 4 the one-row step of the packed Q4_0 llama-1b fixture took ~6% less
//! with them (docs/benchmarks.md).
//!
//! [`huge_pages_enabled`] says whether this machine grants them (and `ENGRAM_HUGE_PAGES=off`
//! turns them off, for side-by-side measurement); loaders copy mapped weights into
//! [`HugeBytes`] only then.
//!
//! Invariant: the buffer is `len` bytes, starts zeroed, and is 2 MiB-aligned where it is a
//! mapping (so every whole 2 MiB of it can be one page; the partial last one keeps 4 KiB
//! pages, so no huge page extends past the end); where mapping or advice is not
//! available it is a plain heap buffer with the same contents and behaviour.

/// Alignment (and size) of a huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Buffers smaller than this stay on the heap (a huge page would mostly be waste).
const MIN_MAPPED: usize = HUGE_PAGE;

/// Whether weights should live in huge pages here: Linux with transparent huge pages
/// `always` or `madvise`, and `ENGRAM_HUGE_PAGES` not `0` / `off` (read once).
pub fn huge_pages_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let off = matches!(std::env::var("ENGRAM_HUGE_PAGES").as_deref().map(str::trim), Ok("0") | Ok("off") | Ok("OFF"));
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        !off && (thp.contains("[always]") || thp.contains("[madvise]"))
    })
}

/// A zeroed, fixed-length byte buffer backed by huge pages where the OS grants them.
pub struct HugeBytes {
    store: Store,
    len: usize,
}

enum Store {
    /// An anonymous mapping of `len + HUGE_PAGE` bytes; the buffer starts at `offset`.
    #[cfg(unix)]
    Mapped {
        map: memmap2::MmapMut,
        offset: usize,
    },
    Heap(Vec<u8>),
}

impl HugeBytes {
    /// `len` zero bytes. Falls back to the heap for small buffers, off unix, where
    /// [`huge_pages_enabled`] says no, or when the mapping fails (advice that is refused is
    /// ignored: the pages are then 4 KiB).
    pub fn zeroed(len: usize) -> HugeBytes {
        #[cfg(unix)]
        if len >= MIN_MAPPED && huge_pages_enabled() {
            if let Ok(map) = memmap2::MmapMut::map_anon(len + HUGE_PAGE) {
                let offset = (map.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - map.as_ptr() as usize;
                // Only the buffer's whole 2 MiB pages are advised: a huge page over its tail
                // would hold up to 2 MiB of bytes past the end (resident, never read), one per
                // buffer. Advice only: whether the kernel grants huge pages changes speed, not
                // bytes.
                let _ = map.advise_range(memmap2::Advice::HugePage, offset, len / HUGE_PAGE * HUGE_PAGE);
                return HugeBytes { store: Store::Mapped { map, offset }, len };
            }
        }
        HugeBytes { store: Store::Heap(vec![0; len]), len }
    }

    /// A copy of `src`, made in 1 MiB pieces on the kernel pool (a load copies gigabytes, and
    /// each piece's page faults, on both sides, are then taken in parallel).
    pub fn copy_of(src: &[u8]) -> HugeBytes {
        use rayon::prelude::*;
        let mut b = HugeBytes::zeroed(src.len());
        crate::pool::pool().install(|| b.par_chunks_mut(1 << 20).zip(src.par_chunks(1 << 20)).for_each(|(d, s)| d.copy_from_slice(s)));
        b
    }

    /// Whether the buffer is an advised mapping (else a heap buffer).
    pub fn is_mapped(&self) -> bool {
        !matches!(self.store, Store::Heap(_))
    }
}

impl std::ops::Deref for HugeBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.store {
            #[cfg(unix)]
            Store::Mapped { map, offset } => &map[*offset..*offset + self.len],
            Store::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for HugeBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        match &mut self.store {
            #[cfg(unix)]
            Store::Mapped { map, offset } => &mut map[*offset..*offset + len],
            Store::Heap(v) => v,
        }
    }
}

impl std::fmt::Debug for HugeBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugeBytes({} bytes, {})", self.len, if self.is_mapped() { "mapped" } else { "heap" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_writable_at_every_size() {
        for len in [0, 1, 4095, MIN_MAPPED - 1, MIN_MAPPED, 3 * HUGE_PAGE + 17] {
            let mut b = HugeBytes::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            if cfg!(unix) && len >= MIN_MAPPED && huge_pages_enabled() {
                assert!(b.is_mapped());
                assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            }
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i % 251) as u8;
            }
            assert!(b.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
        }
    }

    #[test]
    fn copy_of_keeps_bytes() {
        let src: Vec<u8> = (0..MIN_MAPPED + 5).map(|i| (i * 7 % 256) as u8).collect();
        assert_eq!(&HugeBytes::copy_of(&src)[..], &src[..]);
    }
}
