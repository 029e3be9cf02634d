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
    assert_eq!(engram_kernels::pool().install(rayon::current_num_threads), 3);
}

/// `parallel_for` from several threads at once, and from inside its own pieces: the team takes
/// one region at a time and the others run on the rayon pool; every piece runs exactly once.
#[test]
fn parallel_for_runs_every_piece_once_from_concurrent_and_nested_callers() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    engram_kernels::set_num_threads(2);
    std::thread::scope(|s| {
        for caller in 0..3 {
            s.spawn(move || {
                for round in 0..200usize {
                    let n = 1 + (round + caller) % 29;
                    let hits: Vec<AtomicUsize> = (0..n * 4).map(|_| AtomicUsize::new(0)).collect();
                    engram_kernels::parallel_for(n, &|i| {
                        engram_kernels::parallel_for(4, &|j| {
                            hits[i * 4 + j].fetch_add(1, Ordering::Relaxed);
                        });
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "caller {caller} round {round}");
                }
            });
        }
    });
}
