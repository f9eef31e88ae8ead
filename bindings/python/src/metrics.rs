//! Metrics for Python (issue 22): the core's families, converted to plain
//! tuples for `dlock.prometheus.Collector`, the core's text, and the
//! health check. Names, types and labels are the core's alone.

use pyo3::prelude::*;

use dlock::metrics::{Kind, Value};

use crate::client::Client;
use crate::lock::Lock;

/// One series: label values, and either a number or a histogram as
/// (upper bounds, cumulative counts, count, sum).
type Series = (
    Vec<String>,
    Option<f64>,
    Option<(Vec<f64>, Vec<u64>, u64, f64)>,
);

/// `(name, help, kind, label names, series)` per family; `kind` is
/// `counter`, `gauge` or `histogram`.
type FamilyTuple = (String, String, String, Vec<String>, Vec<Series>);

/// The families of `client`'s snapshot, per-lock series capped at
/// `max_locks`.
#[pyfunction]
pub(crate) fn metrics_families(client: &Client, max_locks: usize) -> Vec<FamilyTuple> {
    client
        .inner
        .snapshot()
        .families_capped(max_locks)
        .into_iter()
        .map(|f| {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            let series = f
                .series
                .into_iter()
                .map(|(labels, v)| match v {
                    Value::Number(n) => (labels, Some(n), None),
                    Value::Histogram(h) => (
                        labels,
                        None,
                        Some((h.bounds.to_vec(), h.cumulative, h.count, h.sum)),
                    ),
                })
                .collect();
            (
                f.name.to_owned(),
                f.help.to_owned(),
                kind.to_owned(),
                f.labels.iter().map(|l| (*l).to_owned()).collect(),
                series,
            )
        })
        .collect()
}

/// The Prometheus text format of `client`'s snapshot.
#[pyfunction]
pub(crate) fn metrics_text(py: Python<'_>, client: &Client) -> PyResult<String> {
    // In a forked child the parent's numbers are not this process's.
    crate::error::not_forked(py)?;
    Ok(client.inner.snapshot().to_text())
}

/// `Lock.healthy(max_overdue)`: false once holding or draining more than
/// `max_overdue` seconds past the deadline.
#[pyfunction]
pub(crate) fn lock_healthy(py: Python<'_>, lock: &Lock, max_overdue: f64) -> PyResult<bool> {
    crate::error::not_forked(py)?;
    let d = std::time::Duration::try_from_secs_f64(max_overdue)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("max_overdue: {e}")))?;
    Ok(lock.inner.healthy(d))
}
