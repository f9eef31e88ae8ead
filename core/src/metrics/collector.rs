//! The `prometheus` feature: a collector for the `prometheus-client` crate
//! that the application registers in its own `Registry` (no global state,
//! no HTTP server). Each scrape reads [`crate::Client::snapshot`] and
//! encodes the same families as the text renderer.

use prometheus_client::collector::Collector as Collect;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::family::{DEFAULT_LOCK_SERIES, Kind, Value};

/// Reads a client's snapshot on every scrape:
/// `registry.register_collector(Box::new(Collector::new(client.clone())))`.
#[derive(Debug)]
pub struct Collector {
    client: crate::Client,
    max_locks: usize,
}

impl Collector {
    /// A collector of `client`'s sessions and locks (per-lock series capped
    /// at [`DEFAULT_LOCK_SERIES`]).
    pub fn new(client: crate::Client) -> Collector {
        Collector {
            client,
            max_locks: DEFAULT_LOCK_SERIES,
        }
    }

    /// At most `max_locks` per-lock series, the rest folded into one.
    pub fn with_max_locks(mut self, max_locks: usize) -> Collector {
        self.max_locks = max_locks;
        self
    }
}

impl Collect for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in self.client.snapshot().families_capped(self.max_locks) {
            let (name, kind) = match f.kind {
                // prometheus-client adds the `_total` suffix itself.
                Kind::Counter => (
                    f.name.strip_suffix("_total").unwrap_or(f.name),
                    MetricType::Counter,
                ),
                Kind::Gauge => (f.name, MetricType::Gauge),
                Kind::Histogram => (f.name, MetricType::Histogram),
            };
            let mut metric = encoder.encode_descriptor(name, f.help, None, kind)?;
            for (values, v) in &f.series {
                let labels: Vec<(String, String)> = f
                    .labels
                    .iter()
                    .map(|l| (*l).to_owned())
                    .zip(values.iter().cloned())
                    .collect();
                let mut m = metric.encode_family(&labels)?;
                match (f.kind, v) {
                    // Counts are whole: encoded as integers, as the core's
                    // own text writes them.
                    (Kind::Counter, Value::Number(n)) => {
                        m.encode_counter::<NoLabelSet, _, f64>(&(*n as u64), None)?
                    }
                    (_, Value::Number(n)) if n.fract() == 0.0 => m.encode_gauge(&(*n as i64))?,
                    (_, Value::Number(n)) => m.encode_gauge(n)?,
                    (_, Value::Histogram(h)) => {
                        // Per-bucket counts; `f64::MAX` is `+Inf` here.
                        let mut prev = 0;
                        let buckets: Vec<(f64, u64)> = h
                            .bounds
                            .iter()
                            .copied()
                            .chain([f64::MAX])
                            .zip(&h.cumulative)
                            .map(|(b, c)| {
                                let n = c - prev;
                                prev = *c;
                                (b, n)
                            })
                            .collect();
                        m.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?
                    }
                }
            }
        }
        Ok(())
    }
}
