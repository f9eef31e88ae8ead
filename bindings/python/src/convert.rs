//! Argument conversions every wrapped type shares: seconds as floats,
//! bytes-or-str, type names for a `TypeError`.

use std::time::Duration;

use dlock::Code;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::error::{OrRaise, error};

/// Seconds as a `Duration`, for an argument: the core's rule
/// (`dlock::options::argument_secs`, `invalid_argument` naming `what`).
pub(crate) fn seconds(py: Python<'_>, what: &str, v: f64) -> PyResult<Duration> {
    dlock::options::argument_secs(what, v).or_raise(py)
}

/// Seconds as a `Duration`, for a timing setting: the core's rule
/// (`dlock::options::setting_secs`, `invalid_option` naming it).
pub(crate) fn setting_seconds(py: Python<'_>, setting: &'static str, v: f64) -> PyResult<Duration> {
    dlock::options::setting_secs(setting, v).or_raise(py)
}

/// A timeout argument: `None` waits as long as it takes.
pub(crate) fn timeout_arg(py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Duration>> {
    timeout.map(|t| seconds(py, "timeout", t)).transpose()
}

/// A duration as Python's seconds.
pub(crate) fn secs_f64(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A point on dlock's clock as seconds on `time.CLOCK_BOOTTIME`.
pub(crate) fn instant_secs(at: dlock::Instant) -> f64 {
    at.as_nanos() as f64 / 1e9
}

/// `None` or the value, as Python prints it.
pub(crate) fn py_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "None".to_string(), |v| v.to_string())
}

/// Bytes from `bytes`, `bytearray` or `str` (UTF-8).
pub(crate) fn bytes_arg(what: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(s.to_cow()?.as_bytes().to_vec());
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    let refuse =
        || PyTypeError::new_err(format!("{what} must be bytes or str, not {}", type_name(v)));
    // A list or tuple of ints would pass as bytes below and be stored as
    // bytes the caller never wrote (`[]` as `b""`): bytes-like only.
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        return Err(refuse());
    }
    v.extract::<Vec<u8>>().map_err(|_| refuse())
}

/// The name of `v`'s type, for a `TypeError`.
pub(crate) fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// An integer argument (a token, a lease): one out of range is the core's
/// `invalid_argument` (a `ValueError`), not Python's `OverflowError`; a
/// non-integer stays a `TypeError`.
pub(crate) fn u64_arg(py: Python<'_>, what: &str, v: &Bound<'_, PyAny>) -> PyResult<u64> {
    v.extract::<u64>()
        .map_err(|e| out_of_range(py, what, "0 to 2**64-1", e))
}

/// [`u64_arg`] for a signed id (a lease).
pub(crate) fn i64_arg(py: Python<'_>, what: &str, v: &Bound<'_, PyAny>) -> PyResult<i64> {
    v.extract::<i64>()
        .map_err(|e| out_of_range(py, what, "-2**63 to 2**63-1", e))
}

fn out_of_range(py: Python<'_>, what: &str, range: &str, e: PyErr) -> PyErr {
    if e.is_instance_of::<PyOverflowError>(py) {
        error(
            py,
            Code::InvalidArgument,
            format!("{what} must be an integer from {range}"),
        )
    } else {
        e
    }
}
