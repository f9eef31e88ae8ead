//! The process's lifecycle as the core decides it: the shutdown every
//! exit runs, and fork detection.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// Set by the exit hook: no core thread enters Python any more.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Core threads inside [`attach_from_core`] now.
static INSIDE: AtomicUsize = AtomicUsize::new(0);

/// The one way a core thread (callbacks, completions, the log) enters
/// Python: never once the exit hook ran. A thread that takes the GIL while
/// the interpreter finalizes is ended by `pthread_exit`, which aborts the
/// process through the Rust frames below it; so the exit hook waits,
/// without the GIL, for every thread already inside to leave.
pub(crate) fn attach_from_core<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    INSIDE.fetch_add(1, SeqCst);
    // SeqCst both ways: a thread that counted itself after the hook's
    // last look sees EXITING set.
    let r = if EXITING.load(SeqCst) {
        None
    } else {
        Python::try_attach(f)
    };
    INSIDE.fetch_sub(1, SeqCst);
    r
}

/// The `atexit` hook: [`shutdown`], then no core thread enters Python
/// again, and those inside have left (waited for at most 2 s: a callback
/// of the application's that never returns is not waited for past it).
#[pyfunction]
pub(crate) fn _at_exit(py: Python<'_>) {
    py.detach(|| {
        dlock::shutdown();
        EXITING.store(true, SeqCst);
        let until = Instant::now() + Duration::from_secs(2);
        while INSIDE.load(SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Ends every session of every client of this process at once: every held
/// lock's key is deleted (each lease revoked), bounded by one keepalive
/// timeout in total; afterwards every handle behaves as closed. What the
/// `atexit` hook runs. Idempotent; nothing in a forked child.
#[pyfunction]
pub(crate) fn shutdown(py: Python<'_>) {
    py.detach(dlock::shutdown);
}

/// Whether this process is a child of `fork()` of a process that used
/// dlock (every handle then raises `Forked`).
#[pyfunction]
pub(crate) fn forked() -> bool {
    dlock::forked()
}
