//! Holder identity (issue 31): `lk_lock_holder` reads who holds a lock
//! (any process) into the caller's `lk_holder`; the strings are the
//! library's until `lk_holder_clear`.

use std::ffi::{CString, c_char, c_uint};

use dlock_core::LockHolder;

use crate::lk_status;
use crate::lock::lk_lock;
use crate::{arg, ffi, out};

/// The version of `struct lk_holder` this header describes.
pub const LK_HOLDER_VERSION: c_uint = 1;

/// A lock's holder as the service sees it, filled by `lk_lock_holder`. Set
/// `version` (`LK_HOLDER_INIT`) before the call; the strings are the
/// library's until `lk_holder_clear`, which every filled struct needs
/// (filling one again clears it first).
#[repr(C)]
pub struct lk_holder {
    /// `LK_HOLDER_VERSION`.
    pub version: c_uint,
    /// False: nothing holds the lock (every other field zero).
    pub held: bool,
    /// The holder's key, `<name>/<lease hex>` (NUL-terminated).
    pub key: *const c_char,
    /// Its fencing token.
    pub token: u64,
    /// The lease it is held under.
    pub lease: i64,
    /// False for a holder that records no identity (`etcdctl lock`): the
    /// fields below are then zero.
    pub has_identity: bool,
    /// The holder's host name.
    pub host: *const c_char,
    /// Its process id.
    pub pid: u32,
    /// When its process started, Unix seconds (0: unknown).
    pub started: u64,
    /// The face that made its client ("c", "cpp", "python", …) and its
    /// version.
    pub face: *const c_char,
    pub face_version: *const c_char,
    /// Its application's description, or NULL.
    pub description: *const c_char,
}

fn c_string(s: &str) -> *const c_char {
    CString::new(s.replace('\0', "?"))
        .unwrap_or_default()
        .into_raw()
}

fn free_string(p: *const c_char) {
    if !p.is_null() {
        // SAFETY: made by `c_string` with CString::into_raw.
        drop(unsafe { CString::from_raw(p as *mut c_char) });
    }
}

/// Frees what a filled holder holds and zeroes it (its version kept).
fn clear(h: &mut lk_holder) {
    for p in [h.key, h.host, h.face, h.face_version, h.description] {
        free_string(p);
    }
    *h = empty(h.version);
}

fn empty(version: c_uint) -> lk_holder {
    lk_holder {
        version,
        held: false,
        key: std::ptr::null(),
        token: 0,
        lease: 0,
        has_identity: false,
        host: std::ptr::null(),
        pid: 0,
        started: 0,
        face: std::ptr::null(),
        face_version: std::ptr::null(),
        description: std::ptr::null(),
    }
}

fn fill(dest: &mut lk_holder, h: Option<&LockHolder>) {
    clear(dest);
    let Some(h) = h else { return };
    dest.held = true;
    dest.key = c_string(&h.key);
    dest.token = h.token.get();
    dest.lease = h.lease;
    if let Some(id) = &h.identity {
        dest.has_identity = true;
        dest.host = c_string(&id.host);
        dest.pid = id.pid;
        dest.started = id.started.unwrap_or(0);
        dest.face = c_string(&id.face);
        dest.face_version = c_string(&id.version);
        dest.description = id.description.as_deref().map_or(std::ptr::null(), c_string);
    }
}

/// Reads who holds the lock now (any process; one read of the service,
/// blocking for it) into `*holder_out`, whose `version` the caller set:
/// `held` false when nothing holds it. `LK_BACKEND` when the service
/// cannot be read.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_holder(
    lock: *const lk_lock,
    holder_out: *mut lk_holder,
) -> lk_status {
    ffi!({
        let l = unsafe { arg(lock, "lock") }?;
        let dest = unsafe { out(holder_out, "holder_out") }?;
        crate::known_version("lk_holder", dest.version, LK_HOLDER_VERSION)?;
        let h = l.lock.holder()?;
        fill(dest, h.as_ref());
        Ok(())
    })
}

/// Frees what `lk_lock_holder` put in `*holder` and zeroes it (its
/// `version` kept). NULL, or an empty one: nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_holder_clear(holder: *mut lk_holder) {
    ffi!(value {
        // SAFETY: NULL or a struct filled by this library (or zeroed).
        if let Some(h) = unsafe { holder.as_mut() } {
            clear(h);
        }
    })
}
