//! Process-wide memory settings for tensor workloads, and a counting
//! allocator that measures peak heap use.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};

use mimalloc::MiMalloc;

/// Asks the C allocator to keep freed memory for reuse instead of handing
/// it back to the system, and to serve blocks up to 32 MiB from its heap
/// rather than from fresh mappings. A training or optimisation loop
/// allocates and frees tensors of megabytes at every step; with glibc's
/// defaults each of them is a new mapping (or a heap trimmed and grown
/// again), and every page of it costs a fault and zeroing by the kernel —
/// more than the arithmetic on it. The price is that memory freed by a
/// program stays with the process. Takes effect once per process; a no-op
/// where the allocator is not glibc's. (The `adjoint` binary allocates
/// through [`CountingAlloc`], on mimalloc; this is for embedders on the
/// default allocator, and for the C libraries the process loads.)
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

// Signed: counting may start after blocks it frees were allocated.
static IN_USE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Starts counting heap bytes (for [`heap_in_use`] and [`heap_peak`]).
/// Until then [`CountingAlloc`] does not touch its counters: an
/// allocation-heavy run (a loop interpreted by the VM) would pay two atomic
/// read-modify-writes per allocation for figures nobody reads.
pub fn count_heap() {
    COUNTING.store(true, Relaxed);
}

fn counting() -> bool {
    COUNTING.load(Relaxed)
}

/// The allocator of the `adjoint` binary and the benchmarks: mimalloc,
/// counting the bytes in use and their peak (for `adjoint run --stats`),
/// and keeping a few freed large blocks for reuse. A program opts in with
/// `#[global_allocator] static A: CountingAlloc = CountingAlloc;`; it
/// counts after [`count_heap`], at the cost of two relaxed atomic
/// operations per allocation, and otherwise one relaxed load.
///
/// Why mimalloc rather than glibc's `malloc`: a loop the VM interprets
/// allocates per step a few tensors of some KiB, frames, closures and
/// tuples, and frees them a step later. glibc serves blocks above 1 KiB
/// from its bins, with consolidation on free; mimalloc's per-thread free
/// lists by size class take a few instructions. Measured on the reversed
/// loop over 1000 f32 (`adjoint_bench loop_tensor_grad`) and on compile
/// times: see `docs/benchmarks.md`.
///
/// Blocks of [`LARGE_BLOCK`] bytes or more are mappings of their own,
/// which an allocator may hand back to the system when they are freed:
/// then every page of the next one costs a fault and zeroing by the kernel
/// when first written. A loop over a tensor of 16M floats (64 MiB) would
/// pay that at every step, more than the arithmetic. So up to [`LARGE_SLOTS`] freed large blocks (at most
/// [`LARGE_CACHE_BYTES`] together) are kept, and an allocation of the
/// same size and alignment takes one back. They do not count as in use.
pub struct CountingAlloc;

/// The smallest block the large-block cache keeps.
pub const LARGE_BLOCK: usize = 32 << 20;
/// How many freed large blocks are kept.
pub const LARGE_SLOTS: usize = 4;
/// The most bytes the kept blocks may hold together.
pub const LARGE_CACHE_BYTES: usize = 1 << 30;

/// The kept blocks: (address, size, alignment); size 0 is an empty slot.
struct LargeCache {
    lock: std::sync::atomic::AtomicBool,
    slots: std::cell::UnsafeCell<[(usize, usize, usize); LARGE_SLOTS]>,
}

// SAFETY: `slots` is only accessed with `lock` held.
unsafe impl Sync for LargeCache {}

static LARGE: LargeCache = LargeCache {
    lock: std::sync::atomic::AtomicBool::new(false),
    slots: std::cell::UnsafeCell::new([(0, 0, 0); LARGE_SLOTS]),
};

impl LargeCache {
    /// Runs `f` on the slots with the lock held (a spin lock: large
    /// blocks are rare and the critical sections a few comparisons).
    fn with<R>(&self, f: impl FnOnce(&mut [(usize, usize, usize); LARGE_SLOTS]) -> R) -> R {
        while self
            .lock
            .compare_exchange_weak(false, true, std::sync::atomic::Ordering::Acquire, Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is held, so no other thread touches the slots.
        let r = f(unsafe { &mut *self.slots.get() });
        self.lock.store(false, std::sync::atomic::Ordering::Release);
        r
    }

    /// A kept block of exactly this layout, taken out of the cache.
    fn take(&self, layout: Layout) -> Option<*mut u8> {
        self.with(|slots| {
            let s = slots
                .iter_mut()
                .find(|(_, size, align)| *size == layout.size() && *align == layout.align())?;
            let p = s.0 as *mut u8;
            *s = (0, 0, 0);
            Some(p)
        })
    }

    /// Keeps a freed block if there is room; `false` if the caller must
    /// free it.
    fn keep(&self, ptr: *mut u8, layout: Layout) -> bool {
        self.with(|slots| {
            let held: usize = slots.iter().map(|s| s.1).sum();
            if held + layout.size() > LARGE_CACHE_BYTES {
                return false;
            }
            match slots.iter_mut().find(|s| s.1 == 0) {
                Some(s) => {
                    *s = (ptr as usize, layout.size(), layout.align());
                    true
                }
                None => false,
            }
        })
    }
}

fn grew(by: usize) {
    if !counting() {
        return;
    }
    let by = by as isize;
    let now = IN_USE.fetch_add(by, Relaxed) + by;
    if now > PEAK.load(Relaxed) {
        PEAK.fetch_max(now, Relaxed);
    }
}

// SAFETY: every call is forwarded to `MiMalloc` unchanged (or served by
// the large-block cache, which hands out only blocks `MiMalloc` made with
// the same layout); the counters are
// only bookkeeping.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE_BLOCK {
            if let Some(p) = LARGE.take(layout) {
                grew(layout.size());
                return p;
            }
        }
        let p = unsafe { MiMalloc.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { MiMalloc.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() < LARGE_BLOCK || !LARGE.keep(ptr, layout) {
            unsafe { MiMalloc.dealloc(ptr, layout) };
        }
        if counting() {
            IN_USE.fetch_sub(layout.size() as isize, Relaxed);
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { MiMalloc.realloc(ptr, layout, new_size) };
        if !p.is_null() && counting() {
            IN_USE.fetch_sub(layout.size() as isize, Relaxed);
            grew(new_size);
        }
        p
    }
}

/// Heap bytes allocated and not freed since [`count_heap`] (0 unless
/// [`CountingAlloc`] is the allocator). Blocks allocated before counting
/// started and freed after it make this negative, which wraps: compare
/// readings with `wrapping_sub`.
pub fn heap_in_use() -> usize {
    IN_USE.load(Relaxed) as usize
}

/// The most of [`heap_in_use`] since the last [`reset_heap_peak`].
pub fn heap_peak() -> usize {
    PEAK.load(Relaxed) as usize
}

/// Starts a new peak measurement from the bytes in use now.
pub fn reset_heap_peak() {
    PEAK.store(IN_USE.load(Relaxed), Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_freed_blocks_are_reused() {
        let a = CountingAlloc;
        let layout = Layout::from_size_align(LARGE_BLOCK + 4096, 64).unwrap();
        // SAFETY: each block is freed once, with the layout it was made with.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            p.write_bytes(7, layout.size());
            a.dealloc(p, layout);
            let q = a.alloc(layout);
            assert_eq!(p, q, "the kept block is handed out again");
            // Another size does not take it.
            let other = Layout::from_size_align(LARGE_BLOCK + 8192, 64).unwrap();
            let r = a.alloc(other);
            assert_ne!(r, q);
            a.dealloc(r, other);
            a.dealloc(q, layout);
            // Both were kept (room for four); take them out and free them.
            let q2 = a.alloc(layout);
            let r2 = a.alloc(other);
            assert_eq!((q2, r2), (q, r));
            MiMalloc.dealloc(q2, layout);
            MiMalloc.dealloc(r2, other);
        }
    }
}
