//! Threads with large stacks for the compiler's recursive passes.
//!
//! Inference and several passes recurse over the program's nesting, so
//! they run on threads with stacks of hundreds of megabytes. Only the
//! pages a run touches are backed, but a fresh thread's touched pages are
//! faulted in (and zeroed) again on every start: starting one per
//! inference cost a tenth of compiling a loop-heavy program. A thread
//! started here records where its stack begins, so code on it can ask how
//! much is left ([`stack_left`]) and recurse in place when that is enough.

use std::cell::Cell;

thread_local! {
    /// On threads started by [`with_stack`]: an address near the top of
    /// the stack, and the stack's size.
    static LARGE: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// Runs `f` on a new thread named `name` with a stack of `bytes`, and
/// waits for it: `Err` if the thread could not be started, `Ok(Err(..))`
/// with the payload if `f` panicked.
pub fn with_stack<T: Send>(
    name: &str,
    bytes: usize,
    f: impl FnOnce() -> T + Send,
) -> std::io::Result<std::thread::Result<T>> {
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name(name.into())
            .stack_size(bytes)
            .spawn_scoped(s, || {
                let top = 0u8;
                LARGE.with(|c| c.set(Some((&top as *const u8 as usize, bytes))));
                f()
            })?;
        Ok(handle.join())
    })
}

/// The bytes of stack left below the caller, on a thread started by
/// [`with_stack`]; `None` on other threads (whose size is unknown).
pub fn stack_left() -> Option<usize> {
    let here = 0u8;
    let sp = std::hint::black_box(&here) as *const u8 as usize;
    let (top, size) = LARGE.with(|c| c.get())?;
    Some(size.saturating_sub(top.saturating_sub(sp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_left_is_known_on_large_stack_threads_only() {
        assert_eq!(stack_left(), None);
        let left = with_stack("t", 64 << 20, || {
            let outer = stack_left().unwrap();
            // Deeper frames see less.
            fn deeper(n: usize) -> usize {
                let pad = std::hint::black_box([0u8; 1024]);
                if n == 0 {
                    stack_left().unwrap() + pad[0] as usize
                } else {
                    deeper(n - 1)
                }
            }
            (outer, deeper(16))
        })
        .unwrap()
        .unwrap();
        assert!(left.0 > (63 << 20) && left.0 <= 64 << 20, "{left:?}");
        assert!(left.1 < left.0 - 16 * 1024, "{left:?}");
        let r = with_stack("t", 1 << 20, || -> usize { panic!("boom") }).unwrap();
        assert!(r.is_err());
    }
}
