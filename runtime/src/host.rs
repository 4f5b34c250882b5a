//! What the program running the VM provides for progress bars and plots.
//!
//! The runtime neither prints nor draws (nothing below the root package
//! does): `for i in progress(a..b)`, `progress_note(..)` and `plot(..)` call
//! the [`Host`] installed with [`set_host`], and do nothing when there is
//! none (tests, embedders that do not want them). The `adjoint` command
//! installs one that draws bars with `indicatif` on a terminal and writes
//! plots to the file named by `--plot`.
//!
//! The host is process-wide, like a logger: the command line installs it
//! once, before running a program.

use std::sync::Mutex;

/// Hooks for the IO primitives that need the host program. Every method
/// has a default that does nothing.
pub trait Host: Send {
    /// A loop `for i in progress(lo..hi)` starts; `len = max(hi - lo, 0)`
    /// iterations. Loops may nest: bars form a stack.
    fn progress_start(&mut self, len: u64) {
        let _ = len;
    }
    /// `done` iterations of the innermost bar's loop are complete.
    fn progress_set(&mut self, done: u64) {
        let _ = done;
    }
    /// The message shown beside the innermost bar (`progress_note`).
    fn progress_note(&mut self, message: &str) {
        let _ = message;
    }
    /// The innermost bar's loop has ended.
    fn progress_end(&mut self) {}
    /// Runs `write` (which writes to standard output) with the bars
    /// hidden, so printed lines do not tear them.
    fn suspend(&mut self, write: &mut dyn FnMut()) {
        write()
    }
    /// `plot(y, title)`: one curve per column of `ys` (`columns` of them,
    /// row-major), against the row index.
    fn plot(&mut self, title: &str, ys: &[f64], columns: usize) -> Result<(), String> {
        let _ = (title, ys, columns);
        Ok(())
    }
}

static HOST: Mutex<Option<Box<dyn Host>>> = Mutex::new(None);

/// Installs the host (or removes it, with `None`); returns the previous one.
pub fn set_host(host: Option<Box<dyn Host>>) -> Option<Box<dyn Host>> {
    let mut slot = HOST.lock().unwrap_or_else(|e| e.into_inner());
    std::mem::replace(&mut *slot, host)
}

/// Calls `f` with the host, if one is installed.
pub fn with_host<R>(f: impl FnOnce(&mut (dyn Host + 'static)) -> R) -> Option<R> {
    let mut slot = HOST.lock().unwrap_or_else(|e| e.into_inner());
    slot.as_deref_mut().map(f)
}
