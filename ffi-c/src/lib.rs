//! The C ABI of dlock: `libdlock.so`, `libdlock.a` and `include/dlock.h`
//! (generated from this crate by cbindgen; see `ffi-c/cbindgen.toml`).
//!
//! This crate only converts between C and the core crate: every decision
//! about leases, deadlines and tokens is the core's. Every `extern "C"`
//! function runs its body inside [`ffi!`], which turns a panic into
//! `LK_PANIC` and, for functions returning a status, answers `LK_FORKED` in
//! a child of `fork()`.
// C names on purpose: the header is generated from these items.
#![allow(non_camel_case_types)]
// The safety rules of every function (valid handles, NUL-terminated strings,
// one thread ending a permit) are stated once, at the top of the header.
#![allow(clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use dlock_core::{Code, Error, Reason, Refused, State};

pub mod client;
pub mod lock;
// After `lock`, in this order: the header lists items as declared here
// (and rustfmt would sort one group).
pub mod session;
// After `session`.
pub mod fence;
// After `fence`.
pub mod lifecycle;
// After `lifecycle`.
pub mod metrics;
// After `metrics`.
pub mod election;
// After `election`.
pub mod observer;
// After `observer`.
pub mod semaphore;
// After `lock`: a lock's holder (issue 31).
pub mod holder;
// After `semaphore`.
pub mod rwlock;
// No exports: the shutdown the first client registers at exit.
mod at_exit;

/// The outcome of every fallible `lk_` function. `LK_OK` is 0; the names
/// (`lk_status_name`) are the error codes every dlock binding shares.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum lk_status {
    /// Success.
    LK_OK = 0,
    /// `lk_permit`: a keepalive failed; no new work until one is confirmed.
    LK_DRAINING = 1,
    /// `lk_permit`: the deadline passed or the lease was lost. Guarded
    /// writes: the token no longer holds the lock.
    LK_FENCED = 2,
    /// The lock was released.
    LK_RELEASED = 3,
    /// The lock is not held (not acquired yet, or no token now).
    LK_NOT_HELD = 4,
    /// Not acquired within the timeout.
    LK_TIMEOUT = 5,
    /// `lk_lock_try_acquire`: another holder has the lock.
    LK_WOULD_BLOCK = 6,
    /// This handle already holds the lock.
    LK_ALREADY_HELD = 7,
    /// A setting of `lk_client_options` breaks a rule (the message names it).
    LK_INVALID_OPTION = 8,
    /// An argument is not acceptable (the message says which and why).
    LK_INVALID_ARGUMENT = 9,
    /// A required pointer argument was NULL.
    LK_NULL_PARAMETER = 10,
    /// The lock service failed or could not be reached.
    LK_BACKEND = 11,
    /// The library's driver thread is gone (process shutting down).
    LK_SHUTDOWN = 12,
    /// Called in a child of `fork()`: the handles belong to the parent.
    LK_FORKED = 13,
    /// `lk_fence_gate_admit`: a higher token was already seen.
    LK_STALE = 14,
    /// A bug in dlock: a Rust panic was caught at the boundary.
    LK_PANIC = 15,
}

use lk_status::*;

/// A failed call: its status, with the thread's last error already set.
pub(crate) struct Fail(pub(crate) lk_status);

impl Fail {
    pub(crate) fn new(status: lk_status, message: impl Into<Vec<u8>>) -> Fail {
        set_last_error(message);
        Fail(status)
    }

    pub(crate) fn null(what: &str) -> Fail {
        Fail::new(LK_NULL_PARAMETER, format!("`{what}` must not be NULL"))
    }

    pub(crate) fn invalid(message: impl Into<Vec<u8>>) -> Fail {
        Fail::new(LK_INVALID_ARGUMENT, message)
    }
}

/// The C status of a core code: the same number (checked by
/// `codes_are_the_cores`).
pub(crate) fn status_of(c: Code) -> lk_status {
    match c {
        Code::Ok => LK_OK,
        Code::Draining => LK_DRAINING,
        Code::Fenced => LK_FENCED,
        Code::Released => LK_RELEASED,
        Code::NotHeld => LK_NOT_HELD,
        Code::Timeout => LK_TIMEOUT,
        Code::WouldBlock => LK_WOULD_BLOCK,
        Code::AlreadyHeld => LK_ALREADY_HELD,
        Code::InvalidOption => LK_INVALID_OPTION,
        Code::InvalidArgument => LK_INVALID_ARGUMENT,
        Code::NullParameter => LK_NULL_PARAMETER,
        Code::Backend => LK_BACKEND,
        Code::Shutdown => LK_SHUTDOWN,
        Code::Forked => LK_FORKED,
        Code::Stale => LK_STALE,
        Code::Panic => LK_PANIC,
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::new(status_of(e.status()), e.to_string())
    }
}

impl From<Refused> for Fail {
    fn from(r: Refused) -> Fail {
        Fail(status_of(r.status()))
    }
}

pub(crate) type Res = Result<(), Fail>;

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_last_error(message: impl Into<Vec<u8>>) {
    let mut bytes = message.into();
    bytes.retain(|&b| b != 0);
    let message = CString::new(bytes).unwrap_or_default();
    // try_with: a thread being torn down has no thread-locals left.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = Some(message));
}

/// What a non-status function returns when its body panicked.
pub(crate) trait OnPanic {
    fn on_panic() -> Self;
}

impl OnPanic for () {
    fn on_panic() {}
}

impl OnPanic for bool {
    fn on_panic() -> bool {
        false
    }
}

impl OnPanic for *const c_char {
    fn on_panic() -> *const c_char {
        c"panic".as_ptr()
    }
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("panic in dlock (a bug, please report it): {msg}")
}

/// Runs the body of a status function: `LK_FORKED` in a forked child, the
/// body's status otherwise, `LK_PANIC` if it panicked.
#[inline(always)]
pub(crate) fn status_boundary(body: impl FnOnce() -> Res) -> lk_status {
    if dlock_core::forked() {
        // The core's message, defined once (`Error::Forked`).
        return Fail::new(LK_FORKED, Error::Forked.to_string()).0;
    }
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => LK_OK,
        Ok(Err(Fail(status))) => status,
        Err(panic) => Fail::new(LK_PANIC, panic_message(panic)).0,
    }
}

/// Runs the body of a function that returns no status: its value, or
/// [`OnPanic::on_panic`] if it panicked.
#[inline(always)]
pub(crate) fn value_boundary<T: OnPanic>(body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(panic) => {
            set_last_error(panic_message(panic));
            T::on_panic()
        }
    }
}

/// The one panic boundary, around the body of every `extern "C"` function.
/// `ffi!({ ... Ok(()) })` for a function returning `lk_status`;
/// `ffi!(value { ... })` for one returning a plain value.
macro_rules! ffi {
    (value $body:block) => {
        $crate::value_boundary(move || $body)
    };
    ($body:block) => {
        $crate::status_boundary(move || -> $crate::Res { $body })
    };
}
pub(crate) use ffi;

/// The body of each constructor of a named handle (a lock, an election, a
/// read/write lock, a semaphore, an observer) on a client or a session:
/// `new_named!(owner, name, x_out => handle)` checks the owner, the name
/// and the out-parameter in that order (NULL: `LK_NULL_PARAMETER` naming
/// the parameter), binding `owner` and `name` to the checked values for
/// `handle`, then stores the new handle in `*x_out`.
macro_rules! new_named {
    ($owner:ident, $name:ident, $dest:ident => $handle:expr) => {
        $crate::ffi!({
            let $owner = unsafe { $crate::arg($owner, stringify!($owner)) }?;
            let $name = unsafe { $crate::text($name, stringify!($name)) }?;
            let dest = unsafe { $crate::out($dest, stringify!($dest)) }?;
            $crate::boxed(dest, $handle);
            Ok(())
        })
    };
}
pub(crate) use new_named;

/// The body of each getter of one value: `getter!(handle, x_out => value)`
/// checks the handle and the out-parameter in that order (NULL:
/// `LK_NULL_PARAMETER` naming the parameter), binding `handle` to the
/// checked value for `value`, then writes `value` to `*x_out` (nothing
/// when `value` fails with `?`).
macro_rules! getter {
    ($handle:ident, $dest:ident => $value:expr) => {
        $crate::ffi!({
            let $handle = unsafe { $crate::arg($handle, stringify!($handle)) }?;
            let dest = unsafe { $crate::out($dest, stringify!($dest)) }?;
            *dest = $value;
            Ok(())
        })
    };
}
pub(crate) use getter;

/// A required input: `&*p`, or `LK_NULL_PARAMETER` naming it.
pub(crate) unsafe fn arg<'a, T>(p: *const T, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: the caller passes NULL or a valid pointer (header rules).
    unsafe { p.as_ref() }.ok_or_else(|| Fail::null(what))
}

/// A required out-parameter, written only on success.
pub(crate) unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Fail> {
    // SAFETY: the caller passes NULL or a valid, writable pointer.
    unsafe { p.as_mut() }.ok_or_else(|| Fail::null(what))
}

/// A required NUL-terminated UTF-8 string.
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    // SAFETY: the caller passes NULL or a NUL-terminated string.
    unsafe { opt_text(p, what) }?.ok_or_else(|| Fail::null(what))
}

/// An optional NUL-terminated UTF-8 string (NULL: none).
pub(crate) unsafe fn opt_text<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, Fail> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: not NULL; NUL-terminated by the header's rules.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(Some)
        .map_err(|_| Fail::invalid(format!("`{what}` is not valid UTF-8")))
}

/// Stores a new handle in its out-parameter.
pub(crate) fn boxed<T>(out: &mut *mut T, v: T) {
    *out = Box::into_raw(Box::new(v));
}

/// The check of a versioned struct's `version`, which the caller set from
/// its `_INIT`: 1 to `newest` (this header's), else `LK_INVALID_ARGUMENT`
/// naming the struct (`what`), the versions known and the initializer.
pub(crate) fn known_version(
    what: &str,
    version: std::ffi::c_uint,
    newest: std::ffi::c_uint,
) -> Res {
    if (1..=newest).contains(&version) {
        return Ok(());
    }
    Err(Fail::invalid(format!(
        "{what}.version is {version}, this library knows 1 to {newest}: start from {}_INIT",
        what.to_ascii_uppercase()
    )))
}

/// Frees a handle [`boxed`] made: the body of every `lk_*_free` (NULL:
/// nothing).
pub(crate) unsafe fn free_handle<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: made by `boxed` in the matching constructor, freed once
        // (header rules).
        drop(unsafe { Box::from_raw(p) });
    }
}

/// `len` bytes at `p`; NULL only with `len` 0 (no bytes).
pub(crate) unsafe fn bytes<'a>(p: *const u8, len: usize, what: &str) -> Result<&'a [u8], Fail> {
    if p.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(Fail::null(what))
        };
    }
    // SAFETY: `len` readable bytes at `p` (header rules).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// A required byte string (a key): never NULL, even with `len` 0.
pub(crate) unsafe fn key_bytes<'a>(p: *const u8, len: usize, what: &str) -> Result<&'a [u8], Fail> {
    if p.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: not NULL; `len` readable bytes at `p` (header rules).
    unsafe { bytes(p, len, what) }
}

/// Checks a lock or election name of `len` bytes by the core's one rule
/// (1 to `LK_MAX_NAME_LEN` bytes of UTF-8, no NUL): `LK_OK`, else
/// `LK_INVALID_ARGUMENT` with the core's message. For a face whose strings
/// carry a length and may hold a NUL (C++'s `std::string`), before it
/// passes the name as a C string; C's NUL-terminated names need no call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_check_name(name: *const u8, len: usize) -> lk_status {
    ffi!({
        let name = unsafe { key_bytes(name, len, "name") }?;
        dlock_core::options::check_name("lock", name)?;
        Ok(())
    })
}

/// Stable snake_case name of a status (`"ok"`, `"fenced"`, `"timeout"`, …),
/// the same word every dlock binding uses. Any value is accepted; unknown
/// ones give `"unknown"`. The string is static.
#[unsafe(no_mangle)]
pub extern "C" fn lk_status_name(status: c_int) -> *const c_char {
    ffi!(value { status_name(status).as_ptr() })
}

fn status_name(status: c_int) -> &'static CStr {
    Code::from_value(status).map_or(c"unknown", Code::as_cstr)
}

/// The message of the last call on this thread that failed (empty if none
/// did). Valid until the next failing `lk_` call on this thread; never NULL.
/// `lk_permit` refusals set no message: the status says it all.
#[unsafe(no_mangle)]
pub extern "C" fn lk_last_error() -> *const c_char {
    ffi!(value {
        LAST_ERROR
            .try_with(|e| e.borrow().as_deref().unwrap_or(c"").as_ptr())
            .unwrap_or(c"".as_ptr())
    })
}

/// The library's version, e.g. `"0.1.0"`. Static.
#[unsafe(no_mangle)]
pub extern "C" fn lk_version() -> *const c_char {
    ffi!(value { VERSION.as_ptr() })
}

const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("version"),
    };

/// Where a lock stands (the core's states).
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum lk_state {
    /// Not acquired yet, or the last acquisition failed.
    LK_STATE_IDLE = 0,
    /// Taking a lease and waiting for the lock.
    LK_STATE_ACQUIRING = 1,
    /// Holding: `lk_permit` grants until the deadline.
    LK_STATE_HOLDING = 2,
    /// A keepalive failed: no new permits, in-flight work finishes.
    LK_STATE_DRAINING = 3,
    /// The deadline passed or the lease was lost: the token is dead.
    LK_STATE_FENCED = 4,
    /// After a fence: acquiring again for a higher token.
    LK_STATE_REACQUIRING = 5,
    /// Released by the application.
    LK_STATE_RELEASED = 6,
}

pub(crate) const fn state_of(s: State) -> lk_state {
    use lk_state::*;
    match s {
        State::Idle => LK_STATE_IDLE,
        State::Acquiring => LK_STATE_ACQUIRING,
        State::Holding => LK_STATE_HOLDING,
        State::Draining => LK_STATE_DRAINING,
        State::Fenced => LK_STATE_FENCED,
        State::Reacquiring => LK_STATE_REACQUIRING,
        State::Released => LK_STATE_RELEASED,
    }
}

/// Name of a state as in traces and every binding (`"Holding"`, …);
/// `"unknown"` for any other value. Static.
#[unsafe(no_mangle)]
pub extern "C" fn lk_state_name(state: c_int) -> *const c_char {
    ffi!(value {
        usize::try_from(state)
            .ok()
            .and_then(|i| State::ALL.get(i))
            .map_or(c"unknown", |s| s.as_cstr())
            .as_ptr()
    })
}

/// Why a transition happened (the core's reasons).
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum lk_reason {
    /// The application asked to acquire.
    LK_REASON_ACQUIRE = 0,
    /// The lock service granted the lock.
    LK_REASON_ACQUIRED = 1,
    /// A keepalive got no reply within `keepalive_timeout`.
    LK_REASON_KEEPALIVE_TIMEOUT = 2,
    /// A keepalive failed (transport error, stream closed).
    LK_REASON_KEEPALIVE_FAILED = 3,
    /// A keepalive was confirmed before the deadline.
    LK_REASON_RESUMED = 4,
    /// The deadline passed with no confirmed keepalive.
    LK_REASON_DEADLINE = 5,
    /// The server said the lease no longer exists.
    LK_REASON_LEASE_LOST = 6,
    /// Acquiring again after a fence.
    LK_REASON_REACQUIRE = 7,
    /// Granted again, with a higher token.
    LK_REASON_REACQUIRED = 8,
    /// The application released the lock.
    LK_REASON_RELEASE = 9,
    /// Acquisition did not finish within its timeout.
    LK_REASON_ACQUIRE_TIMEOUT = 10,
    /// `try_acquire` found the lock held.
    LK_REASON_WOULD_BLOCK = 11,
    /// `try_acquire` failed on a backend error.
    LK_REASON_ACQUIRE_FAILED = 12,
    /// The lock key was deleted while the lease lived (an operator ran
    /// `etcdctl del`): someone else may take the lock at once, so the lock
    /// fences at once.
    LK_REASON_LOCK_LOST = 13,
    /// A reason newer than this header.
    LK_REASON_OTHER = 255,
}

pub(crate) fn reason_of(r: Reason) -> lk_reason {
    use lk_reason::*;
    match r {
        Reason::Acquire => LK_REASON_ACQUIRE,
        Reason::Acquired => LK_REASON_ACQUIRED,
        Reason::KeepaliveTimeout => LK_REASON_KEEPALIVE_TIMEOUT,
        Reason::KeepaliveFailed => LK_REASON_KEEPALIVE_FAILED,
        Reason::Resumed => LK_REASON_RESUMED,
        Reason::Deadline => LK_REASON_DEADLINE,
        Reason::LeaseLost => LK_REASON_LEASE_LOST,
        Reason::Reacquire => LK_REASON_REACQUIRE,
        Reason::Reacquired => LK_REASON_REACQUIRED,
        Reason::Release => LK_REASON_RELEASE,
        Reason::AcquireTimeout => LK_REASON_ACQUIRE_TIMEOUT,
        Reason::WouldBlock => LK_REASON_WOULD_BLOCK,
        Reason::AcquireFailed => LK_REASON_ACQUIRE_FAILED,
        Reason::LockLost => LK_REASON_LOCK_LOST,
        _ => LK_REASON_OTHER,
    }
}

/// Name of a reason as in traces and every binding (`"keepalive_timeout"`,
/// …); `"unknown"` for any other value. Static.
#[unsafe(no_mangle)]
pub extern "C" fn lk_reason_name(reason: c_int) -> *const c_char {
    ffi!(value {
        usize::try_from(reason)
            .ok()
            .and_then(|i| Reason::ALL.get(i))
            .map_or(c"unknown", |r| r.as_cstr())
            .as_ptr()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: lk_status) -> &'static str {
        status_name(s as c_int).to_str().unwrap()
    }

    /// The C tables are the core's code table: same numbers, same words.
    #[test]
    fn codes_are_the_cores() {
        for c in Code::ALL {
            assert_eq!(status_of(*c) as c_int, c.value(), "{c}");
            assert_eq!(name(status_of(*c)), c.as_str());
        }
        for r in [
            Refused::Draining,
            Refused::Fenced,
            Refused::Released,
            Refused::NotHeld,
        ] {
            assert_eq!(name(Fail::from(r).0), r.as_str());
        }
        // Every error's code (checked against the table in the core).
        let e = Error::Fenced(1);
        assert_eq!(name(Fail::from(e.clone()).0), e.code());
        for (i, s) in State::ALL.iter().enumerate() {
            assert_eq!(state_of(*s) as usize, i);
            let n = unsafe { CStr::from_ptr(lk_state_name(i as c_int)) };
            assert_eq!(n.to_str().unwrap(), s.as_str());
        }
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(reason_of(*r) as usize, i);
            let n = unsafe { CStr::from_ptr(lk_reason_name(i as c_int)) };
            assert_eq!(n.to_str().unwrap(), r.as_str());
        }
        assert_eq!(status_name(-1), c"unknown");
        assert_eq!(status_name(Code::ALL.len() as c_int), c"unknown");
    }

    #[test]
    fn a_panic_becomes_lk_panic_with_a_message() {
        let s = ffi!({
            if name(LK_OK) == "ok" {
                panic!("on purpose");
            }
            Ok(())
        });
        assert_eq!(s, LK_PANIC);
        let msg = unsafe { CStr::from_ptr(lk_last_error()) };
        assert!(msg.to_str().unwrap().contains("on purpose"), "{msg:?}");
        let v: bool = ffi!(value {
            if s == LK_PANIC {
                panic!("again");
            }
            true
        });
        assert!(!v);
    }
}
