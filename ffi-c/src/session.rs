//! Sessions: many locks on one lease. Each function converts and calls the
//! core's `Session`; what sharing a lease means (one put per acquire, one
//! drain and one fence for all on a lost keepalive or lease) is the core's.

use std::ffi::{c_char, c_uint};

use dlock_core::{Options, Session};

use crate::client::{LK_CLIENT_OPTIONS_VERSION, lk_client, lk_client_options, timing_of};
use crate::lk_status::{self, LK_NOT_HELD};
use crate::lock::lk_lock;
use crate::{Fail, arg, boxed, ffi, out};

/// One lease shared by many locks: one keepalive loop, one deadline. A
/// failed keepalive drains every lock of it, a lost lease fences them all,
/// a deleted lock key fences that lock alone. Its locks keep it alive.
pub struct lk_session {
    session: Session,
}

impl lk_session {
    /// The core's session (for `lk_session_election_new`).
    pub(crate) fn session(&self) -> &Session {
        &self.session
    }
}

/// A new session of `client` with its own lease, keepalive loop and
/// deadline, so its locks fence independently of the client's other
/// locks. Timing and `reacquire` come from `options` (NULL: the client's
/// own; any version from 1 to `LK_CLIENT_OPTIONS_VERSION`); the other
/// fields (endpoints, TLS, `memory`) are the client's and ignored here.
/// Timing fields left out (`LK_UNSET_MS`) are derived over the client's.
/// `LK_INVALID_OPTION` for timings that break a rule. The lease is granted
/// on the first acquisition.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_new(
    client: *const lk_client,
    options: *const lk_client_options,
    session_out: *mut *mut lk_session,
) -> lk_status {
    ffi!({
        let client = unsafe { arg(client, "client") }?;
        let dest = unsafe { out(session_out, "session_out") }?;
        let opts: Options = match options.is_null() {
            true => client.client.options().clone(),
            false => unsafe { timing_of(options, client.client.options()) }?,
        };
        boxed(
            dest,
            lk_session {
                session: client.client.session(opts)?,
            },
        );
        Ok(())
    })
}

/// A handle on the client's default session, the one `lk_lock_new`'s locks
/// share (its stats, its lease, or more locks on it). Free it with
/// `lk_session_free`; the session lives on with the client and its locks.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_client_session(
    client: *const lk_client,
    session_out: *mut *mut lk_session,
) -> lk_status {
    ffi!({
        let client = unsafe { arg(client, "client") }?;
        let dest = unsafe { out(session_out, "session_out") }?;
        boxed(
            dest,
            lk_session {
                session: client.client.default_session().clone(),
            },
        );
        Ok(())
    })
}

/// A handle on the lock `name` (1 to 1024 bytes of UTF-8) on `session`, as
/// `lk_lock_new` on a client: not acquired yet. Two handles of one name on
/// one session exclude each other (the second waits).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_lock_new(
    session: *const lk_session,
    name: *const c_char,
    lock_out: *mut *mut lk_lock,
) -> lk_status {
    crate::new_named!(session, name, lock_out => lk_lock::new(session.session.lock(name)?, name))
}

/// Releases every lock of the session and revokes its lease (one request
/// deletes every key). Returns once revoked, or after a keepalive timeout
/// if the service does not answer (the revoke goes on meanwhile). The
/// locks stay valid handles but refuse to acquire again (`LK_RELEASED`),
/// and no new lock is made on it (`LK_RELEASED`); free them as usual.
/// Closing twice is harmless. The client's default session closes only
/// with the client: closing it is `LK_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_close(session: *const lk_session) -> lk_status {
    ffi!({
        unsafe { arg(session, "session") }?.session.close()?;
        Ok(())
    })
}

/// The session's current lease id (granted on its first acquisition);
/// `LK_NOT_HELD` while none is granted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_lease(
    session: *const lk_session,
    lease_out: *mut i64,
) -> lk_status {
    crate::getter!(session, lease_out => {
        let lease = session.session.lease();
        lease.ok_or_else(|| Fail::new(LK_NOT_HELD, "the session holds no lease now"))?
    })
}

/// Fills the timing fields (`*_ms`) and `reacquire` of `*options_out`
/// (whose `version` the caller set: `LK_CLIENT_OPTIONS_INIT`) with the
/// ones the session runs with: those given, and those the core derived
/// from them, so a program can see what a setting left out became. The
/// other fields are left as they are. The client's own: its default
/// session (`lk_client_session`). `LK_INVALID_ARGUMENT` for a version
/// this library does not know.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_options(
    session: *const lk_session,
    options_out: *mut lk_client_options,
) -> lk_status {
    ffi!({
        let session = unsafe { arg(session, "session") }?;
        if options_out.is_null() {
            return Err(Fail::null("options_out"));
        }
        // SAFETY: `version` is the first field of every version.
        let version = unsafe { (*options_out).version };
        crate::known_version("lk_client_options", version, LK_CLIENT_OPTIONS_VERSION)?;
        let o = session.session.options();
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX - 1);
        // SAFETY: every version has these fields (version 1's); written
        // one by one, as the caller's struct may be of an earlier version.
        unsafe {
            let p = options_out;
            std::ptr::addr_of_mut!((*p).ttl_ms).write(ms(o.ttl));
            std::ptr::addr_of_mut!((*p).keepalive_interval_ms).write(ms(o.keepalive_interval));
            std::ptr::addr_of_mut!((*p).keepalive_timeout_ms).write(ms(o.keepalive_timeout));
            std::ptr::addr_of_mut!((*p).retry_interval_ms).write(ms(o.retry_interval));
            std::ptr::addr_of_mut!((*p).margin_ms).write(ms(o.margin));
            std::ptr::addr_of_mut!((*p).reacquire).write(o.reacquire);
        }
        Ok(())
    })
}

/// The version of `struct lk_session_stats` this header describes.
pub const LK_SESSION_STATS_VERSION: c_uint = 1;

/// What `lk_session_stats` reports. Set `version` (`LK_SESSION_STATS_INIT`)
/// before the call: later releases add fields at the end and fill only
/// those of the version asked for.
#[repr(C)]
pub struct lk_session_stats {
    /// `LK_SESSION_STATS_VERSION` (or any earlier version).
    pub version: c_uint,
    /// The lease id; 0: none granted now.
    pub lease: i64,
    /// Keepalives sent.
    pub keepalives: u64,
    /// Locks of the session (handles, and released locks not yet done).
    pub locks: u64,
    /// Round trip of the last confirmed keepalive (µs); 0: none yet.
    pub last_keepalive_rtt_us: u64,
}

/// Fills `*stats_out` (whose `version` the caller set) with the session's
/// lease, keepalives sent, locks and last keepalive round trip. Cheap
/// (atomics). `LK_INVALID_ARGUMENT` for a version this library does not
/// know.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_stats(
    session: *const lk_session,
    stats_out: *mut lk_session_stats,
) -> lk_status {
    ffi!({
        let session = unsafe { arg(session, "session") }?;
        let dest = unsafe { out(stats_out, "stats_out") }?;
        crate::known_version("lk_session_stats", dest.version, LK_SESSION_STATS_VERSION)?;
        let st = session.session.stats();
        *dest = lk_session_stats {
            version: dest.version,
            lease: st.lease.unwrap_or(0),
            keepalives: st.keepalives,
            locks: st.locks,
            last_keepalive_rtt_us: st
                .last_keepalive_rtt
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        };
        Ok(())
    })
}

/// Frees a session handle (NULL: nothing). The session ends (its lease
/// revoked) once every handle on it and every lock of it is freed, so
/// locks may be freed before or after it. In a forked child it frees
/// memory only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_session_free(session: *mut lk_session) {
    ffi!(value { unsafe { crate::free_handle(session) } })
}
