//! Metrics for Python (issue 22): the core's families, converted to plain
//! tuples for `dlock.prometheus.Collector`, the core's text, and the
//! health check. Names, types and labels are the core's alone.

use pyo3::prelude::*;

use dlock::metrics::Value;

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

/// The core's snapshot of `client`, or with None of every client of the
/// process (`dlock::metrics::process_snapshot`, issue 32).
fn snapshot(client: Option<&Client>) -> dlock::MetricsSnapshot {
    match client {
        Some(c) => c.inner.snapshot(),
        None => dlock::metrics::process_snapshot(),
    }
}

/// The families of `client`'s snapshot (None: every client of the
/// process), per-lock series capped at `max_locks`.
#[pyfunction]
#[pyo3(signature = (client, max_locks))]
pub(crate) fn metrics_families(client: Option<&Client>, max_locks: usize) -> Vec<FamilyTuple> {
    snapshot(client)
        .families_capped(max_locks)
        .into_iter()
        .map(|f| {
            let kind = f.kind.as_str();
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

/// The Prometheus text format of every client of the process, as one
/// (what `dlock.prometheus.Collector` exports; issue 32).
#[pyfunction]
pub(crate) fn process_metrics_text() -> String {
    dlock::metrics::process_snapshot().to_text()
}

/// `Lock.healthy(max_overdue)`: false once holding or draining more than
/// `max_overdue` seconds past the deadline.
#[pyfunction]
pub(crate) fn lock_healthy(py: Python<'_>, lock: &Lock, max_overdue: f64) -> PyResult<bool> {
    crate::error::not_forked(py)?;
    let d = crate::convert::seconds(py, "max_overdue", max_overdue)?;
    Ok(lock.inner.healthy(d))
}
