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

    /// Admits a read with `token` for `name` (iff it is at least the
    /// highest write admitted) or raises `Stale`.
    fn admit_read(&self, py: Python<'_>, name: String, token: &Bound<'_, PyAny>) -> PyResult<()> {
        let token = crate::convert::u64_arg(py, "token", token)?;
        self.inner
            .admit_read(&name, dlock::Token(token))
            .map_err(|s| stale(py, s))
    }

    /// Admits a write with `token` for `name` (iff it is at least the
    /// highest write and the highest read admitted) or raises `Stale`.
    fn admit_write(&self, py: Python<'_>, name: String, token: &Bound<'_, PyAny>) -> PyResult<()> {
        let token = crate::convert::u64_arg(py, "token", token)?;
        self.inner
            .admit_write(&name, dlock::Token(token))
            .map_err(|s| stale(py, s))
    }

    /// The two watermarks of `name`: (highest write, highest read)
    /// admitted, each None before the first of its mode.
    fn watermarks(&self, name: String) -> (Option<u64>, Option<u64>) {
        let (w, r) = self.inner.watermarks(&name);
        (w.map(|t| t.get()), r.map(|t| t.get()))
    }

    /// The highest token seen for `name`, or None.
    fn highest(&self, name: String) -> Option<u64> {
        self.inner.highest(&name).map(|t| t.get())
    }
}
