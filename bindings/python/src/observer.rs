//! `dlock._dlock.Observer` and `Observed`: an election's leaders as a
//! stream (the core's `Client::observe`), read blocking (Ctrl-C
//! interruptible) or from asyncio, losing no event to a cancelled read;
//! `close` ends a read in progress.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use dlock::Code;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::client::Client;
use crate::complete::Outcome;
use crate::convert::{timeout_arg, type_name};
use crate::election::Leader;
use crate::error::{OrRaise, error, invalid_argument, not_forked};
use crate::reads::{self, ReadSlot, lock_slot};
use crate::wait::SLICE;

/// One event of an observer (see `dlock.Observed`).
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct Observed {
    kind: &'static str,
    leader: Option<Py<Leader>>,
}

impl Observed {
    fn new(py: Python<'_>, e: dlock::Observed) -> PyResult<Observed> {
        let (kind, leader) = (e.kind(), e.leader().cloned());
        let leader = leader.map(|l| Py::new(py, Leader::from(l))).transpose()?;
        Ok(Observed { kind, leader })
    }
}

#[pymethods]
impl Observed {
    /// `"leader"` (a new leader, or the current one first), `"proclaimed"`
    /// (the same leader, a new value), `"no-leader"` or `"reconnecting"`
    /// (the watch is opened again; the state follows, even if unchanged).
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// The leader named (`"leader"`, `"proclaimed"`), else None.
    #[getter]
    fn leader(&self, py: Python<'_>) -> Option<Py<Leader>> {
        self.leader.as_ref().map(|l| l.clone_ref(py))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(match &self.leader {
            Some(l) => format!(
                "<dlock.Observed {} {}>",
                self.kind,
                l.bind(py).repr()?.to_cow()?
            ),
            None => format!("<dlock.Observed {}>", self.kind),
        })
    }
}

type Slot = ReadSlot<dlock::Observer, dlock::Observed>;

/// Completes once `close` was called.
fn closing(slot: &Mutex<Slot>, cx: &mut Context<'_>) -> bool {
    let mut s = lock_slot(slot);
    if s.closing {
        return true;
    }
    s.wakers.push(cx.waker().clone());
    false
}

/// An election's leaders as they change (see `dlock.Observer`).
#[pyclass(module = "dlock._dlock", subclass, frozen)]
pub(crate) struct Observer {
    slot: Arc<Mutex<Slot>>,
    name: String,
}

fn busy(py: Python<'_>) -> PyErr {
    invalid_argument(py, "another read of this observer is in progress")
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.end();
    }
}

impl Observer {
    /// Ends the core's observer now, or at once by the read that has it.
    fn end(&self) {
        let mut slot = lock_slot(&self.slot);
        slot.closing = true;
        if let Some(o) = &slot.reader {
            o.close();
        }
        slot.wake();
    }
}

#[pymethods]
impl Observer {
    /// Observes the election `name` on `client` (no lease, no key of its
    /// own); `Shutdown` on a shut-down client.
    #[new]
    fn new(
        py: Python<'_>,
        client: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
    ) -> PyResult<Observer> {
        let name = name.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "an election name must be a str, not {}",
                type_name(name)
            ))
        })?;
        let name = name.to_cow()?.into_owned();
        let client = client.cast::<Client>().map_err(|_| {
            PyTypeError::new_err(format!(
                "an observer's client must be a dlock.Client, not {}",
                type_name(client)
            ))
        })?;
        not_forked(py)?;
        let c = &client.get().inner;
        let observer = py.detach(|| c.observe(&name)).or_raise(py)?;
        Ok(Observer {
            slot: Arc::new(Mutex::new(Slot::new(observer))),
            name,
        })
    }

    /// The election's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The next event, waiting up to `timeout` seconds (None: as long as it
    /// takes); None once the observer ended (closed); `Timeout` when none
    /// came. Ctrl-C interrupts it.
    #[pyo3(signature = (timeout=None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Observed>> {
        let timeout = timeout_arg(py, timeout)?;
        let until = timeout.map(|t| std::time::Instant::now() + t);
        let mut slot = lock_slot(&self.slot);
        if let Some(e) = slot.ready.take() {
            drop(slot);
            return Observed::new(py, e).map(Some);
        }
        if slot.ended {
            return Ok(None);
        }
        let Some(observer) = slot.reader.take() else {
            return Err(busy(py));
        };
        drop(slot);
        let got = loop {
            let left = until.map(|u| u.saturating_duration_since(std::time::Instant::now()));
            let wait = left.map_or(SLICE, |l| l.min(SLICE));
            match py.detach(|| observer.recv_blocking(Some(wait))) {
                Ok(e) => break Ok(e),
                Err(_) if lock_slot(&self.slot).closing => observer.close(),
                Err(_) if left.is_some_and(|l| l <= wait) => {
                    break Err(error(
                        py,
                        Code::Timeout,
                        "no observer event within the timeout".into(),
                    ));
                }
                Err(_) => {
                    if let Err(e) = py.check_signals() {
                        break Err(e);
                    }
                }
            }
        };
        let mut slot = lock_slot(&self.slot);
        if slot.closing {
            observer.close();
        }
        slot.reader = Some(observer);
        let got = got?;
        slot.ended |= got.is_none();
        drop(slot);
        got.map(|e| Observed::new(py, e)).transpose()
    }

    /// Starts an async read: `fut` completes (with None) once an event is
    /// ready for `_take_ready`, the observer ended (`_ended`), or the read
    /// in progress that this one joined is done (then read again).
    fn _next_start(&self, py: Python<'_>, r#loop: Py<PyAny>, fut: Py<PyAny>) -> PyResult<()> {
        let shared = self.slot.clone();
        reads::start(py, &self.slot, r#loop, fut, |observer| async move {
            let first = {
                let mut recv = pin!(observer.recv());
                poll_fn(|cx| {
                    if let Poll::Ready(e) = recv.as_mut().poll(cx) {
                        return Poll::Ready(Some(e));
                    }
                    if closing(&shared, cx) {
                        return Poll::Ready(None);
                    }
                    Poll::Pending
                })
                .await
            };
            let got = match first {
                Some(e) => e,
                // closed meanwhile: what was queued, then the end
                None => {
                    observer.close();
                    observer.recv().await
                }
            };
            let mut slot = lock_slot(&shared);
            if slot.closing {
                observer.close();
            }
            slot.read_done(observer, got);
            Outcome::Ready
        })
    }

    /// The event an async read made ready, if any.
    fn _take_ready(&self, py: Python<'_>) -> PyResult<Option<Observed>> {
        let e = lock_slot(&self.slot).ready.take();
        e.map(|e| Observed::new(py, e)).transpose()
    }

    /// Whether the observer ended (and every event was taken).
    #[getter]
    fn _ended(&self) -> bool {
        lock_slot(&self.slot).ended()
    }

    /// Ends the observation (its watch stops): the events already queued
    /// are read, then the end. A read in progress ends too. Idempotent.
    fn close(&self) {
        self.end();
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        lock_slot(&self.slot).closing
    }

    fn __repr__(&self) -> String {
        format!("<dlock.Observer {:?}>", self.name)
    }
}
