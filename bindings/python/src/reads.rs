//! What a lock's event stream (events.rs) and an election's observer
//! (observer.rs) share: one slot holding the core's reader while no read
//! has it, the event an async read got (kept if that read was cancelled),
//! and the reads that joined the one in progress.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use pyo3::prelude::*;

use crate::complete::{Outcome, spawn};

pub(crate) struct ReadSlot<R, E> {
    /// None while a read has it.
    pub(crate) reader: Option<R>,
    /// An event an async read got, waiting to be taken (kept if the read
    /// was cancelled, for the next read).
    pub(crate) ready: Option<E>,
    /// The reader gave its end.
    pub(crate) ended: bool,
    /// `close` was called (observers): a read in progress closes the
    /// core's observer.
    pub(crate) closing: bool,
    /// Bumped when an async read is done; wakes the reads that joined it.
    pub(crate) reads_done: u64,
    /// Joined reads (and an observer's read in progress's close watch).
    pub(crate) wakers: Vec<Waker>,
}

impl<R, E> ReadSlot<R, E> {
    pub(crate) fn new(reader: R) -> ReadSlot<R, E> {
        ReadSlot {
            reader: Some(reader),
            ready: None,
            ended: false,
            closing: false,
            reads_done: 0,
            wakers: Vec::new(),
        }
    }

    pub(crate) fn wake(&mut self) {
        for w in self.wakers.drain(..) {
            w.wake();
        }
    }

    /// Puts the reader back with what an async read got.
    pub(crate) fn read_done(&mut self, reader: R, got: Option<E>) {
        self.reader = Some(reader);
        match got {
            Some(e) => self.ready = Some(e),
            None => self.ended = true,
        }
        self.reads_done += 1;
        self.wake();
    }

    /// The reader ended and every event was taken.
    pub(crate) fn ended(&self) -> bool {
        self.ended && self.ready.is_none()
    }
}

/// The slot, even if a panicking holder poisoned its mutex.
pub(crate) fn lock_slot<T>(slot: &Mutex<T>) -> MutexGuard<'_, T> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Completes once the async read in progress when it was made is done (a
/// read that a cancelled `async for` step left behind, say).
struct ReadDone<R, E> {
    slot: Arc<Mutex<ReadSlot<R, E>>>,
    seen: u64,
}

impl<R, E> Future for ReadDone<R, E> {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut slot = lock_slot(&self.slot);
        if slot.reads_done != self.seen {
            return Poll::Ready(Outcome::Ready);
        }
        slot.wakers.push(cx.waker().clone());
        Poll::Pending
    }
}

/// Starts an async read: `fut` completes (with None) at once if an event
/// is ready or the reader ended, once the read in progress is done if
/// there is one (then the caller reads again), else when `read`, given the
/// reader, is done (it puts the reader back).
pub(crate) fn start<R, E, F>(
    py: Python<'_>,
    slot: &Arc<Mutex<ReadSlot<R, E>>>,
    event_loop: Py<PyAny>,
    fut: Py<PyAny>,
    read: impl FnOnce(R) -> F,
) -> PyResult<()>
where
    R: Send + 'static,
    E: Send + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    let mut s = lock_slot(slot);
    if s.ready.is_some() || s.ended {
        drop(s);
        return spawn(py, event_loop, fut, async { Outcome::Ready });
    }
    let Some(reader) = s.reader.take() else {
        let done = ReadDone {
            slot: slot.clone(),
            seen: s.reads_done,
        };
        drop(s);
        return spawn(py, event_loop, fut, done);
    };
    drop(s);
    spawn(py, event_loop, fut, read(reader))
}
