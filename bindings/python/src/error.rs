//! The one conversion point from the core's failures to Python: every
//! `dlock::Error`, permit refusal and stale token becomes the class of
//! `dlock._errors` named by its word in the core's code table
//! (`dlock::Code`); the message is the core's own text.

use dlock::Code;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

/// `dlock._errors.BY_CODE`: code word -> exception class.
static ERRORS: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

/// The exception of `code` with `message`.
pub(crate) fn error(py: Python<'_>, code: Code, message: String) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let by_code = ERRORS
            .get_or_try_init(py, || -> PyResult<Py<PyDict>> {
                Ok(py
                    .import("dlock._errors")?
                    .getattr("BY_CODE")?
                    .cast_into::<PyDict>()?
                    .unbind())
            })?
            .bind(py);
        let class = match by_code.get_item(code.as_str())? {
            Some(c) => c,
            None => by_code
                .get_item(Code::Panic.as_str())?
                .ok_or_else(|| PyTypeError::new_err("dlock._errors has no `panic`"))?,
        };
        Ok(PyErr::from_value(class.call1((message,))?))
    })();
    made.unwrap_or_else(|e| e)
}

/// A core error as its Python exception (`Fenced` carries `.token`).
pub(crate) fn core_err(py: Python<'_>, e: dlock::Error) -> PyErr {
    let err = error(py, e.status(), e.to_string());
    if let dlock::Error::Fenced(token) = e {
        let _ = err.value(py).setattr("token", token);
    }
    err
}

/// A permit refusal as its `dlock.PermitRefused` subclass; `Forked` in a
/// forked child, whatever the refusal.
pub(crate) fn refused(py: Python<'_>, r: dlock::Refused) -> PyErr {
    if dlock::forked() {
        return core_err(py, dlock::Error::Forked);
    }
    error(py, r.status(), r.to_string())
}

/// A `FenceGate` refusal as `dlock.Stale` with `.token` and `.highest`.
pub(crate) fn stale(py: Python<'_>, s: dlock::Stale) -> PyErr {
    let e = error(py, s.status(), s.to_string());
    let _ = e.value(py).setattr("token", s.token.get());
    let _ = e.value(py).setattr("highest", s.highest.get());
    e
}

/// `dlock.InvalidArgument` with `message` as it is.
pub(crate) fn invalid_argument(py: Python<'_>, message: impl Into<String>) -> PyErr {
    error(py, Code::InvalidArgument, message.into())
}

/// Raises a core result's error.
pub(crate) trait OrRaise<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrRaise<T> for Result<T, dlock::Error> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| core_err(py, e))
    }
}

/// Fails with `dlock.Forked` in a child of `fork()`.
pub(crate) fn not_forked(py: Python<'_>) -> PyResult<()> {
    if dlock::forked() {
        Err(core_err(py, dlock::Error::Forked))
    } else {
        Ok(())
    }
}
