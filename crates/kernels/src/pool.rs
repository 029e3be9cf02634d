//! The global kernel thread pool ([`pool`], [`set_num_threads`], [`num_threads`]).
//!
//! Invariant: `pool()` always returns the most recently configured pool; a replaced pool is
//! leaked (its idle threads stay parked) because `&'static ThreadPool` references to it may
//! still be alive. `set_num_threads` is meant to be called once at startup.

use rayon::ThreadPool;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

static POOL: AtomicPtr<ThreadPool> = AtomicPtr::new(std::ptr::null_mut());
static LOCK: Mutex<()> = Mutex::new(());

fn default_threads() -> usize {
    // std exposes logical CPUs only; on SMT machines callers should pass physical cores.
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn install(n: usize) -> &'static ThreadPool {
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .thread_name(|i| format!("engram-kernel-{i}"))
        .build()
        .expect("failed to build the kernel thread pool");
    let p: &'static ThreadPool = Box::leak(Box::new(p));
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
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let p = POOL.load(Ordering::Acquire);
    if !p.is_null() {
        return unsafe { &*p };
    }
    install(default_threads())
}

/// Sets the size of the global kernel thread pool (`n = 0` is treated as 1). Replaces the pool
/// if the size changes.
pub fn set_num_threads(n: usize) {
    let n = n.max(1);
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let p = POOL.load(Ordering::Acquire);
    if !p.is_null() && unsafe { &*p }.current_num_threads() == n {
        return;
    }
    install(n);
}

/// Number of threads in the global kernel pool.
pub fn num_threads() -> usize {
    pool().current_num_threads()
}
