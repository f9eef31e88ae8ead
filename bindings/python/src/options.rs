//! A client's or session's timing settings: keywords in seconds to
//! `dlock::Options` (validated by the core), and back to a dict.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{secs_f64, setting_seconds};
use crate::error::OrRaise;

/// The timing settings of a client or session, each `None` for the base's.
#[derive(Default)]
pub(crate) struct Timing {
    pub(crate) ttl: Option<f64>,
    pub(crate) keepalive_interval: Option<f64>,
    pub(crate) keepalive_timeout: Option<f64>,
    pub(crate) retry_interval: Option<f64>,
    pub(crate) margin: Option<f64>,
    pub(crate) reacquire: Option<bool>,
}

impl Timing {
    /// The settings given over `base` (the defaults, or the client's for a
    /// session); the core derives the ones left out (design §14).
    pub(crate) fn options(
        &self,
        py: Python<'_>,
        base: &dlock::Options,
    ) -> PyResult<dlock::Options> {
        let given = |name: &'static str, v: Option<f64>| -> PyResult<Option<Duration>> {
            v.map(|v| setting_seconds(py, name, v)).transpose()
        };
        dlock::PartialOptions {
            ttl: given("ttl", self.ttl)?,
            keepalive_interval: given("keepalive_interval", self.keepalive_interval)?,
            keepalive_timeout: given("keepalive_timeout", self.keepalive_timeout)?,
            retry_interval: given("retry_interval", self.retry_interval)?,
            margin: given("margin", self.margin)?,
            reacquire: self.reacquire,
        }
        .resolve_over(base)
        .or_raise(py)
    }
}

/// The settings as `client.options()` returns them (seconds).
pub(crate) fn options_dict<'py>(
    py: Python<'py>,
    o: &dlock::Options,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("ttl", secs_f64(o.ttl))?;
    d.set_item("keepalive_interval", secs_f64(o.keepalive_interval))?;
    d.set_item("keepalive_timeout", secs_f64(o.keepalive_timeout))?;
    d.set_item("retry_interval", secs_f64(o.retry_interval))?;
    d.set_item("margin", secs_f64(o.margin))?;
    d.set_item("reacquire", o.reacquire)?;
    Ok(d)
}
