//! `dlock._dlock.Permit`: permission for one unit of work.

use pyo3::prelude::*;

use crate::convert::secs_f64;

/// Permission for one unit of work; a context manager that ends it.
#[pyclass(module = "dlock._dlock")]
pub(crate) struct Permit {
    inner: Option<dlock::OwnedPermit>,
    token: u64,
}

impl Permit {
    pub(crate) fn new(p: dlock::OwnedPermit) -> Permit {
        Permit {
            token: p.token().get(),
            inner: Some(p),
        }
    }
}

#[pymethods]
impl Permit {
    /// The token every write of this unit of work carries.
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// Whether the work may still commit (re-reads the clock); False once
    /// ended.
    fn valid(&self) -> bool {
        self.inner.as_ref().is_some_and(|p| p.valid())
    }

    /// Seconds left before the lock's deadline while this token holds; 0
    /// once it does not (or the permit ended).
    #[getter]
    fn remaining(&self) -> f64 {
        self.inner.as_ref().map_or(0.0, |p| secs_f64(p.remaining()))
    }

    /// Ends the unit of work (twice is harmless).
    fn end(&mut self) {
        self.inner = None;
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(
        &mut self,
        _ty: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.inner = None;
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Permit(token={}, live={})",
            self.token,
            self.inner.is_some()
        )
    }
}
