//! Process-wide memory settings for tensor workloads, and a counting
//! allocator that measures peak heap use.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Asks the C allocator to keep freed memory for reuse instead of handing
/// it back to the system, and to serve blocks up to 32 MiB from its heap
/// rather than from fresh mappings. A training or optimisation loop
/// allocates and frees tensors of megabytes at every step; with glibc's
/// defaults each of them is a new mapping (or a heap trimmed and grown
/// again), and every page of it costs a fault and zeroing by the kernel —
/// more than the arithmetic on it. The price is that memory freed by a
/// program stays with the process. Takes effect once per process; a no-op
/// where the allocator is not glibc's.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            extern "C" {
                fn mallopt(param: i32, value: i32) -> i32;
            }
            const M_TRIM_THRESHOLD: i32 = -1;
            const M_MMAP_THRESHOLD: i32 = -3;
            // SAFETY: `mallopt` only changes allocator parameters; glibc
            // makes it safe to call at any time.
            unsafe {
                // 32 MiB is the largest threshold glibc accepts.
                mallopt(M_MMAP_THRESHOLD, 32 << 20);
                mallopt(M_TRIM_THRESHOLD, i32::MAX);
            }
        });
    }
}

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting the bytes in use and their peak (for
/// `adjoint run --stats` and the benchmarks). A program opts in with
/// `#[global_allocator] static A: CountingAlloc = CountingAlloc;`; the
/// cost is two relaxed atomic operations per allocation.
pub struct CountingAlloc;

fn grew(by: usize) {
    let now = IN_USE.fetch_add(by, Relaxed) + by;
    if now > PEAK.load(Relaxed) {
        PEAK.fetch_max(now, Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counters are
// only bookkeeping.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            IN_USE.fetch_sub(layout.size(), Relaxed);
            grew(new_size);
        }
        p
    }
}

/// Heap bytes in use now (0 unless [`CountingAlloc`] is the allocator).
pub fn heap_in_use() -> usize {
    IN_USE.load(Relaxed)
}

/// The most heap bytes in use since the last [`reset_heap_peak`].
pub fn heap_peak() -> usize {
    PEAK.load(Relaxed)
}

/// Starts a new peak measurement from the bytes in use now.
pub fn reset_heap_peak() {
    PEAK.store(IN_USE.load(Relaxed), Relaxed);
}
