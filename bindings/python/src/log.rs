//! The core's log into Python's `logging` (issue 22): logger `dlock`,
//! levels mapped (ERROR 40, WARN 30, INFO 20, DEBUG 10, TRACE 5). The core
//! hands each record to its `dlock-log` thread, which takes the GIL to log
//! it (skipped while the interpreter shuts down), so no driver or callback
//! thread ever waits for Python.

use dlock::log::{Level, Record};
use pyo3::prelude::*;

fn level(l: Level) -> u8 {
    match l {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        _ => 5,
    }
}

fn emit(py: Python<'_>, r: &Record) -> PyResult<()> {
    let logger = py
        .import("logging")?
        .call_method1("getLogger", ("dlock",))?;
    let l = level(r.level);
    if logger.call_method1("isEnabledFor", (l,))?.is_truthy()? {
        logger.call_method1("log", (l, "%s", r.message.as_str()))?;
    }
    Ok(())
}

/// Routes the core's log to `logging` (`on`), or stops.
#[pyfunction]
pub(crate) fn route_logs(py: Python<'_>, on: bool) -> PyResult<()> {
    let sink: Option<dlock::log::Sink> = on.then(|| {
        Box::new(|r: Record| {
            crate::process::attach_from_core(|py| {
                let _ = emit(py, &r);
            });
        }) as dlock::log::Sink
    });
    // The GIL released: the sink takes it under the core's lock.
    py.detach(|| dlock::log::forward(Level::DEBUG, sink))
        .map_err(|e| crate::error::core_err(py, e))
}
