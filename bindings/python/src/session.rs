//! `dlock._dlock.Session`: one lease shared by any number of locks.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{py_opt, secs_f64};
use crate::error::{OrRaise, not_forked};
use crate::options::options_dict;

/// One lease shared by any number of locks.
#[pyclass(module = "dlock._dlock", subclass, frozen)]
pub(crate) struct Session {
    pub(crate) inner: dlock::Session,
}

/// Another handle to the core's session (a lock's, the client's default).
impl From<&dlock::Session> for Session {
    fn from(s: &dlock::Session) -> Session {
        Session { inner: s.clone() }
    }
}

#[pymethods]
impl Session {
    /// The lease, while one is granted.
    #[getter]
    fn lease(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        not_forked(py)?;
        Ok(self.inner.lease())
    }

    /// Whether this is its client's default session.
    #[getter]
    fn is_default(&self) -> bool {
        self.inner.is_default()
    }

    /// The session's timing settings, in seconds.
    fn options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        options_dict(py, self.inner.options())
    }

    /// The lease, keepalives sent, locks, last keepalive round trip.
    fn stats(&self, py: Python<'_>) -> PyResult<SessionStats> {
        not_forked(py)?;
        let s = self.inner.stats();
        Ok(SessionStats {
            lease: s.lease,
            keepalives: s.keepalives,
            locks: s.locks,
            last_keepalive_rtt: s.last_keepalive_rtt.map(secs_f64),
        })
    }

    /// Releases every lock of the session and revokes its lease.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        not_forked(py)?;
        let s = self.inner.clone();
        py.detach(move || s.close()).or_raise(py)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// What `Session.stats()` reports.
#[pyclass(module = "dlock._dlock", frozen, get_all)]
pub(crate) struct SessionStats {
    lease: Option<i64>,
    keepalives: u64,
    locks: u64,
    last_keepalive_rtt: Option<f64>,
}

#[pymethods]
impl SessionStats {
    fn __repr__(&self) -> String {
        format!(
            "SessionStats(lease={}, keepalives={}, locks={}, last_keepalive_rtt={})",
            py_opt(self.lease),
            self.keepalives,
            self.locks,
            py_opt(self.last_keepalive_rtt)
        )
    }
}
