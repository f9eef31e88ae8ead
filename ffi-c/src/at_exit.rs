//! dlock's shutdown at the process's exit, registered by the first client.
//! Its own file: the client module registers it and the lifecycle module
//! (which reads clients and locks) does not, so neither imports the other
//! back.

use std::sync::Once;

/// `lk_shutdown` at the process's exit, registered once, by the first
/// client. Nothing in a forked child (the core checks).
pub(crate) fn shutdown_at_exit() {
    static ONCE: Once = Once::new();
    extern "C" fn at_exit() {
        // No unwinding out of an exit handler.
        let _ = std::panic::catch_unwind(dlock_core::shutdown);
    }
    unsafe extern "C" {
        fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    }
    ONCE.call_once(|| {
        // SAFETY: registers a function that lives as long as the library
        // (glibc runs it at dlclose too).
        unsafe { atexit(at_exit) };
    });
}
