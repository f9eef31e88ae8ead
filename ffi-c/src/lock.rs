//! Locks, permits, callbacks and guarded writes. Each function converts
//! and calls the core: what freeing a lock means (callbacks after it,
//! permits in flight) is the core's `Lock::close` / drop.

use std::ffi::{CString, c_char, c_uint, c_void};
use std::mem::{MaybeUninit, align_of, size_of};
use std::time::Duration;

use dlock_core::{Election, Lock, OwnedPermit, Token};

use crate::client::lk_client;
use crate::lk_status::{self, *};
use crate::{Fail, arg, bytes, ffi, key_bytes, lk_reason, lk_state, out};

/// One named lock. Freeing it releases the lock.
pub struct lk_lock {
    pub(crate) lock: Handle,
    /// The name as given, for `lk_lock_name`.
    name: CString,
}

/// What an `lk_lock` is: a lock, or an election's (`lk_election_lock`);
/// every lock function works on either through `Deref`.
pub(crate) enum Handle {
    Lock(Lock),
    Election(Election),
}

impl std::ops::Deref for Handle {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        match self {
            Handle::Lock(l) => l,
            Handle::Election(e) => e.lock(),
        }
    }
}

/// `user_data` crosses to the callback thread; the header makes the
/// application responsible for what it points to.
#[derive(Copy, Clone)]
pub(crate) struct UserData(pub(crate) *mut c_void);
// SAFETY: an opaque pointer the library never dereferences.
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}

impl lk_lock {
    /// The handle of `lock`, called `name` (a C string's: no NUL inside).
    pub(crate) fn new(lock: Lock, name: &str) -> lk_lock {
        lk_lock {
            lock: Handle::Lock(lock),
            name: CString::new(name).unwrap_or_default(),
        }
    }

    /// The handle of an election's lock, called `name`.
    pub(crate) fn election(election: Election, name: &str) -> lk_lock {
        lk_lock {
            lock: Handle::Election(election),
            name: CString::new(name).unwrap_or_default(),
        }
    }
}

/// Creates a handle on the lock `name` (1 to 1024 bytes of UTF-8) on
/// `client`'s default session (whose lease its other locks share;
/// `lk_session_lock_new` for another session). Not acquired yet: set
/// callbacks, then `lk_lock_acquire`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_new(
    client: *const lk_client,
    name: *const c_char,
    lock_out: *mut *mut lk_lock,
) -> lk_status {
    crate::new_named!(client, name, lock_out => lk_lock::new(client.client.lock(name)?, name))
}

/// The lock's name, as given to `lk_lock_new`; NULL for a NULL lock. Valid
/// until the lock is freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_name(lock: *const lk_lock) -> *const c_char {
    ffi!(value {
        // SAFETY: NULL or a lock made by lk_lock_new.
        unsafe { lock.as_ref() }.map_or(std::ptr::null(), |l| l.name.as_ptr())
    })
}

/// Frees a lock handle (NULL: nothing), releasing the lock without waiting
/// for its key's delete (`lk_lock_close` or `lk_lock_release` first to
/// wait).
/// After it returns, none of the lock's callbacks runs again: it waits for
/// the events queued before it and for one of its callbacks running now, so
/// do not call it holding a mutex that a callback takes. May be called from
/// a callback, even the lock's own. Permits still in flight stay safe to
/// end (from any thread, before or after) and are no longer valid; the
/// lock's state lives until the last one ends. In a forked child it frees
/// memory only: the parent's lease is left alone.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_free(lock: *mut lk_lock) {
    ffi!(value { unsafe { crate::free_handle(lock) } })
}

/// Releases the lock (waiting for the delete as `lk_lock_release` does) and
/// ends its callbacks: the events up to the release are delivered, then,
/// once it returns, none of the lock's callbacks runs again. The handle
/// stays valid (free it with `lk_lock_free`); permits in flight stay safe
/// to end and are no longer valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_close(lock: *const lk_lock) -> lk_status {
    ffi!({
        unsafe { arg(lock, "lock") }?.lock.close()?;
        Ok(())
    })
}

fn write_token(dest: *mut u64, t: Token) {
    // SAFETY: NULL or a valid out-parameter (checked by the caller).
    if let Some(d) = unsafe { dest.as_mut() } {
        *d = t.get();
    }
}

/// Acquires the lock, waiting up to `timeout_ms` behind another holder;
/// blocks the calling thread. On success writes the fencing token to
/// `token_out` (may be NULL). `LK_TIMEOUT`, `LK_ALREADY_HELD`,
/// `LK_RELEASED` (released meanwhile), `LK_BACKEND`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_acquire(
    lock: *const lk_lock,
    timeout_ms: u64,
    token_out: *mut u64,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let token = lock.lock.acquire(Duration::from_millis(timeout_ms))?;
        write_token(token_out, token);
        Ok(())
    })
}

/// Acquires the lock if nobody holds it, else `LK_WOULD_BLOCK`. Blocks for
/// at most about two keepalive timeouts. `token_out` may be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_try_acquire(
    lock: *const lk_lock,
    token_out: *mut u64,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let token = lock.lock.try_acquire()?;
        write_token(token_out, token);
        Ok(())
    })
}

/// Releases the lock: no permit is valid from now on. Returns once its key
/// is deleted (the session's lease lives on for its other locks), or after
/// a keepalive timeout if the service does not answer. The handle stays
/// usable (acquire again, or free it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_release(lock: *const lk_lock) -> lk_status {
    ffi!({
        unsafe { arg(lock, "lock") }?.lock.release()?;
        Ok(())
    })
}

/// The lock's current state.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_state(
    lock: *const lk_lock,
    state_out: *mut lk_state,
) -> lk_status {
    crate::getter!(lock, state_out => crate::state_of(lock.lock.state()))
}

fn not_held() -> Fail {
    Fail::new(
        LK_NOT_HELD,
        "the lock is not held (not Holding or Draining)",
    )
}

/// The token held, while Holding or Draining; else `LK_NOT_HELD`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_token(lock: *const lk_lock, token_out: *mut u64) -> lk_status {
    crate::getter!(lock, token_out => lock.lock.token().ok_or_else(not_held)?.get())
}

/// Milliseconds left before the deadline (0 once passed), while Holding or
/// Draining; else `LK_NOT_HELD`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_time_left(lock: *const lk_lock, ms_out: *mut u64) -> lk_status {
    crate::getter!(lock, ms_out => {
        let left = lock.lock.time_left().ok_or_else(not_held)?;
        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
    })
}

/// The local deadline in nanoseconds of `CLOCK_BOOTTIME` (compare with
/// `clock_gettime(CLOCK_BOOTTIME)`), while Holding or Draining; else
/// `LK_NOT_HELD`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_deadline(lock: *const lk_lock, ns_out: *mut u64) -> lk_status {
    crate::getter!(lock, ns_out => lock.lock.deadline().ok_or_else(not_held)?.as_nanos())
}

/// Units of work in flight (permits not yet ended).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_in_flight(lock: *const lk_lock, count_out: *mut u64) -> lk_status {
    crate::getter!(lock, count_out => lock.lock.in_flight())
}

/// The version of `struct lk_lock_stats` this header describes.
pub const LK_LOCK_STATS_VERSION: c_uint = 1;

/// What `lk_lock_stats` reports. Set `version` (`LK_LOCK_STATS_INIT`)
/// before the call: later releases add fields at the end and fill only
/// those of the version asked for.
#[repr(C)]
pub struct lk_lock_stats {
    /// `LK_LOCK_STATS_VERSION` (or any earlier version).
    pub version: c_uint,
    /// Acquisitions, first and after fences.
    pub acquisitions: u64,
    /// Drains begun (a failed keepalive while holding).
    pub drains: u64,
    /// Drains that ended with a confirmed keepalive.
    pub resumes: u64,
    /// Fences at the deadline.
    pub fences_deadline: u64,
    /// Fences on a lease-lost reply.
    pub fences_lease_lost: u64,
    /// Fences on a deleted lock key.
    pub fences_lock_lost: u64,
    /// Round trip of the last confirmed keepalive (µs); 0: none yet.
    pub last_keepalive_rtt_us: u64,
    /// Deadline − now (ms) while Holding or Draining; -1 otherwise.
    pub slack_ms: i64,
    /// Permits in flight.
    pub in_flight: u64,
}

/// Fills `*stats` (whose `version` the caller set) with the lock's counters,
/// the last keepalive's round trip, the slack and the permits in flight.
/// Cheap (atomics and one clock read). `LK_INVALID_ARGUMENT` for a version
/// this library does not know.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_stats(
    lock: *const lk_lock,
    stats: *mut lk_lock_stats,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let dest = unsafe { out(stats, "stats") }?;
        crate::known_version("lk_lock_stats", dest.version, LK_LOCK_STATS_VERSION)?;
        let st = lock.lock.stats();
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        *dest = lk_lock_stats {
            version: dest.version,
            acquisitions: st.acquisitions,
            drains: st.drains,
            resumes: st.resumes,
            fences_deadline: st.fences_deadline,
            fences_lease_lost: st.fences_lease_lost,
            fences_lock_lost: st.fences_lock_lost,
            last_keepalive_rtt_us: st.last_keepalive_rtt.map_or(0, us),
            slack_ms: st
                .slack
                .map_or(-1, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            in_flight: st.in_flight,
        };
        Ok(())
    })
}

/// `on_fence(user_data, token, in_flight)`: called once per fenced token,
/// with the number of permits then in flight. Stop the work now.
pub type lk_fence_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, token: u64, in_flight: u64)>;
/// `on_state_change(user_data, from, to, reason)`: every transition.
pub type lk_state_change_fn = Option<
    unsafe extern "C" fn(user_data: *mut c_void, from: lk_state, to: lk_state, reason: lk_reason),
>;
/// `on_acquired(user_data, token)`: every acquisition, first and after a fence.
pub type lk_acquired_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, token: u64)>;
/// `on_drained(user_data)`: the lock left Holding and no permit is in flight.
pub type lk_drained_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// Sets (or with `cb` NULL, removes) the lock's fence callback. See "Callbacks"
/// at the top of this header: it runs on dlock's callback thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_set_on_fence(
    lock: *const lk_lock,
    cb: lk_fence_fn,
    user_data: *mut c_void,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let ud = UserData(user_data);
        lock.lock.on_fence(move |token, in_flight| {
            if let Some(cb) = cb {
                let ud = ud;
                // SAFETY: the application's callback, with its own user_data.
                unsafe { cb(ud.0, token.get(), in_flight) };
            }
        });
        Ok(())
    })
}

/// Sets (or removes) the state-change callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_set_on_state_change(
    lock: *const lk_lock,
    cb: lk_state_change_fn,
    user_data: *mut c_void,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let ud = UserData(user_data);
        lock.lock.on_state_change(move |c| {
            if let Some(cb) = cb {
                let ud = ud;
                let (from, to) = (crate::state_of(c.from), crate::state_of(c.to));
                let reason = crate::reason_of(c.reason);
                // SAFETY: the application's callback, with its own user_data.
                unsafe { cb(ud.0, from, to, reason) };
            }
        });
        Ok(())
    })
}

/// Sets (or removes) the acquired callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_set_on_acquired(
    lock: *const lk_lock,
    cb: lk_acquired_fn,
    user_data: *mut c_void,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let ud = UserData(user_data);
        lock.lock.on_acquired(move |token| {
            if let Some(cb) = cb {
                let ud = ud;
                // SAFETY: the application's callback, with its own user_data.
                unsafe { cb(ud.0, token.get()) };
            }
        });
        Ok(())
    })
}

/// Sets (or removes) the drained callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_set_on_drained(
    lock: *const lk_lock,
    cb: lk_drained_fn,
    user_data: *mut c_void,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let ud = UserData(user_data);
        lock.lock.on_drained(move || {
            if let Some(cb) = cb {
                let ud = ud;
                // SAFETY: the application's callback, with its own user_data.
                unsafe { cb(ud.0) };
            }
        });
        Ok(())
    })
}

/// Permission for one unit of work. The caller owns the storage (no
/// allocation, no reference count on this path); the fields are private.
/// Declare it with `LK_PERMIT_INIT`, fill it with `lk_permit()`, end it with
/// `lk_permit_end()` (ending twice, or ending an unfilled one, does
/// nothing). A live permit may be moved (copied); from then on use and end
/// only the copy. End it before freeing its lock.
#[repr(C)]
pub struct lk_permit {
    _private: [u64; 4],
}

/// What `lk_permit` holds inside the caller's storage.
#[repr(C)]
struct Slot {
    /// `LIVE` while the permit is open; anything else: empty.
    live: u64,
    /// The core's permit: no allocation, no reference count, safe to end
    /// after its lock is freed.
    permit: MaybeUninit<OwnedPermit>,
}

/// "lkpermit": a zeroed or uninitialised struct is not mistaken for a live one.
const LIVE: u64 = 0x6c6b_7065_726d_6974;

const _: () = assert!(size_of::<Slot>() <= size_of::<lk_permit>());
const _: () = assert!(align_of::<Slot>() <= align_of::<lk_permit>());

fn slot(p: &lk_permit) -> &Slot {
    // SAFETY: same size and alignment (asserted above); all bit patterns of
    // `live` are valid and `permit` is only read when `live == LIVE`.
    unsafe { &*(p as *const lk_permit as *const Slot) }
}

fn live(p: &lk_permit) -> Option<&OwnedPermit> {
    let s = slot(p);
    // SAFETY: written by lk_permit together with LIVE.
    (s.live == LIVE).then(|| unsafe { s.permit.assume_init_ref() })
}

/// Permission to start one unit of work: `LK_OK` only while the lock is
/// Holding and before its deadline (the clock is read on every call);
/// refusals: `LK_DRAINING`, `LK_FENCED`, `LK_RELEASED`, `LK_NOT_HELD`.
/// On success fills `*permit_out`, counted in flight until
/// `lk_permit_end`; a live permit already there is overwritten, never
/// ended, so its lock would count it in flight for ever. No allocation, no
/// lock, no message on refusal.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_permit(lock: *const lk_lock, permit_out: *mut lk_permit) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        if permit_out.is_null() {
            return Err(Fail::null("permit_out"));
        }
        let permit = lock.lock.permit_owned()?;
        // SAFETY: valid, writable storage of the right size (header rules).
        unsafe {
            permit_out.cast::<Slot>().write(Slot {
                live: LIVE,
                permit: MaybeUninit::new(permit),
            })
        };
        Ok(())
    })
}

/// Ends the unit of work. NULL, an ended permit or one never filled: nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_permit_end(permit: *mut lk_permit) {
    ffi!(value {
        // SAFETY: NULL or the caller's permit storage.
        let Some(p) = (unsafe { permit.as_mut() }) else { return };
        // SAFETY: as in `slot`, mutable.
        let s = unsafe { &mut *(p as *mut lk_permit as *mut Slot) };
        if s.live == LIVE {
            s.live = 0;
            // SAFETY: live, so initialised; marked empty before the drop.
            drop(unsafe { s.permit.assume_init_read() });
        }
    })
}

/// Whether the work may still commit: the lock still holds the permit's
/// token and the deadline has not passed (read from the clock). False for
/// NULL, an ended permit, or in a forked child.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_permit_valid(permit: *const lk_permit) -> bool {
    ffi!(value {
        // SAFETY: NULL or the caller's permit storage.
        unsafe { permit.as_ref() }
            .and_then(live)
            .is_some_and(|p| p.valid())
    })
}

/// The token to send with every write this unit of work makes.
/// `LK_INVALID_ARGUMENT` if the permit is not live (ended or never filled).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_permit_token(
    permit: *const lk_permit,
    token_out: *mut u64,
) -> lk_status {
    ffi!({
        let p = unsafe { arg(permit, "permit") }?;
        let dest = unsafe { out(token_out, "token_out") }?;
        let p = live(p)
            .ok_or_else(|| Fail::invalid("the permit is not live (ended or never granted)"))?;
        *dest = p.token().get();
        Ok(())
    })
}

/// Puts `key` = `value` in the lock service only while this lock's key
/// still exists with `token` as its fencing token (on etcd one transaction
/// comparing the key's `create_revision`; the embedded service keeps the
/// same rule, read back with `lk_memory_get`). `LK_FENCED` (message names
/// the token) when the token no longer holds the lock, `LK_INVALID_ARGUMENT`
/// for an empty key, `LK_BACKEND` when the service does not answer within
/// the TTL. Blocks. `value` may be NULL when `value_len` is 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_guarded_put(
    lock: *const lk_lock,
    token: u64,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let key = unsafe { key_bytes(key, key_len, "key") }?;
        let value = unsafe { bytes(value, value_len, "value") }?;
        lock.lock.guarded_put(Token(token), key, value)?;
        Ok(())
    })
}

/// Deletes `key` only while this lock's key still exists with `token` as
/// its fencing token; statuses as `lk_lock_guarded_put`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_guarded_delete(
    lock: *const lk_lock,
    token: u64,
    key: *const u8,
    key_len: usize,
) -> lk_status {
    ffi!({
        let lock = unsafe { arg(lock, "lock") }?;
        let key = unsafe { key_bytes(key, key_len, "key") }?;
        lock.lock.guarded_delete(Token(token), key)?;
        Ok(())
    })
}
