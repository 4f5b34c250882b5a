//! Process-wide memory settings for tensor workloads.

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
