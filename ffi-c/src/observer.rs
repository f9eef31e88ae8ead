//! Observers of an election (docs/elections.md): no lease, no key. The
//! events (what changed, never a leader whose key is gone) are the core's
//! `Observer`, pulled (`lk_observer_next`: its blocking read) or pushed to
//! a callback (`lk_observer_start`: its `observe_with`); this file only
//! converts them for C.

use std::time::Duration;

use std::ffi::{c_char, c_void};

use dlock_core::{Error, Observed, Observer};

use crate::client::lk_client;
use crate::election::{check_version, clear_leader, empty_leader, fill, lk_leader};
use crate::lk_status::{self, *};
use crate::lock::UserData;
use crate::{Fail, arg, boxed, ffi, out, text};

/// What an observer reports.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum lk_observed {
    /// A new leader (or the current one, first); the leader is given.
    LK_OBSERVED_LEADER = 0,
    /// The same leader (same token) proclaimed a new value; given.
    LK_OBSERVED_PROCLAIMED = 1,
    /// Nobody leads: the leader's key is gone and no candidate holds.
    LK_OBSERVED_NO_LEADER = 2,
    /// The watch failed and is being opened again; the state then follows
    /// (repeated even if unchanged).
    LK_OBSERVED_RECONNECTING = 3,
}

use lk_observed::*;

/// `on_observed(user_data, what, leader)`: one event of the observer;
/// `leader` is the leader for `LK_OBSERVED_LEADER` and
/// `LK_OBSERVED_PROCLAIMED` (valid during the call only), NULL otherwise.
pub type lk_observed_fn = Option<
    unsafe extern "C" fn(user_data: *mut c_void, what: lk_observed, leader: *const lk_leader),
>;

/// An observer of one election. Pull its events with `lk_observer_next`
/// (`lk_observer_new`), or get them in a callback (`lk_observer_start`).
pub struct lk_observer {
    observer: Observer,
}

/// Observes the election `name` on `client` (no lease, no key of its own):
/// pull the events with `lk_observer_next`; the first is the current state.
/// `LK_SHUTDOWN` on a shut-down client, `LK_INVALID_ARGUMENT` for an empty
/// name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_observer_new(
    client: *const lk_client,
    name: *const c_char,
    observer_out: *mut *mut lk_observer,
) -> lk_status {
    crate::new_named!(client, name, observer_out => lk_observer {
        observer: client.client.observe(name)?,
    })
}

/// Observes the election `name` on `client` with a callback: `cb` runs for
/// each event, in order, one at a time, on a thread of this observer's own
/// (not dlock's callback thread), the first with the current state. After
/// `lk_observer_close` or `lk_observer_free` returns it runs no more (so
/// do not call them holding a mutex `cb` takes); `cb` may call them
/// itself. `lk_observer_next` is refused on it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_observer_start(
    client: *const lk_client,
    name: *const c_char,
    cb: lk_observed_fn,
    user_data: *mut c_void,
    observer_out: *mut *mut lk_observer,
) -> lk_status {
    ffi!({
        let client = unsafe { arg(client, "client") }?;
        let name = unsafe { text(name, "name") }?;
        let Some(cb) = cb else {
            return Err(Fail::null("cb"));
        };
        let dest = unsafe { out(observer_out, "observer_out") }?;
        let ud = UserData(user_data);
        let observer = client.client.observe_with(name, move |e| {
            let ud = &ud;
            let (what, l) = kind(&e);
            let mut leader = empty_leader();
            fill(&mut leader, l);
            let p = if l.is_some() {
                &leader as *const lk_leader
            } else {
                std::ptr::null()
            };
            // SAFETY: the application's callback with its own user_data;
            // `leader` lives during the call.
            unsafe { cb(ud.0, what, p) };
            clear_leader(&mut leader);
        })?;
        boxed(dest, lk_observer { observer });
        Ok(())
    })
}

fn kind(e: &Observed) -> (lk_observed, Option<&dlock_core::Leader>) {
    match e {
        Observed::Leader(l) => (LK_OBSERVED_LEADER, Some(l)),
        Observed::Proclaimed(l) => (LK_OBSERVED_PROCLAIMED, Some(l)),
        Observed::NoLeader => (LK_OBSERVED_NO_LEADER, None),
        // Reconnecting, and any event newer than this header.
        _ => (LK_OBSERVED_RECONNECTING, None),
    }
}

/// The next event, waiting up to `timeout_ms` (0: only one already
/// waiting; `UINT64_MAX`: no limit): `*what_out`, and for a leader or a
/// proclaim the leader in `*leader_out` (may be NULL; else its `version`
/// set, `LK_LEADER_INIT`, and `lk_leader_clear` it after; `has_leader`
/// false for the other events). `LK_TIMEOUT`: none came;
/// `LK_RELEASED`: the observer was closed (also while waiting);
/// `LK_INVALID_ARGUMENT` on a callback observer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_observer_next(
    observer: *const lk_observer,
    timeout_ms: u64,
    what_out: *mut lk_observed,
    leader_out: *mut lk_leader,
) -> lk_status {
    ffi!({
        let o = unsafe { arg(observer, "observer") }?;
        let what = unsafe { out(what_out, "what_out") }?;
        // SAFETY: NULL or a valid out-parameter.
        let leader = unsafe { leader_out.as_mut() };
        if let Some(l) = &leader {
            check_version(l)?;
        }
        // UINT64_MAX (or any limit past the clock's reach): none.
        let timeout = (timeout_ms != u64::MAX).then(|| Duration::from_millis(timeout_ms));
        match o.observer.recv_blocking(timeout) {
            Ok(Some(e)) => {
                let (w, l) = kind(&e);
                if let Some(dest) = leader {
                    fill(dest, l);
                }
                *what = w;
                Ok(())
            }
            Err(Error::Timeout) => Err(Fail::new(
                LK_TIMEOUT,
                format!("no observer event within {timeout_ms} ms"),
            )),
            Err(e) => Err(e.into()),
            Ok(None) => Err(Fail::new(LK_RELEASED, "the observer is closed")),
        }
    })
}

/// Ends the observation: its watch stops, a waiting `lk_observer_next`
/// returns `LK_RELEASED` (and every later one), and once it returns the
/// callback runs no more (from the callback itself: no more after it
/// returns). Closing twice is harmless.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_observer_close(observer: *const lk_observer) -> lk_status {
    ffi!({
        let o = unsafe { arg(observer, "observer") }?;
        close(o);
        Ok(())
    })
}

fn close(o: &lk_observer) {
    o.observer.close();
}

/// Closes (as `lk_observer_close`) and frees the observer (NULL: nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_observer_free(observer: *mut lk_observer) {
    ffi!(value {
        if !observer.is_null() {
            // SAFETY: made by lk_observer_new / lk_observer_start, freed once.
            let o = unsafe { Box::from_raw(observer) };
            close(&o);
        }
    })
}
