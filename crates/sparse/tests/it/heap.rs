//! A counting global allocator for this test binary: each thread's live heap bytes and their
//! peak since [`reset_peak`], counted on the thread that allocates or frees (a block freed on
//! another thread counts there). Tests that measure a read run it on their own thread with
//! inline file reads, so what they see is that read's heap alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(n: isize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + n;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters move.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// This thread's live heap bytes.
pub fn live() -> isize {
    LIVE.with(|l| l.get())
}

/// Starts a new peak at this thread's live bytes.
pub fn reset_peak() {
    let v = live();
    PEAK.with(|p| p.set(v));
}

/// This thread's most live heap bytes since [`reset_peak`].
pub fn peak() -> isize {
    PEAK.with(|p| p.get())
}
