//! `dlock._dlock.FenceGate`: the resource side of fencing.

use pyo3::prelude::*;

use crate::error::stale;

/// Accepts a write only if its token is >= the highest seen for its name.
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct FenceGate {
    inner: dlock::FenceGate,
}

#[pymethods]
impl FenceGate {
    #[new]
    fn new() -> FenceGate {
        FenceGate {
            inner: dlock::FenceGate::new(),
        }
    }

    /// Admits `token` for `name` (remembering it) or raises `Stale`.
    fn admit(&self, py: Python<'_>, name: String, token: &Bound<'_, PyAny>) -> PyResult<()> {
        let token = crate::convert::u64_arg(py, "token", token)?;
        self.inner
            .admit(&name, dlock::Token(token))
            .map_err(|s| stale(py, s))
    }

    /// The highest token seen for `name`, or None.
    fn highest(&self, name: String) -> Option<u64> {
        self.inner.highest(&name).map(|t| t.get())
    }
}
