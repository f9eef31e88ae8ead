//! The unit every face renders: a [`Family`] of series, and the histogram
//! as read. A leaf of the metrics, so the renderer and the collector read
//! it without reading the metrics' registry, and the registry re-exports it.

/// Per-lock series kept by default; the locks past it (in name order) are
/// folded into one series labelled [`OTHER`](super::OTHER).
pub const DEFAULT_LOCK_SERIES: usize = 100;

/// A histogram as read: `cumulative[i]` counts the observations
/// `<= bounds[i]`, the last entry (`+Inf`) all of them.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// Upper bounds, seconds.
    pub bounds: &'static [f64],
    /// Cumulative counts, one per bound and one for `+Inf`.
    pub cumulative: Vec<u64>,
    /// Observations.
    pub count: u64,
    /// Sum of the observations, seconds.
    pub sum: f64,
}

impl HistogramSnapshot {
    /// Adds another reading of the same histogram.
    pub(super) fn add(&mut self, o: &HistogramSnapshot) {
        for (a, b) in self.cumulative.iter_mut().zip(&o.cumulative) {
            *a += b;
        }
        self.count += o.count;
        self.sum += o.sum;
    }
}

/// A metric's type.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Fixed buckets (`_bucket`, `_sum`, `_count`).
    Histogram,
}

impl Kind {
    /// The type's word in the Prometheus text format (`# TYPE`), which
    /// every face's families carry too: `counter`, `gauge`, `histogram`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One series of a family.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A counter's or gauge's value.
    Number(f64),
    /// A histogram.
    Histogram(HistogramSnapshot),
}

/// One metric family: the unit every face renders (names, help, types and
/// labels come from here alone).
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// Full name (counters with `_total`).
    pub name: &'static str,
    /// One line of help.
    pub help: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Label names, in order.
    pub labels: &'static [&'static str],
    /// Label values (in `labels`' order) and the value.
    pub series: Vec<(Vec<String>, Value)>,
}
