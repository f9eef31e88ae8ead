//! `dlock._dlock`: the native module under the Python package `dlock`.
//!
//! It converts between Python and the core and decides nothing about
//! leases, deadlines or tokens (docs/design.md §19). One file a wrapped
//! type; `error.rs` is the one conversion point from the core's errors to
//! the classes of `dlock._errors`. Durations are seconds as floats.

mod acquisition;
mod callback;
mod client;
mod complete;
mod convert;
mod election;
mod error;
mod events;
mod fence;
mod link;
mod lock;
mod log;
mod memory;
mod metrics;
mod observer;
mod options;
mod permit;
mod process;
mod reads;
mod rwlock;
mod semaphore;
mod session;
mod vocab;
mod wait;

use pyo3::prelude::*;

#[pymodule]
fn _dlock(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_NAME_LEN", dlock::MAX_NAME_LEN)?;
    m.add("MAX_VALUE_LEN", dlock::election::MAX_VALUE_LEN)?;
    m.add("MAX_KEY_LEN", dlock::MAX_KEY_LEN)?;
    m.add("DEFAULT_LOCK_SERIES", dlock::metrics::DEFAULT_LOCK_SERIES)?;
    m.add(
        "DEFAULT_MAX_OVERDUE",
        dlock::DEFAULT_MAX_OVERDUE.as_secs_f64(),
    )?;
    m.add("RESIGN_GRACE", dlock::election::RESIGN_GRACE.as_secs_f64())?;
    m.add_class::<client::Client>()?;
    m.add_class::<session::Session>()?;
    m.add_class::<session::SessionStats>()?;
    m.add_class::<lock::Lock>()?;
    m.add_class::<lock::LockStats>()?;
    m.add_class::<acquisition::Acquisition>()?;
    m.add_class::<semaphore::Semaphore>()?;
    m.add_class::<semaphore::HeldSlot>()?;
    m.add_class::<semaphore::SemaphoreAcquisition>()?;
    m.add_class::<rwlock::RwLock>()?;
    m.add_class::<rwlock::RwHolder>()?;
    m.add("MAX_SEMAPHORE_LIMIT", dlock::MAX_SEMAPHORE_LIMIT)?;
    m.add_class::<election::Election>()?;
    m.add_class::<election::Leader>()?;
    m.add_function(wrap_pyfunction!(election::check_grace, m)?)?;
    m.add_class::<observer::Observer>()?;
    m.add_class::<observer::Observed>()?;
    m.add_class::<permit::Permit>()?;
    m.add_class::<events::Event>()?;
    m.add_class::<events::EventStream>()?;
    m.add_class::<memory::MemoryService>()?;
    m.add_class::<link::Link>()?;
    m.add_class::<fence::FenceGate>()?;
    m.add_function(wrap_pyfunction!(link::stall_driver, m)?)?;
    m.add_function(wrap_pyfunction!(process::shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(process::_at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(process::forked, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::metrics_families, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::metrics_text, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::process_metrics_text, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::lock_healthy, m)?)?;
    m.add_function(wrap_pyfunction!(log::route_logs, m)?)?;
    m.add_function(wrap_pyfunction!(vocab::codes, m)?)?;
    m.add_function(wrap_pyfunction!(vocab::states, m)?)?;
    m.add_function(wrap_pyfunction!(vocab::now, m)?)?;
    Ok(())
}
