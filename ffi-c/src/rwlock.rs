//! Read/write locks (docs/design.md §27): many readers or one writer on a
//! name. Each function converts and calls the core's `RwLock`; a reader
//! or writer is an ordinary `lk_lock` (acquire, permits, callbacks,
//! fencing and free are a lock's), and the queue, the grant and the
//! downgrade are the core's.

use std::ffi::{CString, c_char};

use dlock_core::{Mode, RwLock};

use crate::client::lk_client;
use crate::lk_status;
use crate::lock::lk_lock;
use crate::session::lk_session;
use crate::{arg, boxed, ffi, out};

/// A read/write lock: makes readers and writers (`lk_rwlock_reader`,
/// `lk_rwlock_writer`). Holds nothing itself: freeing it leaves the locks
/// made from it as they are (free those on their own).
pub struct lk_rwlock {
    rwlock: RwLock,
    /// The name as given, for `lk_rwlock_name`.
    name: CString,
}

/// A lock's mode (`lk_lock_mode`).
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum lk_mode {
    /// A plain lock (`lk_lock_new`, a semaphore's, an election's): it
    /// queues as a writer.
    LK_MODE_NONE = 0,
    /// A read/write lock's reader: holds together with other readers.
    LK_MODE_READ = 1,
    /// A read/write lock's writer: holds alone.
    LK_MODE_WRITE = 2,
}

fn made(rwlock: RwLock, name: &str) -> lk_rwlock {
    lk_rwlock {
        rwlock,
        name: CString::new(name).unwrap_or_default(),
    }
}

/// A read/write lock called `name` on `client`'s default session
/// (`lk_session_rwlock_new` for another session). Sends nothing. Readers
/// that share a name need sessions (or clients) of their own: two holders
/// of one name on one session exclude each other whatever their modes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_rwlock_new(
    client: *const lk_client,
    name: *const c_char,
    rwlock_out: *mut *mut lk_rwlock,
) -> lk_status {
    crate::new_named!(client, name, rwlock_out => made(client.client.rwlock(name)?, name))
}

/// As `lk_rwlock_new`, on `session`: its readers and writers are held
/// under that session's lease.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_rwlock_new(
    session: *const lk_session,
    name: *const c_char,
    rwlock_out: *mut *mut lk_rwlock,
) -> lk_status {
    crate::new_named!(session, name, rwlock_out => made(session.session().rwlock(name)?, name))
}

/// `mode`'s holder of `rw`, a new `lk_lock`, not acquired yet.
unsafe fn holder(rw: *const lk_rwlock, lock_out: *mut *mut lk_lock, mode: Mode) -> lk_status {
    ffi!({
        let rw = unsafe { arg(rw, "rwlock") }?;
        let dest = unsafe { out(lock_out, "lock_out") }?;
        let lock = rw.rwlock.holder(mode)?;
        let name = lock.name().to_owned();
        boxed(dest, lk_lock::new(lock, &name));
        Ok(())
    })
}

/// A new reader: `*lock_out` is an ordinary `lk_lock` in `LK_MODE_READ`,
/// not acquired yet (`lk_lock_acquire`, ..., `lk_lock_free`). It holds
/// together with other readers and waits for every earlier writer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_rwlock_reader(
    rwlock: *const lk_rwlock,
    lock_out: *mut *mut lk_lock,
) -> lk_status {
    unsafe { holder(rwlock, lock_out, Mode::Read) }
}

/// A new writer: as `lk_rwlock_reader`, in `LK_MODE_WRITE`. It holds
/// alone: after every earlier holder, and ahead of every later reader.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_rwlock_writer(
    rwlock: *const lk_rwlock,
    lock_out: *mut *mut lk_lock,
) -> lk_status {
    unsafe { holder(rwlock, lock_out, Mode::Write) }
}

/// The read/write lock's name, as given; NULL for a NULL handle. Valid
/// until the handle is freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_rwlock_name(rwlock: *const lk_rwlock) -> *const c_char {
    ffi!(value {
        // SAFETY: NULL or a handle made by lk_rwlock_new.
        unsafe { rwlock.as_ref() }.map_or(std::ptr::null(), |r| r.name.as_ptr())
    })
}

/// Frees a read/write lock handle (NULL: nothing). Its readers and writers
/// stay as they are: free each on its own.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_rwlock_free(rwlock: *mut lk_rwlock) {
    ffi!(value { unsafe { crate::free_handle(rwlock) } })
}

/// `lock`'s current mode: `LK_MODE_READ` / `LK_MODE_WRITE` for a read/write
/// lock's holder (a writer is `LK_MODE_READ` once downgraded),
/// `LK_MODE_NONE` for a plain lock.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_mode(lock: *const lk_lock, mode_out: *mut lk_mode) -> lk_status {
    crate::getter!(lock, mode_out => match lock.lock.mode() {
        None => lk_mode::LK_MODE_NONE,
        Some(Mode::Read) => lk_mode::LK_MODE_READ,
        Some(Mode::Write) => lk_mode::LK_MODE_WRITE,
    })
}

/// A held writer becomes a reader: its key and token stay, and readers
/// queued behind it hold. A reader's downgrade does nothing. Blocks for
/// one request (at most about a TTL). `LK_INVALID_ARGUMENT`: a plain lock;
/// `LK_NOT_HELD` / `LK_FENCED`: not holding. There is no upgrade (two
/// upgrading readers would wait for each other): release the reader and
/// acquire a writer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_downgrade(lock: *const lk_lock) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        lock.lock.downgrade()?;
        Ok(())
    })
}
