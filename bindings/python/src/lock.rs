//! `dlock._dlock.Lock`: one named lock; blocking calls without the GIL,
//! async calls completed by the core (`acquire_then`, `spawn_then`).

use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::acquisition::Acquisition;
use crate::callback::{Handlers, add_handler, call_each};
use crate::client::Client;
use crate::complete::{Outcome, Pending, spawn};
use crate::convert::{bytes_arg, instant_secs, py_opt, secs_f64, timeout_arg, type_name};
use crate::error::{OrRaise, not_forked, refused};
use crate::events::{Event, EventStream};
use crate::permit::Permit;
use crate::session::Session;
use crate::wait::blocking;

/// What `Lock.stats()` reports; durations in seconds.
#[pyclass(module = "dlock._dlock", frozen, get_all)]
pub(crate) struct LockStats {
    acquisitions: u64,
    drains: u64,
    resumes: u64,
    fences_deadline: u64,
    fences_lease_lost: u64,
    fences_lock_lost: u64,
    last_keepalive_rtt: Option<f64>,
    slack: Option<f64>,
    in_flight: u64,
}

#[pymethods]
impl LockStats {
    fn __repr__(&self) -> String {
        format!(
            "LockStats(acquisitions={}, drains={}, resumes={}, fences_deadline={}, \
             fences_lease_lost={}, fences_lock_lost={}, last_keepalive_rtt={}, slack={}, \
             in_flight={})",
            self.acquisitions,
            self.drains,
            self.resumes,
            self.fences_deadline,
            self.fences_lease_lost,
            self.fences_lock_lost,
            py_opt(self.last_keepalive_rtt),
            py_opt(self.slack),
            self.in_flight
        )
    }
}

// ------------------------------------------------------------------ lock

/// What a `Lock` wraps: a core lock, or an election (`dlock::Election`
/// derefs to its lock), so `Election` has the whole lock API by extending
/// `Lock`.
pub(crate) type LockHandle = Arc<dyn Deref<Target = dlock::Lock> + Send + Sync>;

/// One named lock (see `dlock.Lock`).
#[pyclass(module = "dlock._dlock", subclass, frozen, weakref)]
pub(crate) struct Lock {
    /// Dropped without the GIL (the core's drop waits for a callback that
    /// may be waiting for the GIL). Cloned with `Arc::clone(&self.inner)`:
    /// `self.inner.clone()` is a `ManuallyDrop` that never drops, and the
    /// lock would outlive its Python object (found by the soak).
    pub(crate) inner: ManuallyDrop<LockHandle>,
    /// The handlers registered, by kind: they add up (issue 32).
    pub(crate) handlers: LockHandlers,
}

/// A lock's Python handlers, one list per kind of callback; the core's
/// callback of a kind is set with the first handler and calls them all.
#[derive(Default)]
pub(crate) struct LockHandlers {
    fence: Handlers,
    state_change: Handlers,
    acquired: Handlers,
    drained: Handlers,
    event: Handlers,
}

impl Drop for Lock {
    fn drop(&mut self) {
        // SAFETY: taken once, here.
        let inner = unsafe { ManuallyDrop::take(&mut self.inner) };
        Python::attach(|py| py.detach(move || drop(inner)));
    }
}

#[pymethods]
impl Lock {
    /// A lock called `name` on `owner`, a Client (its default session) or a
    /// Session; not acquired yet. Or the held lock of a slot a semaphore
    /// won: `owner` its `HeldSlot`, `name` that slot's name. Or a
    /// read/write lock's reader or writer: `owner` its `RwHolder`.
    #[new]
    fn new(py: Python<'_>, owner: &Bound<'_, PyAny>, name: &Bound<'_, PyAny>) -> PyResult<Lock> {
        let name = name.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "a lock name must be a str, not {}",
                type_name(name)
            ))
        })?;
        let name = name.to_cow()?;
        let lock = if let Some(held) = crate::semaphore::held_slot(owner) {
            Ok(crate::semaphore::take_slot(held, &name)?)
        } else if let Some(holder) = crate::rwlock::rw_holder(owner) {
            Ok(crate::rwlock::take_holder(holder, &name)?)
        } else if let Ok(c) = owner.cast::<Client>() {
            c.get().inner.lock(&name)
        } else if let Ok(s) = owner.cast::<Session>() {
            s.get().inner.lock(&name)
        } else {
            return Err(PyTypeError::new_err(
                "a lock's owner must be a dlock.Client or a dlock.Session",
            ));
        };
        Ok(Lock {
            inner: ManuallyDrop::new(Arc::new(Box::new(lock.or_raise(py)?))),
            handlers: LockHandlers::default(),
        })
    }

    /// The lock's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Who holds the lock now (any process): a dict with `key`, `token`,
    /// `lease` and `identity` (a dict of `host`, `pid`, `started`, `face`,
    /// `version`, `description`; None for a holder that records none, such
    /// as `etcdctl lock`), or None when nothing holds it.
    fn holder<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        not_forked(py)?;
        let l = Arc::clone(&self.inner);
        let Some(h) = py.detach(move || l.holder()).or_raise(py)? else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("key", h.key)?;
        d.set_item("token", h.token.get())?;
        d.set_item("lease", h.lease)?;
        let identity = match h.identity {
            None => None,
            Some(id) => {
                let i = PyDict::new(py);
                i.set_item("host", &id.host)?;
                i.set_item("pid", id.pid)?;
                i.set_item("started", id.started)?;
                i.set_item("face", &id.face)?;
                i.set_item("version", &id.version)?;
                i.set_item("description", &id.description)?;
                Some(i)
            }
        };
        d.set_item("identity", identity)?;
        Ok(Some(d))
    }

    /// The semaphore slot this lock is (None for a plain lock).
    #[getter]
    fn slot(&self) -> Option<u32> {
        self.inner.slot()
    }

    /// `"read"` or `"write"` for a read/write lock's holder; None for a
    /// plain lock.
    #[getter]
    fn mode(&self) -> Option<&'static str> {
        self.inner.mode().map(dlock::Mode::as_str)
    }

    /// The session the lock is held under.
    #[getter]
    fn _session(&self) -> Session {
        Session::from(self.inner.session())
    }

    /// Acquires, waiting up to `timeout` seconds (None: as long as it
    /// takes; 0: one try); returns the token. Releases the GIL; Ctrl-C
    /// interrupts it and cancels the acquire.
    #[pyo3(signature = (timeout=None))]
    fn acquire(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u64> {
        let timeout = timeout_arg(py, timeout)?;
        blocking(py, || self.inner.acquire_async(timeout)).map(|t| t.get())
    }

    /// Acquires if nobody holds the lock, else raises `WouldBlock`.
    fn try_acquire(&self, py: Python<'_>) -> PyResult<u64> {
        blocking(py, || self.inner.try_acquire_async()).map(|t| t.get())
    }

    /// Releases the lock (deletes its key); no permit is valid from now on.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        not_forked(py)?;
        let lock = Arc::clone(&self.inner);
        py.detach(move || lock.release()).or_raise(py)
    }

    /// A held writer becomes a reader, keeping its key and token (the
    /// core's `downgrade`; a reader's does nothing). Releases the GIL.
    fn downgrade(&self, py: Python<'_>) -> PyResult<()> {
        not_forked(py)?;
        let lock = Arc::clone(&self.inner);
        py.detach(move || lock.downgrade()).or_raise(py)
    }

    /// Always `InvalidArgument` (the core's `upgrade`): release the reader
    /// and acquire a writer instead.
    fn upgrade(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.upgrade().or_raise(py)
    }

    /// Releases and ends the lock's callbacks and event streams.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        not_forked(py)?;
        let lock = Arc::clone(&self.inner);
        py.detach(move || lock.close()).or_raise(py)
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The state's name (`"Holding"`, ...).
    #[getter]
    fn state_name(&self, py: Python<'_>) -> PyResult<&'static str> {
        not_forked(py)?;
        Ok(self.inner.state().as_str())
    }

    /// The token held, while Holding or Draining; else None.
    #[getter]
    fn token(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        not_forked(py)?;
        Ok(self.inner.token().map(|t| t.get()))
    }

    /// The local deadline, seconds on `time.CLOCK_BOOTTIME`, while Holding or
    /// Draining; else None.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        not_forked(py)?;
        Ok(self.inner.deadline().map(instant_secs))
    }

    /// Seconds left before the deadline (0 once passed), while Holding or
    /// Draining; else None.
    #[getter]
    fn time_left(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        not_forked(py)?;
        Ok(self.inner.time_left().map(secs_f64))
    }

    /// Permits in flight.
    #[getter]
    fn in_flight(&self) -> u64 {
        self.inner.in_flight()
    }

    /// Counters, the last keepalive's round trip, the slack, the permits in
    /// flight.
    fn stats(&self, py: Python<'_>) -> PyResult<LockStats> {
        not_forked(py)?;
        let s = self.inner.stats();
        Ok(LockStats {
            acquisitions: s.acquisitions,
            drains: s.drains,
            resumes: s.resumes,
            fences_deadline: s.fences_deadline,
            fences_lease_lost: s.fences_lease_lost,
            fences_lock_lost: s.fences_lock_lost,
            last_keepalive_rtt: s.last_keepalive_rtt.map(secs_f64),
            slack: s.slack.map(secs_f64),
            in_flight: s.in_flight,
        })
    }

    /// Permission for one unit of work, or the refusal (`Draining`,
    /// `Fenced`, `Released`, `NotHeld`) raised.
    fn permit(&self, py: Python<'_>) -> PyResult<Permit> {
        match self.inner.permit_owned() {
            Ok(p) => Ok(Permit::new(p)),
            Err(r) => Err(refused(py, r)),
        }
    }

    /// `fn(token, in_flight)` once per fenced token. Handlers add up,
    /// called in the order registered (as every `on_*`); a handler that is
    /// not callable is a `TypeError` here.
    fn on_fence(&self, py: Python<'_>, f: Py<PyAny>) -> PyResult<Py<PyAny>> {
        let all = &self.handlers.fence;
        if add_handler(py, all, "on_fence", &f)? {
            let all = all.clone();
            self.inner.on_fence(move |token, in_flight| {
                call_each(&all, "on_fence", |py| {
                    (token.get(), in_flight).into_pyobject(py)
                });
            });
        }
        Ok(f)
    }

    /// `fn(from_state, to_state, reason)` (words) on every state change.
    fn _on_state_change_words(&self, py: Python<'_>, f: Py<PyAny>) -> PyResult<()> {
        let all = &self.handlers.state_change;
        if add_handler(py, all, "on_state_change", &f)? {
            let all = all.clone();
            self.inner.on_state_change(move |c| {
                call_each(&all, "on_state_change", |py| {
                    (c.from.as_str(), c.to.as_str(), c.reason.as_str()).into_pyobject(py)
                });
            });
        }
        Ok(())
    }

    /// `fn(token)` on every acquisition.
    fn on_acquired(&self, py: Python<'_>, f: Py<PyAny>) -> PyResult<Py<PyAny>> {
        let all = &self.handlers.acquired;
        if add_handler(py, all, "on_acquired", &f)? {
            let all = all.clone();
            self.inner.on_acquired(move |token| {
                call_each(&all, "on_acquired", |py| (token.get(),).into_pyobject(py));
            });
        }
        Ok(f)
    }

    /// `fn()` once the lock left Holding and no permit is in flight.
    fn on_drained(&self, py: Python<'_>, f: Py<PyAny>) -> PyResult<Py<PyAny>> {
        let all = &self.handlers.drained;
        if add_handler(py, all, "on_drained", &f)? {
            let all = all.clone();
            self.inner.on_drained(move || {
                call_each(&all, "on_drained", |py| Ok(PyTuple::empty(py)));
            });
        }
        Ok(f)
    }

    /// `fn(event)` with every event (an `Event`).
    fn on_event(&self, py: Python<'_>, f: Py<PyAny>) -> PyResult<Py<PyAny>> {
        let all = &self.handlers.event;
        if add_handler(py, all, "on_event", &f)? {
            let all = all.clone();
            self.inner.on_event(move |e| {
                call_each(&all, "on_event", |py| (Event::from(e),).into_pyobject(py));
            });
        }
        Ok(f)
    }

    /// The lock's events from now on (ends with the close).
    fn _events(&self) -> EventStream {
        EventStream::new(self.inner.events())
    }

    /// Puts `key` = `value` only while `token` holds the lock (decided by
    /// the service); `Fenced` otherwise.
    fn guarded_put(
        &self,
        py: Python<'_>,
        token: &Bound<'_, PyAny>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let token = crate::convert::u64_arg(py, "token", token)?;
        let key = bytes_arg("key", key)?;
        let value = bytes_arg("value", value)?;
        not_forked(py)?;
        let lock = Arc::clone(&self.inner);
        py.detach(move || lock.guarded_put(dlock::Token(token), &key, &value))
            .or_raise(py)
    }

    /// Deletes `key` under the rules of `guarded_put`.
    fn guarded_delete(
        &self,
        py: Python<'_>,
        token: &Bound<'_, PyAny>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let token = crate::convert::u64_arg(py, "token", token)?;
        let key = bytes_arg("key", key)?;
        not_forked(py)?;
        let lock = Arc::clone(&self.inner);
        py.detach(move || lock.guarded_delete(dlock::Token(token), &key))
            .or_raise(py)
    }

    /// Starts an acquire whose token (or error) completes `fut` on `loop`;
    /// the `Acquisition` cancels it.
    fn _acquire_start(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        r#loop: Py<PyAny>,
        fut: Py<PyAny>,
    ) -> PyResult<Acquisition> {
        let timeout = timeout_arg(py, timeout)?;
        let pending = Pending::new(py, r#loop, fut)?;
        let inner = self.inner.acquire_then(true, timeout, move |got| {
            pending.complete(Outcome::Token(got.map(|t| t.get())));
        });
        Ok(Acquisition { inner })
    }

    /// Starts a release that completes `fut` on `loop`.
    fn _release_start(&self, py: Python<'_>, r#loop: Py<PyAny>, fut: Py<PyAny>) -> PyResult<()> {
        let lock = Arc::clone(&self.inner);
        spawn(py, r#loop, fut, async move {
            Outcome::Unit(lock.release_async().await)
        })
    }

    /// Starts a downgrade that completes `fut` on `loop` (the core's
    /// `downgrade_then`).
    fn _downgrade_start(&self, py: Python<'_>, r#loop: Py<PyAny>, fut: Py<PyAny>) -> PyResult<()> {
        let pending = Pending::new(py, r#loop, fut)?;
        self.inner
            .downgrade_then(move |r| pending.complete(Outcome::Unit(r)));
        Ok(())
    }

    /// Starts a close that completes `fut` on `loop`.
    fn _close_start(&self, py: Python<'_>, r#loop: Py<PyAny>, fut: Py<PyAny>) -> PyResult<()> {
        let lock = Arc::clone(&self.inner);
        spawn(py, r#loop, fut, async move {
            Outcome::Unit(lock.close_async().await)
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", ***self.inner)
    }
}
