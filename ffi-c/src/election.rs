//! Leader elections (docs/elections.md): an `lk_election` is a lock that
//! carries a value. Each function converts and calls the core's `Election`;
//! the re-check after every wait, the proclaim's guard and the resign's wait
//! for permits in flight are the core's.

use std::ffi::{CString, c_char, c_uint, c_void};
use std::time::Duration;

use dlock_core::{Election, Leader};

use crate::client::lk_client;
use crate::lifecycle::{lk_acquire_done_fn, lk_acquisition};
use crate::lk_status;
use crate::lock::lk_lock;
use crate::session::lk_session;
use crate::{Fail, arg, boxed, bytes, ffi, out};

/// One candidate in an election: an `lk_lock` (`lk_election_lock`) plus
/// campaign, proclaim, resign and leader. Freeing it releases (resigns
/// without waiting).
pub struct lk_election {
    lock: lk_lock,
}

/// The new handle of election `e`, called `name` (both
/// constructors: the client's default session and a session's own).
fn made(e: Election, name: &str) -> lk_election {
    lk_election {
        lock: lk_lock::election(e, name),
    }
}

impl lk_election {
    fn election(&self) -> &Election {
        match &self.lock.lock {
            crate::lock::Handle::Election(e) => e,
            // Made only by lk_election_new / lk_session_election_new.
            crate::lock::Handle::Lock(_) => unreachable!("an lk_election holds an election"),
        }
    }
}

/// A candidate handle in the election `name` (1 to 1024 bytes of UTF-8)
/// on `client`'s default session. Not campaigning yet: set callbacks on
/// `lk_election_lock`, then `lk_election_campaign`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_election_new(
    client: *const lk_client,
    name: *const c_char,
    election_out: *mut *mut lk_election,
) -> lk_status {
    crate::new_named!(client, name, election_out => made(client.client.election(name)?, name))
}

/// As `lk_election_new`, on `session` (its own lease and deadline).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_election_new(
    session: *const lk_session,
    name: *const c_char,
    election_out: *mut *mut lk_election,
) -> lk_status {
    crate::new_named!(session, name, election_out => made(session.session().election(name)?, name))
}

/// The election's lock: every `lk_lock` function works on it (`lk_permit`
/// for each unit of leader work, `lk_set_on_fence` and the other
/// callbacks, `lk_lock_token`, `lk_lock_state`, `lk_lock_close`, stats);
/// `lk_lock_acquire` on it campaigns with the last value. Valid until
/// `lk_election_free`; never `lk_lock_free` it. NULL for a NULL election.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_election_lock(election: *const lk_election) -> *const lk_lock {
    ffi!(value {
        // SAFETY: NULL or an election made by lk_election_new.
        unsafe { election.as_ref() }.map_or(std::ptr::null(), |e| &e.lock as *const lk_lock)
    })
}

impl crate::OnPanic for *const lk_lock {
    fn on_panic() -> *const lk_lock {
        std::ptr::null()
    }
}

fn write_token(dest: *mut u64, t: u64) {
    // SAFETY: NULL or a valid out-parameter (the header's rules).
    if let Some(d) = unsafe { dest.as_mut() } {
        *d = t;
    }
}

/// Campaigns with `value` (`value_len` bytes, any content; NULL with 0:
/// empty): puts the candidate key holding it and waits up to `timeout_ms`
/// to lead (0: try once). Blocks the calling thread. On success writes the
/// leader's token (its key's create revision) to `token_out` (may be
/// NULL). Every wait ends with a read of the candidate's own key, so a
/// candidate whose key went meanwhile is never told it leads. `LK_TIMEOUT`
/// (nothing held), `LK_RELEASED` (the session is closed),
/// `LK_INVALID_ARGUMENT` (a value over etcd's request limit), `LK_BACKEND`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_election_campaign(
    election: *const lk_election,
    value: *const u8,
    value_len: usize,
    timeout_ms: u64,
    token_out: *mut u64,
) -> lk_status {
    ffi!({
        let e = unsafe { arg(election, "election") }?;
        let value = unsafe { bytes(value, value_len, "value") }?;
        let token = e
            .election()
            .campaign(value, Duration::from_millis(timeout_ms))?;
        write_token(token_out, token.get());
        Ok(())
    })
}

/// Starts campaigning with `value` and returns at once, as
/// `lk_lock_acquire_start` does for a lock: `done` (may be NULL) runs
/// exactly once on dlock's callback thread with `LK_OK` and the token or
/// the status `lk_election_campaign` would have returned;
/// `lk_acquisition_cancel` leaves nothing held. Bad input (a NULL
/// argument, a value over the limit, a closed session) is refused here and
/// `done` never runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_election_campaign_start(
    election: *const lk_election,
    value: *const u8,
    value_len: usize,
    timeout_ms: u64,
    done: lk_acquire_done_fn,
    user_data: *mut c_void,
    acquisition_out: *mut *mut lk_acquisition,
) -> lk_status {
    ffi!({
        let e = unsafe { arg(election, "election") }?;
        let value = unsafe { bytes(value, value_len, "value") }?;
        let dest = unsafe { out(acquisition_out, "acquisition_out") }?;
        let timeout = Some(Duration::from_millis(timeout_ms));
        let inner = e.election().campaign_then(
            value,
            timeout,
            crate::lifecycle::report(done, user_data),
        )?;
        boxed(dest, lk_acquisition::new(inner));
        Ok(())
    })
}

/// Puts a new value in the leader's key, guarded by its token (one
/// transaction; the token does not change). `LK_FENCED`: the leadership
/// was lost; `LK_NOT_HELD`: not leading (never elected, campaigning,
/// resigned, released); `LK_INVALID_ARGUMENT`: a value over the limit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_election_proclaim(
    election: *const lk_election,
    value: *const u8,
    value_len: usize,
) -> lk_status {
    ffi!({
        let e = unsafe { arg(election, "election") }?;
        let value = unsafe { bytes(value, value_len, "value") }?;
        e.election().proclaim(value)?;
        Ok(())
    })
}

/// The grace to pass to `lk_election_resign` when the caller has no
/// reason to choose: the core's, the one Python and Node use by default.
pub const LK_RESIGN_GRACE_MS: u64 = 5_000;
const _: () = assert!(LK_RESIGN_GRACE_MS as u128 == dlock_core::election::RESIGN_GRACE.as_millis());

/// Steps down: no permit from now on; the key is deleted once the permits
/// in flight end, or after `grace_ms` (`LK_RESIGN_GRACE_MS` unless the
/// caller has a reason) with some still in flight, so the
/// next leader starts only after this one's work. Returns once the delete
/// had its first try (blocks up to `grace_ms` and a keepalive timeout).
/// Campaigning again is allowed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_election_resign(
    election: *const lk_election,
    grace_ms: u64,
) -> lk_status {
    ffi!({
        let e = unsafe { arg(election, "election") }?;
        e.election().resign(Duration::from_millis(grace_ms))?;
        Ok(())
    })
}

/// The version of `struct lk_leader` this header describes.
pub const LK_LEADER_VERSION: c_uint = 1;

/// A leader as the service sees it, filled by `lk_election_leader` and
/// `lk_observer_next`. Set `version` (`LK_LEADER_INIT`) before the call;
/// `value` and `key` are the library's until `lk_leader_clear`, which
/// every filled struct needs (filling one again clears it first).
#[repr(C)]
pub struct lk_leader {
    /// `LK_LEADER_VERSION` (or any earlier version).
    pub version: c_uint,
    /// False: nobody leads (every other field zero).
    pub has_leader: bool,
    /// The value the leader proclaims (`value_len` bytes, no NUL added;
    /// NULL when empty).
    pub value: *const u8,
    pub value_len: usize,
    /// The leader key's create revision: its fencing token (unchanged by a
    /// proclaim).
    pub token: u64,
    /// The leader's key, `<name>/<lease hex>` (NUL-terminated).
    pub key: *const c_char,
    /// The lease the key is held under.
    pub lease: i64,
}

/// Checks `dest.version` (before the call's work: out-parameters are
/// written only on success).
pub(crate) fn check_version(dest: &lk_leader) -> Result<(), Fail> {
    crate::known_version("lk_leader", dest.version, LK_LEADER_VERSION)
}

/// An empty leader of this header's version.
pub(crate) fn empty_leader() -> lk_leader {
    lk_leader {
        version: LK_LEADER_VERSION,
        has_leader: false,
        value: std::ptr::null(),
        value_len: 0,
        token: 0,
        key: std::ptr::null(),
        lease: 0,
    }
}

/// Writes `l` (or nobody) into a checked `dest`, freeing what it held.
pub(crate) fn fill(dest: &mut lk_leader, l: Option<&Leader>) {
    clear_leader(dest);
    let Some(l) = l else { return };
    let value: Box<[u8]> = l.value.clone().into_boxed_slice();
    dest.value_len = value.len();
    dest.value = if value.is_empty() {
        std::ptr::null()
    } else {
        Box::into_raw(value) as *const u8
    };
    dest.key = CString::new(l.key.replace('\0', "?"))
        .unwrap_or_default()
        .into_raw();
    dest.token = l.token.get();
    dest.lease = l.lease;
    dest.has_leader = true;
}

/// Frees what a filled leader holds and zeroes it (its version kept).
pub(crate) fn clear_leader(l: &mut lk_leader) {
    if !l.value.is_null() && l.value_len > 0 {
        // SAFETY: made by `fill` from a boxed slice of this length.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                l.value as *mut u8,
                l.value_len,
            ))
        });
    }
    if !l.key.is_null() {
        // SAFETY: made by `fill` with CString::into_raw.
        drop(unsafe { CString::from_raw(l.key as *mut c_char) });
    }
    *l = lk_leader {
        version: l.version,
        ..empty_leader()
    };
}

/// Reads the current leader of the election (one read; blocks for it) into
/// `*leader_out`, whose `version` the caller set: `has_leader` false when
/// nobody leads. `LK_BACKEND` when the service cannot be read.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_election_leader(
    election: *const lk_election,
    leader_out: *mut lk_leader,
) -> lk_status {
    ffi!({
        let e = unsafe { arg(election, "election") }?;
        let dest = unsafe { out(leader_out, "leader_out") }?;
        check_version(dest)?;
        let l = e.election().leader()?;
        fill(dest, l.as_ref());
        Ok(())
    })
}

/// Frees what `lk_election_leader` or `lk_observer_next` put in `*leader`
/// and zeroes it (its `version` kept). NULL, or an empty one: nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_leader_clear(leader: *mut lk_leader) {
    ffi!(value {
        // SAFETY: NULL or a struct filled by this library (or zeroed).
        if let Some(l) = unsafe { leader.as_mut() } {
            clear_leader(l);
        }
    })
}

/// Frees an election handle (NULL: nothing), releasing its key without
/// waiting (`lk_election_resign` first to let work in flight end; the
/// rules of `lk_lock_free` apply to its lock and callbacks).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_election_free(election: *mut lk_election) {
    ffi!(value { unsafe { crate::free_handle(election) } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(value: &[u8]) -> Leader {
        Leader {
            key: "e/1f".into(),
            value: value.to_vec(),
            token: dlock_core::Token(7),
            lease: 31,
        }
    }

    /// A filled leader owns its bytes until cleared; empty values are NULL;
    /// an unknown version is refused.
    #[test]
    fn leaders_fill_and_clear() {
        let mut l = empty_leader();
        assert!(check_version(&l).is_ok());
        fill(&mut l, Some(&leader(b"host-a")));
        assert!(l.has_leader);
        // SAFETY: filled just above.
        let v = unsafe { std::slice::from_raw_parts(l.value, l.value_len) };
        assert_eq!(v, b"host-a");
        let key = unsafe { std::ffi::CStr::from_ptr(l.key) };
        assert_eq!(key.to_str().unwrap(), "e/1f");
        assert_eq!((l.token, l.lease), (7, 31));
        // Filling again clears first (no leak under the sanitizers).
        fill(&mut l, Some(&leader(b"")));
        assert!(l.has_leader && l.value.is_null() && l.value_len == 0);
        fill(&mut l, None);
        assert!(!l.has_leader && l.key.is_null());
        unsafe { lk_leader_clear(&mut l) };
        unsafe { lk_leader_clear(std::ptr::null_mut()) };
        l.version = 0;
        assert!(check_version(&l).is_err());
    }
}
