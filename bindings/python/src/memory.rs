//! `dlock._dlock.MemoryService`: an embedded, in-process lock service and
//! its service-wide switches.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::convert::bytes_arg;

/// An embedded, in-process lock service (with server-side TTL expiry,
/// tokens and fault switches).
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct MemoryService {
    pub(crate) inner: dlock::MemoryService,
}

#[pymethods]
impl MemoryService {
    /// A new, isolated service.
    #[new]
    fn new() -> MemoryService {
        MemoryService {
            inner: dlock::MemoryService::new(),
        }
    }

    /// The process-wide service (the one `Client()` uses when no
    /// `DLOCK_ENDPOINTS` is set).
    #[staticmethod]
    fn shared() -> MemoryService {
        MemoryService {
            inner: dlock::MemoryService::shared(),
        }
    }

    /// The process-wide service called `name` (`""`: the shared one).
    #[staticmethod]
    fn named(name: String) -> MemoryService {
        MemoryService {
            inner: dlock::MemoryService::named(&name),
        }
    }

    /// The holder's token of the lock `name` as the service sees it.
    fn holder(&self, name: String) -> Option<u64> {
        self.inner.holder(&name).map(|t| t.get())
    }

    /// Stops (True) or restarts (False) server-side expiry.
    #[pyo3(signature = (frozen=true))]
    fn freeze_expiry(&self, frozen: bool) {
        self.inner.freeze_expiry(frozen);
    }

    /// Deletes the key holding `name` (as `etcdctl del`); False if nobody
    /// holds it.
    fn delete_lock_key(&self, name: String) -> bool {
        self.inner.delete_lock_key(&name)
    }

    /// Revokes `lease` (as `etcdctl lease revoke`); False if unknown.
    fn revoke_lease(&self, py: Python<'_>, lease: &Bound<'_, PyAny>) -> PyResult<bool> {
        let lease = crate::convert::i64_arg(py, "lease", lease)?;
        Ok(self.inner.revoke_lease(lease))
    }

    /// Whether `lease` exists.
    fn lease_alive(&self, py: Python<'_>, lease: &Bound<'_, PyAny>) -> PyResult<bool> {
        let lease = crate::convert::i64_arg(py, "lease", lease)?;
        Ok(self.inner.lease_alive(lease))
    }

    /// The value a guarded write put at `key`.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let key = bytes_arg("key", key)?;
        Ok(self.inner.get(&key).map(|v| PyBytes::new(py, &v)))
    }

    /// A service-wide outage (every link's requests fail) or its end.
    #[pyo3(signature = (down=true))]
    fn outage(&self, down: bool) {
        self.inner.outage(down);
    }
}
