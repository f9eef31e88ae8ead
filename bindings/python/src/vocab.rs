//! The core's vocabulary (code and state words) and its clock, for the
//! pure-Python layer and the tests.

use pyo3::prelude::*;

use crate::convert::instant_secs;

/// Every code word of the core's table, in C order.
#[pyfunction]
pub(crate) fn codes() -> Vec<&'static str> {
    dlock::Code::ALL.iter().map(|c| c.as_str()).collect()
}

/// Every state name, in order.
#[pyfunction]
pub(crate) fn states() -> Vec<&'static str> {
    dlock::State::ALL.iter().map(|s| s.as_str()).collect()
}

/// Seconds on dlock's clock (`CLOCK_BOOTTIME` on Linux).
#[pyfunction]
pub(crate) fn now() -> f64 {
    instant_secs(dlock::Clock::system().now())
}
