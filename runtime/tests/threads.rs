//! `join_kernel_pool` in a process of its own (it changes rayon's global
//! pool for the whole process).

use adjoint_runtime::threads::join_kernel_pool;
use rayon::prelude::*;

/// The joined thread is the pool's first worker, and work split from it
/// runs every item once; where the pool cannot be joined (one core), the
/// work still runs.
#[test]
fn a_joined_thread_runs_split_work_itself() {
    let joined = join_kernel_pool(None);
    let v: Vec<u64> = (0..1_000_000u64).collect();
    let s: u64 = v.par_iter().map(|x| x * 2).sum();
    assert_eq!(s, 999_999 * 1_000_000);
    if joined {
        assert_eq!(rayon::current_thread_index(), Some(0));
        assert!(rayon::current_num_threads() >= 2);
        // A second call finds the pool built.
        assert!(!join_kernel_pool(None));
    } else {
        assert_eq!(rayon::current_thread_index(), None);
    }
}
