//! How async calls complete, with no executor of the face's own: the core
//! runs the work (`Lock::acquire_then`, `dlock::spawn_then`) and calls back
//! once on its callback thread; there the GIL is taken and the outcome is
//! handed to the awaiting asyncio loop with `call_soon_threadsafe`.

use std::future::Future;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::error::{core_err, not_forked};

/// `dlock._aio.complete(fut, value, exc)`.
static COMPLETE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// What an async call produced, turned into Python under the GIL.
pub(crate) enum Outcome {
    Token(Result<u64, dlock::Error>),
    Unit(Result<(), dlock::Error>),
    /// An event stream read: the event waits in its slot.
    Ready,
}

/// An asyncio future waiting for the core's outcome.
pub(crate) struct Pending {
    event_loop: Py<PyAny>,
    py_future: Py<PyAny>,
}

impl Pending {
    /// `py_future` on `event_loop`; refused in a forked child, where the
    /// core runs nothing.
    pub(crate) fn new(
        py: Python<'_>,
        event_loop: Py<PyAny>,
        py_future: Py<PyAny>,
    ) -> PyResult<Pending> {
        not_forked(py)?;
        Ok(Pending {
            event_loop,
            py_future,
        })
    }

    /// Hands `outcome` to the future's loop (on the core's callback thread;
    /// nothing while the interpreter shuts down).
    pub(crate) fn complete(self, outcome: Outcome) {
        crate::process::attach_from_core(|py| {
            let _closed_loop = self.deliver(py, outcome);
        });
    }

    /// An error here means the loop is closed: nobody awaits the outcome.
    fn deliver(&self, py: Python<'_>, outcome: Outcome) -> PyResult<()> {
        let (value, exc): (Py<PyAny>, Py<PyAny>) = match outcome {
            Outcome::Token(Ok(t)) => (t.into_pyobject(py)?.into_any().unbind(), py.None()),
            Outcome::Unit(Ok(())) | Outcome::Ready => (py.None(), py.None()),
            Outcome::Token(Err(e)) | Outcome::Unit(Err(e)) => {
                (py.None(), core_err(py, e).into_value(py).into_any())
            }
        };
        let complete = COMPLETE.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("dlock._aio")?.getattr("complete")?.unbind())
        })?;
        self.event_loop.bind(py).call_method1(
            "call_soon_threadsafe",
            (complete, &self.py_future, value, exc),
        )?;
        Ok(())
    }
}

/// Runs `work` on the core's driver (`dlock::spawn_then`); its outcome
/// completes `py_future` on `event_loop`.
pub(crate) fn spawn(
    py: Python<'_>,
    event_loop: Py<PyAny>,
    py_future: Py<PyAny>,
    work: impl Future<Output = Outcome> + Send + 'static,
) -> PyResult<()> {
    let pending = Pending::new(py, event_loop, py_future)?;
    dlock::spawn_then(work, move |outcome| pending.complete(outcome));
    Ok(())
}
