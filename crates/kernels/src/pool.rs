//! The global kernel threads: a rayon pool ([`pool`]) and a fork-join team of the same size
//! ([`parallel_for`]), sized by [`set_num_threads`].
//!
//! Invariant: `pool()` and the team behind `parallel_for` always have the most recently
//! configured size. Neither is ever freed (`&'static` references may still be alive); both
//! are kept one per size and reused, so switching sizes back and forth (benchmarks) parks at
//! most one pool's and one team's threads per size.

use crate::team::Team;
use rayon::prelude::*;
use rayon::ThreadPool;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

static POOL: AtomicPtr<ThreadPool> = AtomicPtr::new(std::ptr::null_mut());
static TEAM: AtomicPtr<Team> = AtomicPtr::new(std::ptr::null_mut());
/// Serialises installs; holds every pool and team made so far, by size.
static LOCK: Mutex<Vec<(&'static ThreadPool, &'static Team)>> = Mutex::new(Vec::new());

fn default_threads() -> usize {
    // std exposes logical CPUs only; on SMT machines callers should pass physical cores.
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Makes the pool and team of `n` threads current (reusing ones made earlier); the caller
/// holds `LOCK`.
fn install(made: &mut Vec<(&'static ThreadPool, &'static Team)>, n: usize) -> &'static ThreadPool {
    let n = n.max(1);
    let (p, t) = match made.iter().find(|(p, _)| p.current_num_threads() == n) {
        Some(pt) => *pt,
        None => {
            let p = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("engram-kernel-{i}"))
                .build()
                .expect("failed to build the kernel thread pool");
            let p: &'static ThreadPool = Box::leak(Box::new(p));
            let t: &'static Team = Box::leak(Box::new(Team::new(n)));
            made.push((p, t));
            (p, t)
        }
    };
    TEAM.store(t as *const Team as *mut Team, Ordering::Release);
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

/// The team of the current size (made with the pool on first use).
fn team() -> &'static Team {
    let t = TEAM.load(Ordering::Acquire);
    if t.is_null() {
        let _ = pool();
        // SAFETY: `install` stores the team before the pool, and teams are leaked.
        return unsafe { &*TEAM.load(Ordering::Acquire) };
    }
    // SAFETY: teams are leaked, never freed.
    unsafe { &*t }
}

/// Calls `f(i)` once for every `i < pieces`, spread over the kernel threads, and returns when
/// all returned. Pieces must write disjoint outputs: which thread runs which is unspecified.
/// Runs on the fork-join team (the calling thread computes too); when the team is busy
/// (another thread's region, or `f` itself calls `parallel_for`) on the rayon pool instead.
pub fn parallel_for(pieces: usize, f: &(dyn Fn(usize) + Sync)) {
    if !team().run(pieces, f) {
        pool().install(|| (0..pieces).into_par_iter().for_each(f));
    }
}

/// Runs `work` on every piece: through [`parallel_for`] when there are at least two, else on
/// the calling thread. Each piece owns its outputs (disjoint slices, typically), so safe code
/// can spread a call over the threads and the result does not depend on which thread ran
/// which piece. (Activation quantization on the rayon pool, every block's slices collected
/// first, took 7× as long for 256 tokens × 2,048 columns: `docs/cpu-kernels.md`.)
pub(crate) fn in_pieces<P: Send>(pieces: impl Iterator<Item = P>, work: &(dyn Fn(P) + Sync)) {
    let pieces: Vec<Mutex<Option<P>>> = pieces.map(|p| Mutex::new(Some(p))).collect();
    let run = |i: usize| {
        let p = pieces[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = p {
            work(p);
        }
    };
    if pieces.len() >= 2 {
        parallel_for(pieces.len(), &run);
    } else {
        (0..pieces.len()).for_each(run);
    }
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
