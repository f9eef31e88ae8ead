//! User callbacks on the core's callback thread: the GIL is taken there, and
//! an exception goes to the logger `dlock` and changes nothing.

use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

/// `logging.getLogger("dlock")`.
static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Reports an exception raised by a callback to the logger `dlock`; it
/// changes nothing else.
fn report(py: Python<'_>, what: &str, e: PyErr) {
    let logged = (|| -> PyResult<()> {
        let logger = LOGGER.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py
                .import("logging")?
                .call_method1("getLogger", ("dlock",))?
                .unbind())
        })?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("exc_info", e.value(py))?;
        logger.bind(py).call_method(
            "error",
            ("exception in the %s callback of a dlock lock", what),
            Some(&kwargs),
        )?;
        Ok(())
    })();
    if let Err(unlogged) = logged {
        unlogged.write_unraisable(py, None);
    }
}

/// A lock's handlers of one kind (`on_fence`, `on_acquired`, ...): a
/// second registration adds to the first (issue 32), and the core's one
/// callback of that kind calls them all in order.
pub(crate) type Handlers = Arc<Mutex<Vec<Py<PyAny>>>>;

/// Adds `f` to `handlers`, refusing at once what cannot be called (not at
/// the fence, in a log). True when it is the first: the core's callback is
/// to be set then.
pub(crate) fn add_handler(
    py: Python<'_>,
    handlers: &Handlers,
    what: &str,
    f: &Py<PyAny>,
) -> PyResult<bool> {
    if !f.bind(py).is_callable() {
        return Err(PyTypeError::new_err(format!(
            "{what} needs a callable, not {}",
            f.bind(py).get_type().name()?
        )));
    }
    let mut all = handlers.lock().unwrap_or_else(|e| e.into_inner());
    all.push(f.clone_ref(py));
    Ok(all.len() == 1)
}

/// Calls every handler of `handlers` with `args`, in the order they were
/// added; each one's exception goes to `report` alone.
pub(crate) fn call_each(
    handlers: &Handlers,
    what: &'static str,
    args: impl for<'py> Fn(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
) {
    crate::process::attach_from_core(|py| {
        let all: Vec<Py<PyAny>> = handlers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|f| f.clone_ref(py))
            .collect();
        for f in all {
            if let Err(e) = args(py).and_then(|a| f.bind(py).call1(a)) {
                report(py, what, e);
            }
        }
    });
}
