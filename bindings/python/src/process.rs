//! The process's lifecycle as the core decides it: the shutdown every
//! exit runs, and fork detection.

use pyo3::prelude::*;

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
