//! Metrics, health and logs for Node (issue 22): the core's families
//! converted to plain objects for `dlock/prometheus` (prometheus.ts), the
//! core's text, and `Lock::healthy`. Names, types and labels are the
//! core's (`dlock::metrics::prometheus`); nothing is derived here.

use napi::bindgen_prelude::*;
use napi_derive::napi;

use dlock::metrics::Value;

use crate::{NativeClient, NativeLock, ms};

/// One series: its label values (in the family's label order) and a
/// number, or a histogram (cumulative counts per bound, then `+Inf`).
#[napi(object)]
pub struct NativeSeries {
    pub labels: Vec<String>,
    pub value: Option<f64>,
    pub bounds: Option<Vec<f64>>,
    pub cumulative: Option<Vec<f64>>,
    pub count: Option<f64>,
    pub sum: Option<f64>,
}

/// One family of the core's snapshot: `kind` is `counter`, `gauge` or
/// `histogram`; a counter's name ends in `_total`.
#[napi(object)]
pub struct NativeFamily {
    pub name: String,
    pub help: String,
    pub kind: String,
    pub label_names: Vec<String>,
    pub series: Vec<NativeSeries>,
}

/// The families of `client`'s snapshot, per-lock series capped at
/// `max_locks` (default: the core's, 100).
#[napi]
pub fn metric_families(client: &NativeClient, max_locks: Option<u32>) -> Vec<NativeFamily> {
    families(client.inner.snapshot(), max_locks)
}

/// The families of every client of the process as one
/// (`dlock::metrics::process_snapshot`, issue 32): what `dlock/prometheus`
/// registers.
#[napi]
pub fn process_metric_families(max_locks: Option<u32>) -> Vec<NativeFamily> {
    families(dlock::metrics::process_snapshot(), max_locks)
}

/// The Prometheus text format of every client of the process as one.
#[napi]
pub fn process_metrics_text() -> String {
    dlock::metrics::process_snapshot().to_text()
}

fn families(snapshot: dlock::MetricsSnapshot, max_locks: Option<u32>) -> Vec<NativeFamily> {
    let max = max_locks.map_or(dlock::metrics::DEFAULT_LOCK_SERIES, |m| m as usize);
    snapshot
        .families_capped(max)
        .into_iter()
        .map(|f| NativeFamily {
            name: f.name.into(),
            help: f.help.into(),
            kind: f.kind.as_str().into(),
            label_names: f.labels.iter().map(|l| (*l).to_owned()).collect(),
            series: f
                .series
                .into_iter()
                .map(|(labels, v)| match v {
                    Value::Number(n) => NativeSeries {
                        labels,
                        value: Some(n),
                        bounds: None,
                        cumulative: None,
                        count: None,
                        sum: None,
                    },
                    Value::Histogram(h) => NativeSeries {
                        labels,
                        value: None,
                        bounds: Some(h.bounds.to_vec()),
                        cumulative: Some(h.cumulative.iter().map(|c| *c as f64).collect()),
                        count: Some(h.count as f64),
                        sum: Some(h.sum),
                    },
                })
                .collect(),
        })
        .collect()
}

/// The Prometheus text format of `client`'s snapshot (the core's renderer).
#[napi]
pub fn metrics_text(client: &NativeClient) -> String {
    client.inner.snapshot().to_text()
}

/// `Lock::healthy`: false once holding or draining more than
/// `max_overdue_ms` past the deadline.
#[napi]
pub fn lock_healthy(lock: &NativeLock, max_overdue_ms: f64) -> Result<bool> {
    Ok(lock.lock.healthy(ms("maxOverdue", max_overdue_ms)?))
}
