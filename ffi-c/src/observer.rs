//! Observers of an election (docs/elections.md): no lease, no key. The
//! events (what changed, never a leader whose key is gone) are the core's
//! `Observer`; this file only delivers them to C, pulled with
//! `lk_observer_next` or pushed to a callback on a thread of the observer's
//! own.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use std::ffi::{c_char, c_void};

use dlock_core::{Observed, Observer};

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

/// What the pulling thread and `lk_observer_close` share.
struct Shared {
    /// The core's observer; `recv` needs `&mut`.
    observer: Mutex<Observer>,
    closed: AtomicBool,
    /// The thread waiting for an event, unparked by a close.
    waiting: Mutex<Option<Thread>>,
}

/// Unparks the waiting thread (the core's queue wakes it on an event).
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

enum Next {
    Event(Observed),
    Timeout,
    /// Closed, or the stream ended.
    Closed,
}

impl Shared {
    /// The next event, waiting until `deadline` (`None`: for ever), or the
    /// close.
    fn next(&self, deadline: Option<Instant>) -> Next {
        let mut observer = self.observer.lock().unwrap_or_else(PoisonError::into_inner);
        let me = std::thread::current();
        *self.waiting.lock().unwrap_or_else(PoisonError::into_inner) = Some(me.clone());
        let waker = Waker::from(Arc::new(Unpark(me)));
        let mut cx = Context::from_waker(&waker);
        let mut recv = std::pin::pin!(observer.recv());
        let next = loop {
            // A close sets the flag, then unparks: a park after the flag
            // was set returns at once.
            if self.closed.load(Ordering::SeqCst) {
                break Next::Closed;
            }
            if let Poll::Ready(e) = recv.as_mut().poll(&mut cx) {
                break e.map_or(Next::Closed, Next::Event);
            }
            match deadline {
                None => std::thread::park(),
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => std::thread::park_timeout(left),
                    _ => break Next::Timeout,
                },
            }
        };
        *self.waiting.lock().unwrap_or_else(PoisonError::into_inner) = None;
        next
    }

    /// Ends the observation: a waiting `next` returns `Closed`.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(t) = &*self.waiting.lock().unwrap_or_else(PoisonError::into_inner) {
            t.unpark();
        }
        // The watch ends once no `next` holds the observer.
        self.observer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .close();
    }
}

/// An observer of one election. Pull its events with `lk_observer_next`
/// (`lk_observer_new`), or get them in a callback (`lk_observer_start`).
pub struct lk_observer {
    shared: Arc<Shared>,
    /// The callback form's thread.
    pump: Mutex<Option<JoinHandle<()>>>,
}

fn start(client: &lk_client, name: &str) -> Result<Arc<Shared>, Fail> {
    Ok(Arc::new(Shared {
        observer: Mutex::new(client.client.observe(name)?),
        closed: AtomicBool::new(false),
        waiting: Mutex::new(None),
    }))
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
    ffi!({
        let client = unsafe { arg(client, "client") }?;
        let name = unsafe { text(name, "name") }?;
        let dest = unsafe { out(observer_out, "observer_out") }?;
        boxed(
            dest,
            lk_observer {
                shared: start(client, name)?,
                pump: Mutex::new(None),
            },
        );
        Ok(())
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
        let shared = start(client, name)?;
        let s = shared.clone();
        let ud = UserData(user_data);
        let pump = std::thread::Builder::new()
            .name("dlock-observer".into())
            .spawn(move || {
                let ud = ud;
                while let Next::Event(e) = s.next(None) {
                    let (what, l) = kind(&e);
                    let mut leader = empty_leader();
                    fill(&mut leader, l);
                    let p = if l.is_some() {
                        &leader as *const lk_leader
                    } else {
                        std::ptr::null()
                    };
                    // SAFETY: the application's callback with its own
                    // user_data; `leader` lives during the call.
                    unsafe { cb(ud.0, what, p) };
                    clear_leader(&mut leader);
                }
            })
            .map_err(|e| Fail::new(LK_BACKEND, format!("cannot start a thread: {e}")))?;
        boxed(
            dest,
            lk_observer {
                shared,
                pump: Mutex::new(Some(pump)),
            },
        );
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
        if o.pump
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
        {
            return Err(Fail::invalid(
                "lk_observer_next on an observer with a callback (lk_observer_start)",
            ));
        }
        let deadline = Instant::now().checked_add(Duration::from_millis(timeout_ms));
        match o.shared.next(deadline) {
            Next::Event(e) => {
                let (w, l) = kind(&e);
                if let Some(dest) = leader {
                    fill(dest, l);
                }
                *what = w;
                Ok(())
            }
            Next::Timeout => Err(Fail::new(
                LK_TIMEOUT,
                format!("no observer event within {timeout_ms} ms"),
            )),
            Next::Closed => Err(Fail::new(LK_RELEASED, "the observer is closed")),
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
    o.shared.close();
    let pump = o.pump.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(pump) = pump {
        if pump.thread().id() == std::thread::current().id() {
            // From the callback: the loop ends when it returns.
            return;
        }
        let _ = pump.join();
    }
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
