//! `dlock._dlock.RwLock`: many readers or one writer on a name
//! (docs/design.md §27). The core's `RwLock` decides everything; its
//! reader and writer are ordinary core locks, which come out as an
//! `RwHolder` that `dlock.Lock(holder, holder.name)` turns into an
//! ordinary `Lock` (its `.mode` set), not acquired yet.

use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::convert::type_name;
use crate::error::OrRaise;
use crate::semaphore::session_of;
use crate::session::Session;

/// A read/write lock (see `dlock.RwLock`); sends nothing itself.
#[pyclass(module = "dlock._dlock", subclass, frozen)]
pub(crate) struct RwLock {
    inner: dlock::RwLock,
}

/// A reader or writer the core made, until `dlock.Lock` takes it (once).
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct RwHolder {
    lock: Mutex<Option<dlock::Lock>>,
    name: String,
}

impl Drop for RwHolder {
    fn drop(&mut self) {
        // The core's drop waits for the driver: not while holding the GIL.
        let lock = self
            .lock
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(lock) = lock {
            Python::attach(|py| py.detach(move || drop(lock)));
        }
    }
}

#[pymethods]
impl RwHolder {
    /// The lock's name (the read/write lock's).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    fn __repr__(&self) -> String {
        format!("RwHolder(name={:?})", self.name)
    }
}

impl RwHolder {
    fn new(lock: dlock::Lock) -> RwHolder {
        RwHolder {
            name: lock.name().to_owned(),
            lock: Mutex::new(Some(lock)),
        }
    }
}

#[pymethods]
impl RwLock {
    /// The read/write lock `name` on `owner`, a Client (its default
    /// session) or a Session.
    #[new]
    fn new(py: Python<'_>, owner: &Bound<'_, PyAny>, name: &Bound<'_, PyAny>) -> PyResult<RwLock> {
        let name = name.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "a lock name must be a str, not {}",
                type_name(name)
            ))
        })?;
        let inner = session_of(owner)?.rwlock(&name.to_cow()?).or_raise(py)?;
        Ok(RwLock { inner })
    }

    /// The name its readers and writers lock.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The session its holders are held under.
    #[getter]
    fn _session(&self) -> Session {
        Session::from(self.inner.session())
    }

    /// A reader, not acquired yet.
    fn _reader(&self, py: Python<'_>) -> PyResult<RwHolder> {
        self.inner.read().map(RwHolder::new).or_raise(py)
    }

    /// A writer, not acquired yet.
    fn _writer(&self, py: Python<'_>) -> PyResult<RwHolder> {
        self.inner.write().map(RwHolder::new).or_raise(py)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// The `RwHolder` `owner` is, if it is one (for `Lock.__new__`).
pub(crate) fn rw_holder<'a, 'py>(owner: &'a Bound<'py, PyAny>) -> Option<&'a Bound<'py, RwHolder>> {
    owner.cast::<RwHolder>().ok()
}

/// The core lock taken from `holder`, checked against the name given.
pub(crate) fn take_holder(holder: &Bound<'_, RwHolder>, name: &str) -> PyResult<dlock::Lock> {
    let h = holder.get();
    if h.name != name {
        return Err(PyTypeError::new_err(format!(
            "a reader or writer makes the Lock of its own name {:?}, not {name:?}",
            h.name
        )));
    }
    h.lock
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .ok_or_else(|| PyRuntimeError::new_err("this reader or writer was taken already"))
}
