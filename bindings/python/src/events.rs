//! `dlock._dlock.Event` and `EventStream`: a lock's events, read blocking
//! (Ctrl-C interruptible) or from asyncio, losing none to a cancelled read.

use std::sync::{Arc, Mutex};

use dlock::Code;
use pyo3::prelude::*;

use crate::complete::Outcome;
use crate::convert::{instant_secs, timeout_arg};
use crate::error::{error, invalid_argument};
use crate::reads::{self, ReadSlot, lock_slot};
use crate::wait::SLICE;

/// One event of a lock; `str(event)` is the scenario trace line.
#[pyclass(module = "dlock._dlock", frozen, get_all)]
pub(crate) struct Event {
    /// `"state"`, `"fence"`, `"acquired"` or `"drained"`.
    kind: &'static str,
    /// fence, acquired: the token.
    token: Option<u64>,
    /// fence: permits in flight.
    in_flight: Option<u64>,
    /// state: the state left, the state entered, the reason (words).
    from_state: Option<&'static str>,
    to_state: Option<&'static str>,
    reason: Option<&'static str>,
    /// When the core decided it, seconds on `time.CLOCK_BOOTTIME`.
    at: f64,
    /// The trace line, as `str(event)`.
    line: String,
}

impl From<&dlock::LockEvent> for Event {
    fn from(e: &dlock::LockEvent) -> Event {
        let mut ev = Event {
            kind: e.kind(),
            token: None,
            in_flight: None,
            from_state: None,
            to_state: None,
            reason: None,
            at: instant_secs(e.at()),
            line: e.to_string(),
        };
        match *e {
            dlock::LockEvent::State { change, .. } => {
                ev.from_state = Some(change.from.as_str());
                ev.to_state = Some(change.to.as_str());
                ev.reason = Some(change.reason.as_str());
            }
            dlock::LockEvent::Fence {
                token, in_flight, ..
            } => {
                ev.token = Some(token.get());
                ev.in_flight = Some(in_flight);
            }
            dlock::LockEvent::Acquired { token, .. } => ev.token = Some(token.get()),
            _ => {}
        }
        ev
    }
}

#[pymethods]
impl Event {
    fn __str__(&self) -> &str {
        &self.line
    }

    fn __repr__(&self) -> String {
        format!("<dlock.Event {}>", self.line)
    }
}

type StreamSlot = ReadSlot<dlock::EventStream, dlock::LockEvent>;

/// A lock's events, in order (see `dlock.Lock.events`).
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct EventStream {
    slot: Arc<Mutex<StreamSlot>>,
}

fn busy(py: Python<'_>) -> PyErr {
    invalid_argument(py, "another read of this event stream is in progress")
}

impl EventStream {
    pub(crate) fn new(stream: dlock::EventStream) -> EventStream {
        EventStream {
            slot: Arc::new(Mutex::new(StreamSlot::new(stream))),
        }
    }
}

#[pymethods]
impl EventStream {
    /// The next event, waiting up to `timeout` seconds (None: as long as it
    /// takes); None once the stream ended; `Timeout` when none came.
    /// Ctrl-C interrupts it.
    #[pyo3(signature = (timeout=None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Event>> {
        let timeout = timeout_arg(py, timeout)?;
        let until = timeout.map(|t| std::time::Instant::now() + t);
        let mut slot = lock_slot(&self.slot);
        if let Some(e) = slot.ready.take() {
            return Ok(Some(Event::from(&e)));
        }
        if slot.ended {
            return Ok(None);
        }
        let Some(mut stream) = slot.reader.take() else {
            return Err(busy(py));
        };
        drop(slot);
        let got = loop {
            let left = until.map(|u| u.saturating_duration_since(std::time::Instant::now()));
            let wait = left.map_or(SLICE, |l| l.min(SLICE));
            match py.detach(|| stream.recv_blocking(Some(wait))) {
                Ok(e) => break Ok(e),
                Err(()) if left.is_some_and(|l| l <= wait) => {
                    break Err(error(
                        py,
                        Code::Timeout,
                        "no event within the timeout".into(),
                    ));
                }
                Err(()) => {
                    if let Err(e) = py.check_signals() {
                        break Err(e);
                    }
                }
            }
        };
        let mut slot = lock_slot(&self.slot);
        slot.reader = Some(stream);
        let got = got?;
        slot.ended |= got.is_none();
        Ok(got.as_ref().map(Event::from))
    }

    /// Starts an async read: `fut` completes (with None) once an event is
    /// ready for `_take_ready`, the stream ended (`_ended`), or the read in
    /// progress that this one joined is done (then read again).
    fn _next_start(&self, py: Python<'_>, r#loop: Py<PyAny>, fut: Py<PyAny>) -> PyResult<()> {
        let shared = self.slot.clone();
        reads::start(py, &self.slot, r#loop, fut, |mut stream| async move {
            let got = stream.recv().await;
            lock_slot(&shared).read_done(stream, got);
            Outcome::Ready
        })
    }

    /// The event an async read made ready, if any.
    fn _take_ready(&self) -> Option<Event> {
        lock_slot(&self.slot).ready.take().as_ref().map(Event::from)
    }

    /// Whether the stream ended (and every event was taken).
    #[getter]
    fn _ended(&self) -> bool {
        lock_slot(&self.slot).ended()
    }
}
