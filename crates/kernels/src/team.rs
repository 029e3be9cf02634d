//! A fork-join team for the kernels' short parallel regions ([`Team::run`]): the calling
//! thread and `n - 1` helper threads that spin briefly between regions, then sleep.
//!
//! Why not the rayon pool: a decode step is ~80 parallel regions of 0.05–2 ms each (one per
//! fused matmul and one per attention layer). Reached from a thread outside the pool, each
//! region paid rayon's cold path: the caller parks on a latch and the workers wake from
//! sleep. That cost ~11 µs per region on a 2-core Zen 4, about 4% of a one-row step.
//! Here the caller computes pieces itself and the helpers are still spinning when the next
//! region comes, as in llama.cpp's ggml thread pool.
//!
//! Invariants:
//! * `run(n, f)` calls `f(i)` exactly once for every `i < n` and returns after all calls
//!   returned; which thread runs a piece is unspecified, so pieces must own disjoint
//!   outputs (results never depend on the assignment).
//! * One region at a time: a caller that finds the team busy (another thread's region, or a
//!   piece that itself calls `run`) gets `false` back and nothing is run, so it can take
//!   another path ([`crate::parallel_for`] falls back to the rayon pool). A team with more
//!   threads than CPUs has no helpers and refuses every region the same way.
//! * A panic in a piece is caught where it happens; the region still waits for every other
//!   piece (they borrow the caller's stack), then the panic resumes on the caller.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::{Duration, Instant};

/// How long an idle helper spins for the next region before it sleeps. Decode steps run
/// their regions back to back (gaps of a few µs) and step to step the engine samples for
/// ~0.1 ms; past this a helper sleeps and the next region pays one wake-up.
const SPIN: Duration = Duration::from_micros(200);

/// Spins between yields of the CPU while waiting (to the scheduler: let a preempted thread
/// of this region run).
const SPINS_PER_YIELD: u32 = 64;

/// Pieces per region the state word can count (16 bits); larger regions are refused.
pub const MAX_PIECES: usize = u16::MAX as usize;

type Piece = dyn Fn(usize) + Sync;

/// The region word: epoch (32 bits) | pieces (16) | next unclaimed piece (16). A claim is a
/// compare-and-swap of the whole word, so a helper can only claim a piece of the region whose
/// epoch it read, and a region's job is alive while any of its pieces is claimed and running.
fn word(epoch: u32, pieces: usize, next: usize) -> u64 {
    ((epoch as u64) << 32) | ((pieces as u64) << 16) | next as u64
}
fn epoch_of(w: u64) -> u32 {
    (w >> 32) as u32
}
fn pieces_of(w: u64) -> usize {
    ((w >> 16) & 0xffff) as usize
}
fn next_of(w: u64) -> usize {
    (w & 0xffff) as usize
}

struct Shared {
    state: AtomicU64,
    /// The current region's pieces; written only while no piece is claimed (between regions),
    /// read only after a successful claim.
    job: UnsafeCell<Option<*const Piece>>,
    /// Pieces of the current region that returned (or panicked).
    done: AtomicU32,
    /// The first panic of the current region, resumed on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    panicked: AtomicBool,
    /// Helpers asleep (or about to be); the caller wakes them only when there are some.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is the only non-Sync field; it is written by the region's caller while no
// helper may read it (no piece claimed) and read by helpers only after a claim, which the
// caller's Release publication of `state` orders after the write (see `Team::run`).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// The team: `threads - 1` helpers plus whichever thread calls [`Team::run`].
pub struct Team {
    shared: Arc<Shared>,
    threads: usize,
    /// More threads than the CPUs the process may use: the team has no helpers and refuses
    /// every region, which then run on the rayon pool. Spinning threads would hold the cores
    /// the working ones need (`--threads 4` on 2 cores, one-row step: 23.6–28.2 ms with the
    /// team, 17.1–21.2 with rayon).
    oversubscribed: bool,
    /// Held for the length of a region (one region at a time).
    region: Mutex<()>,
}

impl Team {
    /// Starts `threads - 1` helper threads (none for 0 or 1). They live as long as the
    /// process; the pool keeps one team per size.
    pub fn new(threads: usize) -> Team {
        Team::with_cpus(threads, std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// [`Team::new`] for a process that may use `cpus` CPUs.
    fn with_cpus(threads: usize, cpus: usize) -> Team {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            done: AtomicU32::new(0),
            panic: Mutex::new(None),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let oversubscribed = threads > cpus;
        if !oversubscribed {
            for i in 1..threads {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("engram-team-{i}"))
                    .spawn(move || helper(&s))
                    .expect("failed to start a kernel team thread");
            }
        }
        Team { shared, threads, oversubscribed, region: Mutex::new(()) }
    }

    /// Runs `f(0..pieces)` on the team and the calling thread; `false` (nothing run) when the
    /// team is busy with another region, oversubscribed, or `pieces > MAX_PIECES`.
    pub fn run(&self, pieces: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
        if pieces > MAX_PIECES || self.oversubscribed {
            return false;
        }
        let _region = match self.region.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        if pieces == 0 {
            return true;
        }
        if self.threads == 1 || pieces == 1 {
            (0..pieces).for_each(f);
            return true;
        }
        let s = &*self.shared;
        // SAFETY: every piece of the previous region completed before its `run` returned, so
        // no helper holds a claim; a helper reads `job` only after claiming a piece of the
        // region published below. The lifetime is erased, and `run` returns only after all
        // pieces returned.
        unsafe {
            let erased: *const Piece = std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Piece>(f);
            *s.job.get() = Some(erased);
        }
        s.done.store(0, Ordering::Relaxed);
        let epoch = epoch_of(s.state.load(Ordering::Relaxed)).wrapping_add(1);
        s.state.store(word(epoch, pieces, 0), Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        work(s, epoch);
        // Wait for the pieces helpers claimed; they borrow this frame.
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < pieces as u32 {
            pause(&mut spins);
        }
        if s.panicked.swap(false, Ordering::Acquire) {
            let p = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
            resume_unwind(p.unwrap_or_else(|| Box::new("a kernel team piece panicked")));
        }
        true
    }
}

/// One wait of a spin loop: a spin hint, or every [`SPINS_PER_YIELD`]th call a yield of the
/// CPU (then `true`, the loop's moment to check a deadline).
fn pause(spins: &mut u32) -> bool {
    *spins = spins.wrapping_add(1);
    if *spins % SPINS_PER_YIELD == 0 {
        std::thread::yield_now();
        true
    } else {
        std::hint::spin_loop();
        false
    }
}

/// Claims and runs pieces of region `epoch` until none is left (or a newer region started).
fn work(s: &Shared, epoch: u32) {
    loop {
        let w = s.state.load(Ordering::Acquire);
        if epoch_of(w) != epoch || next_of(w) >= pieces_of(w) {
            return;
        }
        if s.state.compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            continue;
        }
        // SAFETY: the claim holds the region open (its caller waits for this piece), and the
        // caller wrote `job` before publishing the epoch we claimed under.
        let f = unsafe { (*s.job.get()).expect("a published region has a job") };
        let r = catch_unwind(AssertUnwindSafe(|| unsafe { (*f)(next_of(w)) }));
        if let Err(p) = r {
            let mut slot = s.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(p);
            s.panicked.store(true, Ordering::Release);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

/// A helper: waits for each new epoch (spinning, then asleep), works on it, repeats.
fn helper(s: &Shared) {
    let mut seen = 0u32;
    loop {
        let epoch = wait_for_region(s, seen);
        seen = epoch;
        work(s, epoch);
    }
}

/// The epoch of the next region after `seen`: spins for [`SPIN`], then sleeps until woken.
fn wait_for_region(s: &Shared, seen: u32) -> u32 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let e = epoch_of(s.state.load(Ordering::Acquire));
        if e != seen {
            return e;
        }
        if pause(&mut spins) && start.elapsed() > SPIN {
            break;
        }
    }
    let mut g = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    let e = loop {
        let e = epoch_of(s.state.load(Ordering::SeqCst));
        if e != seen {
            break e;
        }
        g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
    };
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_piece_runs_once_over_many_regions() {
        let team = Team::with_cpus(3, 3);
        for round in 0..2000usize {
            let n = 1 + round % 37;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            assert!(team.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            }));
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "round {round}");
            if round % 500 == 0 {
                // Let the helpers fall asleep, so the wake-up path runs too.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    #[test]
    fn a_busy_team_refuses_a_nested_region() {
        let team = Team::with_cpus(2, 2);
        let nested = AtomicUsize::new(0);
        assert!(team.run(4, &|_| {
            if !team.run(2, &|_| {}) {
                nested.fetch_add(1, Ordering::Relaxed);
            }
        }));
        assert_eq!(nested.load(Ordering::Relaxed), 4, "every nested call was refused, not run or deadlocked");
    }

    #[test]
    fn a_panicking_piece_resumes_on_the_caller_after_the_others() {
        let team = Team::with_cpus(2, 2);
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            team.run(16, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 7 {
                    panic!("piece 7");
                }
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 16);
        // The team still works afterwards.
        let hits = AtomicUsize::new(0);
        assert!(team.run(8, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        }));
        assert_eq!(hits.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn an_oversubscribed_team_refuses_every_region() {
        let team = Team::with_cpus(4, 2);
        assert!(!team.run(8, &|_| panic!("nothing runs on a refused region")));
    }
}
