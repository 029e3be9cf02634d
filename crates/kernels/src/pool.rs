//! The global kernel thread pool ([`pool`], [`set_num_threads`], [`num_threads`]).
//!
//! Invariant: `pool()` always returns the most recently configured pool. Pools are never freed
//! (`&'static ThreadPool` references may still be alive) but are kept one per size and reused,
//! so switching sizes back and forth (benchmarks) parks at most one pool's threads per size.

use rayon::ThreadPool;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

static POOL: AtomicPtr<ThreadPool> = AtomicPtr::new(std::ptr::null_mut());
/// Serialises installs; holds every pool made so far, by size.
static LOCK: Mutex<Vec<&'static ThreadPool>> = Mutex::new(Vec::new());

fn default_threads() -> usize {
    // std exposes logical CPUs only; on SMT machines callers should pass physical cores.
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Makes the pool of `n` threads current (reusing one made earlier); the caller holds `LOCK`.
fn install(made: &mut Vec<&'static ThreadPool>, n: usize) -> &'static ThreadPool {
    let n = n.max(1);
    let p = match made.iter().find(|p| p.current_num_threads() == n) {
        Some(p) => *p,
        None => {
            let p = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("engram-kernel-{i}"))
                .build()
                .expect("failed to build the kernel thread pool");
            let p: &'static ThreadPool = Box::leak(Box::new(p));
            made.push(p);
            p
        }
    };
    POOL.store(p as *const ThreadPool as *mut ThreadPool, Ordering::Release);
    p
}

/// The pool the kernels run on; the model also uses it for attention. Created on first use
/// with [`std::thread::available_parallelism`] threads unless [`set_num_threads`] ran first.
pub fn pool() -> &'static ThreadPool {
    let p = POOL.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: pools are leaked, never freed.
        return unsafe { &*p };
    }
    let mut made = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let p = POOL.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as above.
        return unsafe { &*p };
    }
    install(&mut made, default_threads())
}

/// Sets the size of the global kernel thread pool (`n = 0` is treated as 1): switches to the
/// pool of that size, made on first request.
pub fn set_num_threads(n: usize) {
    let n = n.max(1);
    let mut made = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    install(&mut made, n);
}

/// Number of threads in the global kernel pool.
pub fn num_threads() -> usize {
    pool().current_num_threads()
}
