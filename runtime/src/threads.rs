//! Which threads run the kernels that split their work.
//!
//! Large kernels (fused maps, reductions, products, GEMM epilogues) split
//! their work over rayon's global pool. A thread outside the pool that
//! starts such a kernel hands it to the pool's workers and sleeps until
//! they finish: every kernel then costs two thread hand-overs, and on a
//! machine with as many workers as cores the woken workers, which spin a
//! while before sleeping again, compete with the VM's thread for the cores
//! between kernels. A program's steps alternate interpreted work on one
//! thread with parallel kernels, so this is paid at every kernel.
//!
//! [`join_kernel_pool`] makes the calling thread (a command-line tool's
//! main thread, which runs the VM) one of the pool's workers instead: it
//! takes the first share of each split itself, and the other workers steal
//! the rest.

/// Makes the calling thread a worker of rayon's global pool, so that the
/// kernels it starts run partly on it (see the module documentation).
/// Returns whether it did: it does not when the global pool already
/// exists (built by an earlier call or by a first parallel kernel), and
/// it does not when the pool would have fewer than two threads, since a
/// pool whose only worker is this thread could run nothing submitted by
/// other threads while this one waits for them (a compiler thread that
/// folds a product, say).
///
/// Call it once, early, on the thread that will run programs, and keep
/// that thread alive while the process runs kernels: a command-line
/// tool's main thread. `threads` is the pool's size (`None`: one per
/// core; the command line passes `RAYON_NUM_THREADS`).
pub fn join_kernel_pool(threads: Option<usize>) -> bool {
    let threads = threads.filter(|&n| n > 0).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    if threads < 2 {
        return false;
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .use_current_thread()
        .build_global()
        .is_ok()
}
