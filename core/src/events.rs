//! What a lock tells its application (docs/design.md §16): [`LockEvent`],
//! pushed to callbacks and pulled from an [`EventStream`].

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::Instant;
use crate::machine::{StateChange, Token};

/// One event of a lock, stamped with the core's monotonic clock at the
/// moment the core decided it (compare with [`crate::Client::clock`] to see
/// how late a callback runs). Its `Display` is the scenario trace line.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEvent {
    /// A state change, with its reason.
    State {
        /// From, to, why.
        change: StateChange,
        /// When.
        at: Instant,
    },
    /// The token is dead: stop the work. Once per token.
    Fence {
        /// The dead token.
        token: Token,
        /// Permits in flight at the fence.
        in_flight: u64,
        /// When.
        at: Instant,
    },
    /// The lock was acquired (first time or after a fence).
    Acquired {
        /// The new token.
        token: Token,
        /// When.
        at: Instant,
    },
    /// The lock left `Holding` and no permit is in flight any more.
    Drained {
        /// When.
        at: Instant,
    },
}

impl LockEvent {
    /// When the core decided the event.
    pub fn at(&self) -> Instant {
        match *self {
            LockEvent::State { at, .. }
            | LockEvent::Fence { at, .. }
            | LockEvent::Acquired { at, .. }
            | LockEvent::Drained { at } => at,
        }
    }

    /// The event's kind word: `state`, `fence`, `acquired` or `drained`.
    pub fn kind(&self) -> &'static str {
        match self {
            LockEvent::State { .. } => "state",
            LockEvent::Fence { .. } => "fence",
            LockEvent::Acquired { .. } => "acquired",
            LockEvent::Drained { .. } => "drained",
        }
    }
}

impl fmt::Display for LockEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockEvent::State { change, .. } => write!(f, "state {change}"),
            LockEvent::Fence {
                token, in_flight, ..
            } => write!(f, "fence token={token} in_flight={in_flight}"),
            LockEvent::Acquired { token, .. } => write!(f, "acquired token={token}"),
            LockEvent::Drained { .. } => f.write_str("drained"),
        }
    }
}

/// The queue behind one [`EventStream`], fed by the callback thread.
#[derive(Default)]
pub(crate) struct Queue {
    inner: Mutex<(VecDeque<LockEvent>, bool)>,
    grew: Condvar,
    notify: Notify,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, (VecDeque<LockEvent>, bool)> {
        crate::sync::lock(&self.inner)
    }

    pub(crate) fn push(&self, e: LockEvent) {
        self.lock().0.push_back(e);
        self.grew.notify_all();
        self.notify.notify_one();
    }

    /// No event follows: readers get `None` once the queue is empty.
    pub(crate) fn end(&self) {
        self.lock().1 = true;
        self.grew.notify_all();
        self.notify.notify_one();
    }
}

/// The events of one lock, in order, from the moment
/// [`crate::Lock::events`] was called; ends (`None`) once the lock is
/// closed or dropped. Events wait here until read: a stream nobody reads
/// keeps them all.
pub struct EventStream {
    pub(crate) queue: Arc<Queue>,
}

impl EventStream {
    /// The next event, waiting as long as it takes; `None` once the lock is
    /// closed and every event was read. Works on any executor.
    pub async fn recv(&mut self) -> Option<LockEvent> {
        loop {
            let notified = self.queue.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut q = self.queue.lock();
                if let Some(e) = q.0.pop_front() {
                    return Some(e);
                }
                if q.1 {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// The next event, blocking the thread up to `timeout` (`None`: as long
    /// as it takes). `Ok(None)`: the stream ended; `Err(())`: timed out.
    #[allow(clippy::result_unit_err)]
    pub fn recv_blocking(&mut self, timeout: Option<Duration>) -> Result<Option<LockEvent>, ()> {
        let limit = timeout.map(|t| std::time::Instant::now() + t);
        let mut q = self.queue.lock();
        loop {
            if let Some(e) = q.0.pop_front() {
                return Ok(Some(e));
            }
            if q.1 {
                return Ok(None);
            }
            q = match limit {
                None => crate::sync::wait(&self.queue.grew, q),
                Some(limit) => {
                    let left = limit.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(());
                    }
                    crate::sync::wait_timeout(&self.queue.grew, q, left)
                }
            };
        }
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Option<LockEvent> {
        self.queue.lock().0.pop_front()
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        // The lock stops feeding a queue nobody reads (see Callbacks::job).
        self.queue.end();
    }
}

impl fmt::Debug for EventStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = self.queue.lock();
        f.debug_struct("EventStream")
            .field("waiting", &q.0.len())
            .field("ended", &q.1)
            .finish()
    }
}
