//! The global kernel pool: switching sizes reuses the pool made for a size
//! (threads are not leaked per switch), and `pool()` follows the latest size.

#[test]
fn switching_sizes_reuses_pools() {
    engram_kernels::set_num_threads(3);
    let three = engram_kernels::pool() as *const _;
    assert_eq!(engram_kernels::num_threads(), 3);
    engram_kernels::set_num_threads(0);
    assert_eq!(engram_kernels::num_threads(), 1, "0 means 1");
    engram_kernels::set_num_threads(3);
    assert_eq!(engram_kernels::pool() as *const _, three, "the 3-thread pool is reused, not made again");
    assert_eq!(engram_kernels::pool().install(|| rayon::current_num_threads()), 3);
}
