//! The process's lifecycle, as the core decides it: shutdown at exit and a
//! cancellable acquisition. Each function converts and calls the core
//! (`dlock::shutdown`, `Client::shutdown`, `Lock::acquire_then`,
//! `Acquisition::cancel`).

use std::ffi::c_void;
use std::time::Duration;

use dlock_core::Acquisition;

use crate::client::lk_client;
use crate::lock::{UserData, lk_lock};
use crate::{arg, boxed, ffi, lk_status, out, status_of};

/// Ends every session of every client of this process at once: every held
/// lock's key is deleted (each session's lease revoked), the sessions in
/// parallel, and it returns once they are done or after one keepalive
/// timeout in total, whatever the service does. Afterwards every handle
/// behaves as closed: `lk_permit` refuses `LK_RELEASED`, acquiring fails
/// with `LK_SHUTDOWN`, release and close do nothing; the handles are still
/// freed as usual. Clients made afterwards work as usual. Idempotent;
/// callable from any thread, also from a callback.
///
/// dlock runs it by itself when the process exits (`exit()` or a return
/// from `main`; registered with `atexit` by the first client), so a
/// program that exits while holding lets the next holder in at once
/// instead of a TTL later. A signal that kills the process, or `_exit`,
/// leaves the lease to expire.
#[unsafe(no_mangle)]
pub extern "C" fn lk_shutdown() -> lk_status {
    ffi!({
        dlock_core::shutdown();
        Ok(())
    })
}

/// `lk_shutdown` for this client's sessions only (its default session and
/// those of `lk_session_new`): other clients are untouched. Freeing the
/// last handle of a client (the client, its sessions and locks) ends its
/// sessions the same way, without waiting.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_client_shutdown(client: *const lk_client) -> lk_status {
    ffi!({
        unsafe { arg(client, "client") }?.client.shutdown();
        Ok(())
    })
}

/// `done(user_data, status, token)`: the outcome of `lk_lock_acquire_start`,
/// once: `LK_OK` with the token, or the status `lk_lock_acquire` would have
/// returned (`LK_RELEASED` after `lk_acquisition_cancel`).
pub type lk_acquire_done_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, status: lk_status, token: u64)>;

/// What runs when an acquisition ends (`lk_lock_acquire_start`,
/// `lk_election_campaign_start`): `done` (NULL: nothing) with `user_data`
/// and `LK_OK` and the token, or the failure's status and 0.
pub(crate) fn report(
    done: lk_acquire_done_fn,
    user_data: *mut c_void,
) -> impl FnOnce(Result<dlock_core::Token, dlock_core::Error>) + Send + 'static {
    let ud = UserData(user_data);
    move |r| {
        let ud = ud;
        let Some(done) = done else { return };
        let (status, token) = match r {
            Ok(t) => (lk_status::LK_OK, t.get()),
            Err(e) => (status_of(e.status()), 0),
        };
        // SAFETY: the application's callback with its own user_data
        // (the header's rules for callbacks).
        unsafe { done(ud.0, status, token) };
    }
}

/// A pending acquisition (`lk_lock_acquire_start`): cancel it with
/// `lk_acquisition_cancel`, free it with `lk_acquisition_free`. It keeps
/// nothing alive: the lock may be freed first.
pub struct lk_acquisition {
    inner: Acquisition,
}

impl lk_acquisition {
    /// The handle of `inner` (for `lk_election_campaign_start`).
    pub(crate) fn new(inner: Acquisition) -> lk_acquisition {
        lk_acquisition { inner }
    }
}

/// Starts acquiring `lock` and returns at once: `done` (may be NULL) then
/// runs exactly once, on dlock's callback thread (in order with the lock's
/// callbacks), with the outcome. `timeout_ms` as for `lk_lock_acquire` (0:
/// try once, `LK_WOULD_BLOCK` if held). `*acquisition_out` is the handle
/// that cancels it; free it with `lk_acquisition_free` whenever you are
/// done with it (before or after `done` ran). A status other than `LK_OK`
/// (a NULL argument, `LK_FORKED`): nothing started, `done` never runs;
/// every failure of the acquisition itself (`LK_SHUTDOWN` too) comes
/// through `done`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_acquire_start(
    lock: *const lk_lock,
    timeout_ms: u64,
    done: lk_acquire_done_fn,
    user_data: *mut c_void,
    acquisition_out: *mut *mut lk_acquisition,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let dest = unsafe { out(acquisition_out, "acquisition_out") }?;
        let timeout = Some(Duration::from_millis(timeout_ms));
        let inner = lock
            .lock
            .acquire_then(true, timeout, report(done, user_data));
        boxed(dest, lk_acquisition { inner });
        Ok(())
    })
}

/// Leaves nothing held by this acquisition, whenever it is called: a wait
/// in the queue ends (`done`, if it has not run, gets `LK_RELEASED`), a key
/// its request put is deleted, and if it already succeeded the lock is
/// released (only while it still holds the token this acquisition won).
/// Never blocks; calling it again does nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_acquisition_cancel(acquisition: *const lk_acquisition) -> lk_status {
    ffi!({
        unsafe { arg(acquisition, "acquisition") }?.inner.cancel();
        Ok(())
    })
}

/// Frees the handle (NULL: nothing). It does not cancel: the acquisition
/// goes on and `done` still runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_acquisition_free(acquisition: *mut lk_acquisition) {
    ffi!(value { unsafe { crate::free_handle(acquisition) } })
}
