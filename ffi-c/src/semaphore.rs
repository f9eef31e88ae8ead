//! Semaphores (docs/design.md §26): N holders at once, each holding one
//! slot, an ordinary `lk_lock` named `<name>/slot/<i>`. Each function
//! converts and calls the core's `Semaphore`; the limit's record and
//! check, the queued wait and its cancel are the core's.

use std::ffi::{CString, c_char};
use std::time::Duration;

use dlock_core::Semaphore;

use crate::client::lk_client;
use crate::lk_status;
use crate::lock::lk_lock;
use crate::session::lk_session;
use crate::{Fail, arg, boxed, ffi, out};

/// The largest limit of a semaphore (the core's `MAX_SEMAPHORE_LIMIT`);
/// larger limits are `LK_INVALID_ARGUMENT`.
pub const LK_MAX_SEMAPHORE_LIMIT: u32 = 1024;
const _: () = assert!(LK_MAX_SEMAPHORE_LIMIT == dlock_core::MAX_SEMAPHORE_LIMIT);

/// A counting semaphore: at most its limit of holders at once, each
/// holding one slot's ordinary `lk_lock`. Holds nothing itself: freeing
/// it leaves the slots acquired from it held (free those locks).
pub struct lk_semaphore {
    semaphore: Semaphore,
    /// The name as given, for `lk_semaphore_name`.
    name: CString,
}

fn made(semaphore: Semaphore, name: &str) -> lk_semaphore {
    lk_semaphore {
        semaphore,
        name: CString::new(name).unwrap_or_default(),
    }
}

/// A semaphore of `limit` slots called `name` on `client`'s default
/// session (`lk_session_semaphore_new` for another session). The first
/// handle of `name` anywhere records `limit` on the lock service; a handle
/// asking for another limit is `LK_INVALID_ARGUMENT` (the message names
/// both), as are a limit of 0 or over `LK_MAX_SEMAPHORE_LIMIT` and a name
/// whose slot names (`<name>/slot/<i>`) are longer than `LK_MAX_NAME_LEN`.
/// Blocks for that one request (at most about a TTL; `LK_BACKEND` when the
/// service does not answer).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_semaphore_new(
    client: *const lk_client,
    name: *const c_char,
    limit: u32,
    semaphore_out: *mut *mut lk_semaphore,
) -> lk_status {
    crate::new_named!(client, name, semaphore_out =>
        made(client.client.semaphore(name, limit)?, name))
}

/// As `lk_semaphore_new`, on `session`: the slots acquired from it are
/// held under that session's lease.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_semaphore_new(
    session: *const lk_session,
    name: *const c_char,
    limit: u32,
    semaphore_out: *mut *mut lk_semaphore,
) -> lk_status {
    crate::new_named!(session, name, semaphore_out =>
        made(session.session().semaphore(name, limit)?, name))
}

/// Takes a slot, waiting up to `timeout_ms` for one to be free (0: one
/// try, as `lk_semaphore_try_acquire`); blocks the calling thread. On
/// success `*lock_out` is a new, held `lk_lock`: that slot's ordinary lock
/// (`lk_lock_slot`, `lk_lock_token`, `lk_permit`, callbacks, guarded
/// writes; `lk_lock_name` is the slot's lock name). Release it with
/// `lk_lock_release` or `lk_lock_free` (the slot passes to one waiter).
/// `LK_TIMEOUT`: every slot stayed held, nothing is held; `LK_RELEASED`
/// (the session is closed), `LK_BACKEND`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_semaphore_acquire(
    semaphore: *const lk_semaphore,
    timeout_ms: u64,
    lock_out: *mut *mut lk_lock,
) -> lk_status {
    ffi!({
        let s = unsafe { arg(semaphore, "semaphore") }?;
        let dest = unsafe { out(lock_out, "lock_out") }?;
        let lock = s.semaphore.acquire(Duration::from_millis(timeout_ms))?;
        let name = lock.name().to_owned();
        boxed(dest, lk_lock::new(lock, &name));
        Ok(())
    })
}

/// Takes a free slot if there is one (`*lock_out` as
/// `lk_semaphore_acquire`), else `LK_WOULD_BLOCK` with nothing held.
/// Blocks for at most about two keepalive timeouts per slot tried.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_semaphore_try_acquire(
    semaphore: *const lk_semaphore,
    lock_out: *mut *mut lk_lock,
) -> lk_status {
    ffi!({
        let s = unsafe { arg(semaphore, "semaphore") }?;
        let dest = unsafe { out(lock_out, "lock_out") }?;
        let lock = s.semaphore.try_acquire()?;
        let name = lock.name().to_owned();
        boxed(dest, lk_lock::new(lock, &name));
        Ok(())
    })
}

/// The semaphore's limit: how many holders it admits at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_semaphore_limit(
    semaphore: *const lk_semaphore,
    limit_out: *mut u32,
) -> lk_status {
    ffi!({
        let s = unsafe { arg(semaphore, "semaphore") }?;
        let dest = unsafe { out(limit_out, "limit_out") }?;
        *dest = s.semaphore.limit();
        Ok(())
    })
}

/// The semaphore's name, as given; NULL for a NULL semaphore. Valid until
/// the semaphore is freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_semaphore_name(semaphore: *const lk_semaphore) -> *const c_char {
    ffi!(value {
        // SAFETY: NULL or a semaphore made by lk_semaphore_new.
        unsafe { semaphore.as_ref() }.map_or(std::ptr::null(), |s| s.name.as_ptr())
    })
}

/// The semaphore slot `lock` is (0 to the limit − 1), for a lock from
/// `lk_semaphore_acquire` / `lk_semaphore_try_acquire`, held or not.
/// `LK_INVALID_ARGUMENT` for a lock that is not a semaphore's (from
/// `lk_lock_new`, `lk_session_lock_new`, an election's).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_slot(lock: *const lk_lock, slot_out: *mut u32) -> lk_status {
    crate::getter!(lock, slot_out => {
        let not_a_slot = || format!("lock `{}` is not a semaphore's slot", lock.lock.name());
        lock.lock.slot().ok_or_else(|| Fail::invalid(not_a_slot()))?
    })
}

/// Frees a semaphore handle (NULL: nothing). The locks acquired from it
/// stay held and valid: free each on its own.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_semaphore_free(semaphore: *mut lk_semaphore) {
    ffi!(value { unsafe { crate::free_handle(semaphore) } })
}
