//! Blocking waits that Ctrl-C interrupts: the core's future is polled on
//! the caller's own thread without the GIL, in short slices with a signal
//! check between them. No thread of the face's runs it, so a callback may
//! wait too (its answer comes from the driver, not the callback thread).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use pyo3::prelude::*;

use crate::error::{OrRaise, not_forked};

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// How long a blocking wait stays without the GIL before checking signals.
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// Runs `future` to completion on this thread without the GIL, checking
/// for signals (Ctrl-C) every slice. On a signal's exception the future is
/// dropped (detached) and the exception raised: dropping the core's
/// `acquire_async` future is its `Acquisition::cancel`, so an interrupted
/// acquire leaves nothing held.
pub(crate) fn wait_interruptible<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let mut future = Box::pin(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    loop {
        let polled = py.detach(|| {
            let mut cx = Context::from_waker(&waker);
            let until = std::time::Instant::now() + SLICE;
            loop {
                if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
                    return Some(v);
                }
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
        });
        if let Some(v) = polled {
            return Ok(v);
        }
        if let Err(e) = py.check_signals() {
            py.detach(move || drop(future));
            return Err(e);
        }
    }
}

/// A blocking call of the core (an acquire, a campaign, a resign):
/// refused in a forked child before `start` makes the future, which is
/// then waited for as [`wait_interruptible`] does; the core's error is
/// raised.
pub(crate) fn blocking<T, F>(py: Python<'_>, start: impl FnOnce() -> F) -> PyResult<T>
where
    F: Future<Output = Result<T, dlock::Error>> + Send,
    T: Send,
{
    not_forked(py)?;
    wait_interruptible(py, start())?.or_raise(py)
}
