//! `dlock._dlock.Semaphore`: N holders at once, each on its own slot
//! (docs/design.md §26). The core's `Semaphore` decides everything (the
//! limit, which slot, the wait, the cancel); this file converts. A slot
//! won comes out as a `HeldSlot`, which `dlock.Lock(held, held.name)`
//! turns into an ordinary held `Lock` (its `.slot` set).
//!
//! Blocking calls poll the core's future on the caller's thread without
//! the GIL (`wait_interruptible`: Ctrl-C drops it, which is the core's
//! cancel). The async acquire is the core's completion form
//! (`Semaphore::acquire_then`): its `cancel()` leaves nothing held, even a
//! slot won just then.

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::client::Client;
use crate::complete::{Outcome, Pending};
use crate::convert::{timeout_arg, type_name, u64_arg};
use crate::error::{OrRaise, not_forked};
use crate::session::Session;
use crate::wait::{blocking, wait_interruptible};

/// A counting semaphore (see `dlock.Semaphore`).
#[pyclass(module = "dlock._dlock", subclass, frozen)]
pub(crate) struct Semaphore {
    inner: dlock::Semaphore,
}

/// A slot a semaphore's acquire won, until `dlock.Lock` takes it (once).
/// Dropped untaken, it releases the slot (the core's `Lock` drop).
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct HeldSlot {
    lock: Mutex<Option<dlock::Lock>>,
    name: String,
}

impl HeldSlot {
    fn new(lock: dlock::Lock) -> HeldSlot {
        HeldSlot {
            name: lock.name().to_owned(),
            lock: Mutex::new(Some(lock)),
        }
    }

    /// The slot's lock, taken (by `Lock.__new__`): `None` once taken.
    pub(crate) fn take(&self) -> Option<dlock::Lock> {
        locked(&self.lock).take()
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        // The core's drop waits for the driver: not while holding the GIL.
        if let Some(lock) = locked(&self.lock).take() {
            Python::attach(|py| py.detach(move || drop(lock)));
        }
    }
}

#[pymethods]
impl HeldSlot {
    /// The slot's lock name (`<semaphore>/slot/<i>`).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    fn __repr__(&self) -> String {
        format!("HeldSlot(name={:?})", self.name)
    }
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The core's session of `owner`, a Client (its default session) or a
/// Session.
pub(crate) fn session_of(owner: &Bound<'_, PyAny>) -> PyResult<dlock::Session> {
    if let Ok(c) = owner.cast::<Client>() {
        Ok(c.get().inner.default_session().clone())
    } else if let Ok(s) = owner.cast::<Session>() {
        Ok(s.get().inner.clone())
    } else {
        Err(PyTypeError::new_err(
            "an owner must be a dlock.Client or a dlock.Session",
        ))
    }
}

#[pymethods]
impl Semaphore {
    /// The semaphore `name` of `limit` slots on `owner`, a Client (its
    /// default session) or a Session: the core records the limit (first
    /// handle) or compares it (`InvalidArgument` naming both). Blocks for
    /// that one request without the GIL; Ctrl-C interrupts it.
    #[new]
    fn new(
        py: Python<'_>,
        owner: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        limit: &Bound<'_, PyAny>,
    ) -> PyResult<Semaphore> {
        let name = name.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "a semaphore name must be a str, not {}",
                type_name(name)
            ))
        })?;
        let name = name.to_cow()?.into_owned();
        // Out of u32: the core's own refusal of a limit over its maximum.
        let limit = u32::try_from(u64_arg(py, "limit", limit)?).unwrap_or(u32::MAX);
        let session = session_of(owner)?;
        not_forked(py)?;
        let made = wait_interruptible(
            py,
            async move { session.semaphore_async(&name, limit).await },
        )?;
        Ok(Semaphore {
            inner: made.or_raise(py)?,
        })
    }

    /// The semaphore's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// How many holders it admits at once.
    #[getter]
    fn limit(&self) -> u32 {
        self.inner.limit()
    }

    /// The session its slots are held under.
    #[getter]
    fn _session(&self) -> Session {
        Session::from(self.inner.session())
    }

    /// Takes a slot, waiting up to `timeout` seconds (None: as long as it
    /// takes; 0: one try). Releases the GIL; Ctrl-C interrupts it and
    /// cancels the acquire (nothing held).
    #[pyo3(signature = (timeout=None))]
    fn _acquire(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<HeldSlot> {
        let timeout = timeout_arg(py, timeout)?;
        blocking(py, || self.inner.acquire_async(timeout)).map(HeldSlot::new)
    }

    /// Takes a free slot, else raises `WouldBlock`.
    fn _try_acquire(&self, py: Python<'_>) -> PyResult<HeldSlot> {
        blocking(py, || self.inner.try_acquire_async()).map(HeldSlot::new)
    }

    /// Starts an acquire on the core's driver; its outcome (None, or the
    /// error) completes `fut` on `loop`, and the slot won waits in the
    /// returned `SemaphoreAcquisition` (`_take()`).
    fn _acquire_start(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        r#loop: Py<PyAny>,
        fut: Py<PyAny>,
    ) -> PyResult<SemaphoreAcquisition> {
        let timeout = timeout_arg(py, timeout)?;
        let pending = Pending::new(py, r#loop, fut)?;
        let inner = self
            .inner
            .acquire_then(timeout, move |r| pending.complete(Outcome::Unit(r)));
        Ok(SemaphoreAcquisition { inner })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// A semaphore's acquire in progress (see `dlock.Semaphore.acquire_async`).
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct SemaphoreAcquisition {
    inner: dlock::SemaphoreAcquisition,
}

impl Drop for SemaphoreAcquisition {
    fn drop(&mut self) {
        // A slot won and never taken is released, without the GIL (the
        // core's drop waits for the driver).
        if let Some(lock) = self.inner.take() {
            Python::attach(|py| py.detach(move || drop(lock)));
        }
    }
}

#[pymethods]
impl SemaphoreAcquisition {
    /// Leaves nothing held by this acquire, whenever called (the core's
    /// `SemaphoreAcquisition::cancel`). Idempotent; never blocks on the
    /// service.
    fn cancel(&self, py: Python<'_>) {
        let inner = self.inner.clone();
        py.detach(move || inner.cancel());
    }

    /// The slot won, once the future completed without an error.
    fn _take(&self) -> PyResult<HeldSlot> {
        self.inner
            .take()
            .map(HeldSlot::new)
            .ok_or_else(|| PyRuntimeError::new_err("no slot to take: not won, cancelled or taken"))
    }
}

/// The `HeldSlot` `owner` is, if it is one (for `Lock.__new__`).
pub(crate) fn held_slot<'a, 'py>(owner: &'a Bound<'py, PyAny>) -> Option<&'a Bound<'py, HeldSlot>> {
    owner.cast::<HeldSlot>().ok()
}

/// A core lock taken from `held`, checked against the name given.
pub(crate) fn take_slot(held: &Bound<'_, HeldSlot>, name: &str) -> PyResult<dlock::Lock> {
    let h = held.get();
    if h.name != name {
        return Err(PyTypeError::new_err(format!(
            "a held slot makes the Lock of its own name {:?}, not {name:?}",
            h.name
        )));
    }
    h.take()
        .ok_or_else(|| PyRuntimeError::new_err("this held slot was taken already"))
}
