//! `dlock._dlock.Link`: one client's link to an embedded service, with its
//! fault switches; `stall_driver` starves the driver as a busy process would.

use pyo3::prelude::*;

use crate::error::not_forked;
use crate::memory::MemoryService;

/// One client's link to an embedded service: its fault switches.
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct Link {
    pub(crate) inner: dlock::MemoryBackend,
}

#[pymethods]
impl Link {
    /// The service this link talks to.
    #[getter]
    fn service(&self) -> MemoryService {
        MemoryService {
            inner: self.inner.service().clone(),
        }
    }

    /// Requests wait until `heal()`, then arrive late.
    fn partition(&self) {
        self.inner.partition();
    }

    /// Ends a partition.
    fn heal(&self) {
        self.inner.heal();
    }

    /// Keepalives renew the lease but their replies are lost (False: they
    /// arrive again).
    #[pyo3(signature = (on=true))]
    fn drop_keepalive_replies(&self, on: bool) {
        self.inner.drop_keepalive_replies(on);
    }

    /// Replies arrive `seconds` late (0: on time).
    fn delay_keepalive_replies(&self, py: Python<'_>, seconds: f64) -> PyResult<()> {
        let d = crate::convert::seconds(py, "delay", seconds)?;
        self.inner.delay_keepalive_replies(d);
        Ok(())
    }

    /// Keepalives fail at once with `message` (None: they work again).
    #[pyo3(signature = (message="injected failure"))]
    fn fail_keepalives(&self, message: Option<&str>) {
        self.inner.fail_keepalives(message);
    }

    /// The service drops this link's leases: its locks fence at once.
    fn declare_lease_lost(&self) {
        self.inner.declare_lease_lost();
    }
}

/// Blocks dlock's driver thread for `seconds` (as a starved process would),
/// without blocking the caller.
#[pyfunction]
pub(crate) fn stall_driver(py: Python<'_>, seconds: f64) -> PyResult<()> {
    let d = crate::convert::seconds(py, "seconds", seconds)?;
    not_forked(py)?;
    dlock::memory::stall_driver(d);
    Ok(())
}
