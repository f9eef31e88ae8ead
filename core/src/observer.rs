//! Observers of an election (docs/elections.md): no lease, no key. The
//! events say what changed, never a leader whose key is gone; a reader
//! that lags gets a bounded backlog (issue 32). One pull form (async or
//! blocking, closeable from another thread) and one callback form, so no
//! face runs a thread or a poll loop of its own.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::backend::{Backend, Leader};
use crate::{Client, Error};

/// What an [`Observer`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Observed {
    /// A new leader (or the current one, first).
    Leader(Leader),
    /// The same leader (same token) proclaimed a new value.
    Proclaimed(Leader),
    /// Nobody leads: the leader's key is gone and no candidate holds.
    NoLeader,
    /// The watch failed and is being opened again; the next event is the
    /// state then (repeated even if unchanged).
    Reconnecting,
}

impl Observed {
    /// The event's word, the same in every face (`leader`, `proclaimed`,
    /// `no-leader`, `reconnecting`).
    pub fn kind(&self) -> &'static str {
        match self {
            Observed::Leader(_) => "leader",
            Observed::Proclaimed(_) => "proclaimed",
            Observed::NoLeader => "no-leader",
            Observed::Reconnecting => "reconnecting",
        }
    }

    /// What the event counts for in a backlog's bound
    /// ([`OBSERVER_BACKLOG_BYTES`]): its key and value, and a little more
    /// (a face that keeps events for a reader of its own bounds them alike).
    pub fn backlog_bytes(&self) -> usize {
        self.leader().map_or(0, |l| l.key.len() + l.value.len()) + 64
    }

    /// The leader this event names, if any.
    pub fn leader(&self) -> Option<&Leader> {
        match self {
            Observed::Leader(l) | Observed::Proclaimed(l) => Some(l),
            _ => None,
        }
    }
}

/// Events an [`Observer`] keeps for a reader that lags (issue 32): past
/// this many, or past [`OBSERVER_BACKLOG_BYTES`] of keys and values, the
/// oldest are dropped, and the event read next is made the change from the
/// state last read to its own (a leader, a proclaim, no leader; nothing
/// when the two are the same). Memory stays flat however many changes
/// nobody reads; a reader always ends at the newest state.
pub const OBSERVER_BACKLOG: usize = 64;
/// The bytes of keys and values an [`Observer`] keeps unread (the newest
/// event is kept whatever its size).
pub const OBSERVER_BACKLOG_BYTES: usize = 4 * 1024 * 1024;

/// What an event keeps in memory, for the backlog's bound.
fn event_bytes(e: &Observed) -> usize {
    e.backlog_bytes()
}

#[derive(Default)]
struct Backlog {
    events: VecDeque<Observed>,
    ended: bool,
    /// `close()` was called: a callback gets nothing more, even what was
    /// queued.
    closed: bool,
    /// [`event_bytes`] of `events`.
    bytes: usize,
    /// The state after the last event read (None: none read yet).
    read: Option<Option<Leader>>,
}

impl Backlog {
    fn push(&mut self, e: Observed) {
        self.bytes += event_bytes(&e);
        self.events.push_back(e);
        while self.events.len() > OBSERVER_BACKLOG
            || (self.bytes > OBSERVER_BACKLOG_BYTES && self.events.len() > 1)
        {
            self.drop_front();
            self.rebase();
        }
    }

    fn drop_front(&mut self) -> Option<Observed> {
        let e = self.events.pop_front()?;
        self.bytes -= event_bytes(&e);
        Some(e)
    }

    /// Makes the first event the change from the state last read (the
    /// events between were dropped), or drops it when it changes nothing.
    fn rebase(&mut self) {
        while let Some(head) = self.events.front() {
            let now = match head {
                Observed::Leader(l) | Observed::Proclaimed(l) => Some(l.clone()),
                Observed::NoLeader => None,
                // What follows a reconnect is the state then, whatever it is.
                Observed::Reconnecting => return,
            };
            match change(self.read.as_ref(), &now) {
                Some(e) => {
                    self.events[0] = e;
                    return;
                }
                None => {
                    self.drop_front();
                }
            }
        }
    }

    fn pop(&mut self) -> Option<Observed> {
        let e = self.drop_front()?;
        match &e {
            Observed::Leader(l) | Observed::Proclaimed(l) => self.read = Some(Some(l.clone())),
            Observed::NoLeader => self.read = Some(None),
            Observed::Reconnecting => {}
        }
        Some(e)
    }
}

#[derive(Default)]
struct Queue {
    inner: Mutex<Backlog>,
    grew: Condvar,
    notify: Notify,
}

impl Queue {
    fn push(&self, e: Observed) {
        crate::sync::lock(&self.inner).push(e);
        self.grew.notify_all();
        self.notify.notify_one();
    }

    fn end(&self) {
        crate::sync::lock(&self.inner).ended = true;
        self.grew.notify_all();
        self.notify.notify_one();
    }
}

/// A stream of an election's leaders (see [`Client::observe`] and
/// [`Client::observe_with`]). Pull with [`Observer::recv`] or
/// [`Observer::recv_blocking`], from any thread: every method takes
/// `&self`, so one thread may [`Observer::close`] while another waits.
/// Dropping it ends the watch.
pub struct Observer {
    queue: Arc<Queue>,
    task: tokio::task::AbortHandle,
    /// The callback form's thread ([`Client::observe_with`]).
    pump: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The callback form: reads are refused (the events are the callback's).
    callback: bool,
    /// A fork while the observer lives makes the child forked.
    _live: crate::fork::Live,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

/// The event that takes an observer from `last` to `now`.
fn change(last: Option<&Option<Leader>>, now: &Option<Leader>) -> Option<Observed> {
    match (last, now) {
        (Some(Some(a)), Some(b)) if a.token == b.token && a.key == b.key => {
            (a.value != b.value).then(|| Observed::Proclaimed(b.clone()))
        }
        (Some(None), None) => None,
        (_, Some(b)) => Some(Observed::Leader(b.clone())),
        (_, None) => Some(Observed::NoLeader),
    }
}

impl Client {
    /// Observes the election `name` (no lease, no key of its own): the
    /// first event is the current state, then one per change. Dropping the
    /// observer ends its watch. [`Error::Shutdown`] on a shut-down client.
    pub fn observe(&self, name: &str) -> Result<Observer, Error> {
        let (queue, task) = self.watch_leaders(name)?;
        Ok(Observer {
            queue,
            task,
            pump: Mutex::new(None),
            callback: false,
            _live: crate::fork::Live::new(),
        })
    }

    /// [`Client::observe`] with every event passed to `each`, in order,
    /// one at a time, on a thread of this observer's own (a slow `each`
    /// delays no lock's `on_fence`, which run on the callback thread).
    /// Once [`Observer::close`] returns (or the observer is dropped),
    /// `each` runs no more; called from `each` itself, no more after it
    /// returns. The observer's reads are refused ([`Error::InvalidArgument`]).
    pub fn observe_with(
        &self,
        name: &str,
        mut each: impl FnMut(Observed) + Send + 'static,
    ) -> Result<Observer, Error> {
        let (queue, task) = self.watch_leaders(name)?;
        let q = queue.clone();
        let spawned = std::thread::Builder::new()
            .name("dlock-observer".into())
            .spawn(move || {
                while let Some(e) = q.next(None).ok().flatten() {
                    each(e);
                }
            });
        let pump = match spawned {
            Ok(p) => p,
            Err(e) => {
                task.abort();
                return Err(Error::Backend(format!("cannot start a thread: {e}")));
            }
        };
        Ok(Observer {
            queue,
            task,
            pump: Mutex::new(Some(pump)),
            callback: true,
            _live: crate::fork::Live::new(),
        })
    }

    /// The watch of `name`'s leaders, its events into a new queue.
    fn watch_leaders(&self, name: &str) -> Result<(Arc<Queue>, tokio::task::AbortHandle), Error> {
        check_name(name)?;
        self.default_session().open().map_err(|e| match e {
            Error::Released => Error::Shutdown,
            e => e,
        })?;
        if crate::forked() {
            return Err(Error::Forked);
        }
        let backend: Arc<dyn Backend> = self.backend().clone();
        let (name, retry) = (name.to_owned(), self.options().retry_interval);
        let queue = Arc::new(Queue::default());
        let q = queue.clone();
        let task = crate::driver::runtime().spawn(async move {
            let mut last: Option<Option<Leader>> = None;
            loop {
                let mut each = |now: Option<Leader>| {
                    if let Some(e) = change(last.as_ref(), &now) {
                        q.push(e);
                    }
                    last = Some(now);
                };
                let e = backend.observe_leaders(&name, &mut each).await;
                tracing::debug!(election = %name, error = %e, "observe failed; again");
                if last.is_some() {
                    q.push(Observed::Reconnecting);
                }
                // The state after the watch is opened again is reported
                // whatever it is.
                last = None;
                tokio::time::sleep(retry).await;
            }
        });
        Ok((queue, task.abort_handle()))
    }
}

impl Queue {
    /// The next event, blocking up to `timeout` (`None`: as long as it
    /// takes). [`Error::Timeout`] if none came; `Ok(None)` once ended, or
    /// at once once closed.
    fn next(&self, timeout: Option<Duration>) -> Result<Option<Observed>, Error> {
        // A limit past what the clock can count is none.
        let limit = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        let mut q = crate::sync::lock(&self.inner);
        loop {
            if q.closed {
                return Ok(None);
            }
            if let Some(e) = q.pop() {
                return Ok(Some(e));
            }
            if q.ended {
                return Ok(None);
            }
            q = match limit {
                None => crate::sync::wait(&self.grew, q),
                Some(limit) => {
                    let left = limit.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(Error::Timeout);
                    }
                    crate::sync::wait_timeout(&self.grew, q, left)
                }
            };
        }
    }
}

impl Observer {
    fn pulled(&self) -> Result<(), Error> {
        if self.callback {
            return Err(Error::InvalidArgument(
                "this observer passes its events to a callback (observe_with): it cannot be read"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The next event (`None` once ended or closed; also on an observer
    /// with a callback).
    pub async fn recv(&self) -> Option<Observed> {
        if self.callback {
            return None;
        }
        loop {
            let notified = self.queue.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut q = crate::sync::lock(&self.queue.inner);
                if q.closed {
                    return None;
                }
                if let Some(e) = q.pop() {
                    return Some(e);
                }
                if q.ended {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// The next event, blocking up to `timeout` (`None`: as long as it
    /// takes). [`Error::Timeout`] if none came; `Ok(None)` once ended or
    /// closed (a wait in progress returns at the close).
    pub fn recv_blocking(&self, timeout: Option<Duration>) -> Result<Option<Observed>, Error> {
        self.pulled()?;
        self.queue.next(timeout)
    }

    /// The next event if one is waiting.
    pub fn try_recv(&self) -> Option<Observed> {
        if self.callback {
            return None;
        }
        let mut q = crate::sync::lock(&self.queue.inner);
        if q.closed { None } else { q.pop() }
    }

    /// Ends the observation: its watch stops, reads return the end (one
    /// waiting returns at once), and a callback runs no more once this
    /// returns (from the callback itself: once it returns). Idempotent.
    pub fn close(&self) {
        self.task.abort();
        crate::sync::lock(&self.queue.inner).closed = true;
        self.queue.end();
        let pump = crate::sync::lock(&self.pump).take();
        if let Some(pump) = pump {
            if pump.thread().id() != std::thread::current().id() {
                let _ = pump.join();
            }
        }
    }

    /// Whether [`Observer::close`] was called.
    pub fn is_closed(&self) -> bool {
        crate::sync::lock(&self.queue.inner).closed
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.close();
    }
}

fn check_name(name: &str) -> Result<(), Error> {
    crate::options::check_name("election", name.as_bytes()).map(drop)
}
