//! [`Scratch`]: f16 rows in an anonymous memory mapping of their own, for a read of every key
//! of one (layer, KV head) of an offloaded cache.
//!
//! A chunk handed to attention is laid out `[kv_head][capacity]`, so the rows of head `h`
//! start at row `h × capacity`: a buffer for head 7 of a segment of 8,192 rows spans eight
//! heads' rows although one head's are written. A heap buffer of that size is resident whole
//! (zero-filled when grown) and, once freed, stays with the allocator; a mapping's pages are
//! resident only once written, and [`Scratch::release`] hands the written ones back to the
//! kernel, so what a full read holds in RAM is the rows of the one segment it is attending,
//! whatever the history's length, and nothing after it.
//!
//! Invariant: every element reads as a valid f16 (zero until written; released pages read as
//! zero again); the mapping is unmapped when the `Scratch` is dropped.

use std::io;

use half::f16;

/// An anonymous mapping of `len` f16 elements (module doc).
pub(crate) struct Scratch {
    ptr: *mut f16,
    len: usize,
}

impl Scratch {
    /// A zeroed mapping of `len` elements (none resident yet); an error where the kernel
    /// refuses the mapping.
    pub fn zeroed(len: usize) -> io::Result<Scratch> {
        if len == 0 {
            return Ok(Scratch { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0 });
        }
        let bytes = len * std::mem::size_of::<f16>();
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Scratch { ptr: p.cast(), len })
    }

    /// The elements.
    pub fn as_mut_slice(&mut self) -> &mut [f16] {
        // SAFETY: `ptr` is a live mapping of `len` f16 (or dangling with `len == 0`); the
        // kernel zero-fills its pages, and zero bits are a valid f16.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Hands the pages of elements `range` back to the kernel (`MADV_DONTNEED`): no longer
    /// resident, zero when read again. Pages only partly inside `range` are kept.
    pub fn release(&mut self, range: std::ops::Range<usize>) {
        let page = 4096usize;
        let size = std::mem::size_of::<f16>();
        let base = self.ptr as usize;
        let start = (base + range.start.min(self.len) * size).next_multiple_of(page);
        let end = (base + range.end.min(self.len) * size) / page * page;
        if end > start {
            // SAFETY: `start..end` lies inside the mapping, page-aligned; the pages hold
            // nothing anyone borrows (`&mut self`).
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `zeroed`, unmapped once.
            unsafe { libc::munmap(self.ptr.cast(), self.len * std::mem::size_of::<f16>()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_is_zero_keeps_what_is_written_and_reads_zero_after_release() {
        let mut s = Scratch::zeroed(3 * 4096).unwrap();
        assert!(s.as_mut_slice().iter().all(|x| x.to_bits() == 0));
        s.as_mut_slice()[5000] = f16::from_f32(1.5);
        s.as_mut_slice()[10] = f16::from_f32(2.0);
        assert_eq!(s.as_mut_slice()[5000], f16::from_f32(1.5));
        // Only whole pages inside the range go: element 10 (first page) stays.
        s.release(2048..3 * 4096);
        assert_eq!(s.as_mut_slice()[5000].to_bits(), 0);
        assert_eq!(s.as_mut_slice()[10], f16::from_f32(2.0));
        assert_eq!(Scratch::zeroed(0).unwrap().as_mut_slice().len(), 0);
    }
}
