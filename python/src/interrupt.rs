//! Ctrl-C during a call.
//!
//! Python's SIGINT handler only notes the signal; the `KeyboardInterrupt`
//! is raised later, on the main thread, between bytecodes. While the main
//! thread runs compiled code there are no bytecodes, so for the duration
//! of a call made on the main thread a handler of ours is put in front of
//! Python's: it sets Adjoint's interrupt flag
//! ([`adjoint::request_interrupt`], which the VM polls at every call and
//! loop step and native loops poll at every iteration) and then runs
//! Python's handler. When the call returns (with an `interrupted` error),
//! Python's handler is back in place, the flag is cleared and
//! `PyErr_CheckSignals` raises the `KeyboardInterrupt`.
//!
//! The flag is process-wide: calls running on other threads at that moment
//! stop too, with an `AdjointError` ("interrupted"). Calls on other
//! threads install nothing (Python delivers signals to the main thread
//! only). Installing and removing the handler are two `sigaction` calls.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use pyo3::prelude::*;

/// Python's handler (an `sa_handler` or, with `SA_SIGINFO`, an
/// `sa_sigaction`), which ours calls after setting the flag.
static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS_SIGINFO: AtomicBool = AtomicBool::new(false);
/// Whether our handler ran since the last [`take_seen`].
static SEEN: AtomicBool = AtomicBool::new(false);
/// The main thread (`threading.main_thread().ident`, a `pthread_t`).
static MAIN_THREAD: OnceLock<u64> = OnceLock::new();

pub(crate) fn init(py: Python<'_>) -> PyResult<()> {
    let ident: u64 = py
        .import("threading")?
        .call_method0("main_thread")?
        .getattr("ident")?
        .extract()?;
    let _ = MAIN_THREAD.set(ident);
    // Python's handler as it is now, so that a signal arriving while the
    // first call installs ours finds it.
    // SAFETY: a query of the current action into an initialised structure.
    unsafe {
        let mut now: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGINT, std::ptr::null(), &mut now) == 0 {
            remember(&now);
        }
    }
    Ok(())
}

/// Records `action` as the handler ours chains to.
fn remember(action: &libc::sigaction) {
    PREVIOUS_SIGINFO.store(action.sa_flags & libc::SA_SIGINFO != 0, Ordering::SeqCst);
    PREVIOUS.store(action.sa_sigaction, Ordering::SeqCst);
}

/// Whether this is Python's main thread (the one signals are handled on).
pub(crate) fn on_main_thread() -> bool {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    MAIN_THREAD.get() == Some(&me)
}

/// Whether Ctrl-C arrived during the call; clears Adjoint's interrupt flag
/// when it did.
pub(crate) fn take_seen() -> bool {
    if SEEN.swap(false, Ordering::SeqCst) {
        adjoint::clear_interrupt();
        true
    } else {
        false
    }
}

extern "C" fn on_sigint(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Only atomic stores and the chained call: async-signal-safe.
    SEEN.store(true, Ordering::SeqCst);
    adjoint::request_interrupt();
    let prev = PREVIOUS.load(Ordering::SeqCst);
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN || prev == 0 {
        return;
    }
    // SAFETY: `prev` is the handler the kernel had for SIGINT before ours,
    // called with the arguments of its kind.
    unsafe {
        if PREVIOUS_SIGINFO.load(Ordering::SeqCst) {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(prev);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(prev);
            f(sig);
        }
    }
}

/// Our handler installed for SIGINT; dropping it puts the previous one
/// back.
pub(crate) struct SigintGuard {
    old: libc::sigaction,
}

impl SigintGuard {
    /// Installs the handler, unless SIGINT is ignored or has its default
    /// action (the program did not ask for Python's handling).
    pub(crate) fn install() -> Option<SigintGuard> {
        // SAFETY: plain sigaction calls with initialised structures.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigint as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGINT, &new, &mut old) != 0 {
                return None;
            }
            if old.sa_sigaction == new.sa_sigaction {
                // Already ours: a call made from inside another (through a
                // `sys.stdout` written in Python); the outer one restores.
                return None;
            }
            if old.sa_sigaction == libc::SIG_DFL || old.sa_sigaction == libc::SIG_IGN {
                libc::sigaction(libc::SIGINT, &old, std::ptr::null_mut());
                return None;
            }
            remember(&old);
            Some(SigintGuard { old })
        }
    }
}

impl Drop for SigintGuard {
    fn drop(&mut self) {
        // SAFETY: puts back the action read when installing.
        unsafe {
            libc::sigaction(libc::SIGINT, &self.old, std::ptr::null_mut());
        }
    }
}
