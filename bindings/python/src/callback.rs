//! User callbacks on the core's callback thread: the GIL is taken there, and
//! an exception goes to the logger `dlock` and changes nothing.

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

/// Calls `f(args)` with the GIL taken (skipped while the interpreter is
/// shutting down); an exception goes to `report`.
pub(crate) fn call_back(
    f: &Py<PyAny>,
    what: &'static str,
    args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
) {
    Python::try_attach(|py| {
        if let Err(e) = args(py).and_then(|a| f.bind(py).call1(a)) {
            report(py, what, e);
        }
    });
}
