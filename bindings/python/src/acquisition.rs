//! `dlock._dlock.Acquisition`: an async acquire in progress, as the core
//! hands it out; what a cancelled asyncio task calls.

use pyo3::prelude::*;

/// A pending acquisition (see `dlock.Lock.acquire_async`).
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct Acquisition {
    pub(crate) inner: dlock::Acquisition,
}

#[pymethods]
impl Acquisition {
    /// Leaves nothing held by this acquisition, whenever called (decided
    /// by the core: a queued wait ends, a key it put is deleted, a lock it
    /// already won is released). Idempotent; never blocks.
    fn cancel(&self) {
        self.inner.cancel();
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}
