//! The trace: callback events with the runner's time stamps, the waits on
//! it, and the comparison with a file's expected trace.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One traced event: `"<holder> <event>"`, `at_ms` after the scenario started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub at_ms: u64,
    pub line: String,
}

pub(crate) struct Inner {
    /// Time zero: set again when the face's setup ends (see [`TraceSink::restart`]).
    start: Mutex<Instant>,
    events: Mutex<Vec<Event>>,
    grew: Condvar,
}

impl Inner {
    fn elapsed_ms(&self) -> u64 {
        let start = *self.start.lock().unwrap_or_else(|e| e.into_inner());
        start.elapsed().as_millis() as u64
    }

    pub(crate) fn push(&self, line: String) {
        let at_ms = self.elapsed_ms();
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Event { at_ms, line });
        self.grew.notify_all();
    }
}

/// Where a face's callbacks push their events, from any thread; each is time
/// stamped by the runner on arrival. Cheap to clone.
#[derive(Clone)]
pub struct TraceSink(pub(crate) Arc<Inner>);

impl std::fmt::Debug for TraceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceSink")
            .field("events", &self.lock().len())
            .finish()
    }
}

impl Default for TraceSink {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceSink {
    /// A new, empty trace whose clock starts now.
    pub fn new() -> Self {
        TraceSink(Arc::new(Inner {
            start: Mutex::new(Instant::now()),
            events: Mutex::new(Vec::new()),
            grew: Condvar::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Event>> {
        self.0.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Milliseconds since the scenario started.
    pub fn elapsed_ms(&self) -> u64 {
        self.0.elapsed_ms()
    }

    /// Time zero is now: the runner calls it once the face's setup (its
    /// clients' connections, slow under a sanitizer) is done, so a file's
    /// windows time the steps, not the setup.
    pub fn restart(&self) {
        *self.0.start.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Appends `"<holder> <event>"`.
    pub fn push(&self, line: impl Into<String>) {
        self.0.push(line.into());
    }

    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    /// Waits up to `limit` until `line` appears at or after index `from`;
    /// its index.
    pub fn wait_for(&self, line: &str, from: usize, limit: Duration) -> Option<usize> {
        let find = |ev: &[Event]| {
            ev.iter()
                .skip(from)
                .position(|e| e.line == line)
                .map(|i| i + from)
        };
        let (events, _) = self
            .0
            .grew
            .wait_timeout_while(self.lock(), limit, |ev| find(ev).is_none())
            .unwrap_or_else(|e| e.into_inner());
        find(&events)
    }

    /// Waits up to `limit` until the trace has `n` events; the events then.
    pub fn wait_len(&self, n: usize, limit: Duration) -> Vec<Event> {
        let (events, _) = self
            .0
            .grew
            .wait_timeout_while(self.lock(), limit, |ev| ev.len() < n)
            .unwrap_or_else(|e| e.into_inner());
        events.clone()
    }
}

/// One line of a file's `trace`: the event, and maybe its ` @lo..hi` window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub line: String,
    /// Milliseconds after the start, both ends included.
    pub window: Option<(u64, u64)>,
}

impl Expected {
    /// Parses `"a drained @1250..1500"` or `"a drained"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some((line, w)) = text.split_once(" @") else {
            return Ok(Expected {
                line: text.to_string(),
                window: None,
            });
        };
        let bad = || format!("`{text}`: the window is @lo..hi (ms)");
        let (lo, hi) = w.split_once("..").ok_or_else(bad)?;
        let (lo, hi): (u64, u64) = (
            lo.parse().map_err(|_| bad())?,
            hi.parse().map_err(|_| bad())?,
        );
        if lo > hi {
            return Err(bad());
        }
        Ok(Expected {
            line: line.to_string(),
            window: Some((lo, hi)),
        })
    }
}

/// Compares the trace with the expected one: the same events in the same
/// order, none missing, none extra, each inside its window (the upper end
/// widened by `slack_ms`). The error names the first difference.
pub fn check_trace(expected: &[Expected], actual: &[Event], slack_ms: u64) -> Result<(), String> {
    for i in 0..expected.len().max(actual.len()) {
        match (expected.get(i), actual.get(i)) {
            (Some(want), Some(got)) => {
                if want.line != got.line {
                    return Err(format!(
                        "trace event {i}: expected `{}`, got `{}`",
                        want.line, got.line
                    ));
                }
                if let Some((lo, hi)) = want.window {
                    if got.at_ms < lo || got.at_ms > hi.saturating_add(slack_ms) {
                        let widened = if slack_ms > 0 {
                            format!(" (+{slack_ms} slack)")
                        } else {
                            String::new()
                        };
                        return Err(format!(
                            "trace event {i}: `{}` at {} ms, expected {lo}..{hi} ms{widened}",
                            want.line, got.at_ms
                        ));
                    }
                }
            }
            (Some(want), None) => {
                return Err(format!(
                    "trace has {} events, expected {}: missing from event {i} `{}`",
                    actual.len(),
                    expected.len(),
                    want.line
                ));
            }
            (None, Some(got)) => {
                return Err(format!(
                    "trace has {} events, expected {}: extra event {i} `{}` at {} ms",
                    actual.len(),
                    expected.len(),
                    got.line,
                    got.at_ms
                ));
            }
            (None, None) => unreachable!(),
        }
    }
    Ok(())
}

/// The trace with times, one event a line, for reports.
pub fn show(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| format!("  {:>5} ms  {}\n", e.at_ms, e.line))
        .collect()
}
