//! The fork guard. A child of `fork()` inherits the parent's lock handles
//! but not its driver thread: it holds nothing, and nothing it does may touch
//! the parent's leases.

use std::sync::atomic::{AtomicBool, Ordering};

static FORKED: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn in_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Registers the child-side fork handler (once, before the driver starts).
pub(crate) fn watch() {
    #[cfg(unix)]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: `in_child` only stores to an atomic, which is
        // async-signal-safe, as a handler run after fork() must be.
        ONCE.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        });
    }
}

/// Whether this process is a fork of a process that used dlock. In such a
/// child every call fails with [`crate::Error::Forked`], `permit()` refuses
/// with `not_held` and no permit is valid; dropping handles there leaves the
/// parent's leases alone.
#[inline]
pub fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}
