//! Helpers more than one benchmark uses: the read-bandwidth probe (`membw`, and `speed`'s decode
//! limit) and dropping a file from the page cache (`cache`'s and `dual-persist`'s cold reads).

use std::time::Instant;

use anyhow::Result;
use engram_kernels::stream_read;

/// Best-of-`reps` read bandwidth (GB/s, 10⁹ bytes) of [`stream_read`] over `buf` on the
/// current kernel pool.
pub fn read_gb_s(buf: &[u8], reps: usize) -> f64 {
    std::hint::black_box(stream_read(buf)); // first touch / warm-up
    let mut best = 0f64;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        std::hint::black_box(stream_read(std::hint::black_box(buf)));
        best = best.max(buf.len() as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// `n` pseudo-random bytes (xorshift), written so every page is really allocated.
pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut v = vec![0u8; n];
    for c in v.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        c.copy_from_slice(&s.to_le_bytes()[..c.len()]);
    }
    v
}

/// Asks the kernel to drop `path` from the page cache (clean pages only: entries are fsynced
/// when written) and returns the fraction of its pages still resident afterwards.
#[cfg(unix)]
pub fn evict_from_page_cache(path: &std::path::Path) -> Result<f64> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    // SAFETY: a valid open descriptor; the advice only affects caching.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    anyhow::ensure!(rc == 0, "posix_fadvise failed: {rc}");
    resident_fraction(&file)
}

#[cfg(unix)]
fn resident_fraction(file: &std::fs::File) -> Result<f64> {
    // SAFETY: read-only mapping of a file this process does not modify; only inspected by mincore.
    let map = unsafe { memmap2::Mmap::map(file)? };
    let page = 4096;
    let pages = map.len().div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `map.len()` bytes and `vec` has one byte per page.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), vec.as_mut_ptr()) };
    anyhow::ensure!(rc == 0, "mincore failed");
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages.max(1) as f64)
}

#[cfg(not(unix))]
pub fn evict_from_page_cache(_path: &std::path::Path) -> Result<f64> {
    Ok(1.0)
}

/// The CPU time so far, in nanoseconds, of the clock `clock` names
/// (`libc::CLOCK_THREAD_CPUTIME_ID`: the calling thread; `CLOCK_PROCESS_CPUTIME_ID`: every
/// thread of the process).
pub fn cpu_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; both clock ids are constants Linux defines.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
