//! Leader election (docs/design.md §12, docs/elections.md): an election is
//! a lock that carries a value, on etcd's election keys, so dlock, `etcdctl
//! elect` and Go's `concurrency.Election` elect among each other. Drain =
//! stop starting leader work; fence = stopped leading, at the holder's own
//! deadline, before the service can elect anyone else; reacquire = campaign
//! again with a higher token. [`Observer`]s need no lease.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::backend::Backend;
pub use crate::backend::Leader;
use crate::driver::{Candidate, Command, Reply};
use crate::machine::{State, Token};
use crate::{Acquisition, Client, Error, Lock, Session};

/// The longest value a candidate may carry (1 MiB), on every engine. With
/// the longest name ([`crate::MAX_NAME_LEN`]) a campaign must still fit
/// etcd's default request limit (`--max-request-bytes`, 1.5 MiB): the
/// lock transaction names the key about seven times, and etcd counts its
/// own framing, so a campaign costs about value + 7 × name + 160 bytes
/// (measured on etcd 3.4: a 1,024-byte name takes at most 1,565,544 bytes
/// of value; the old limit, 1.5 MiB − 4 KiB, failed with names over about
/// 560 bytes, retried until the timeout). 1 MiB leaves half a MiB for
/// that, and for a cluster's auth fields. Refused before anything is sent
/// ([`Error::InvalidArgument`], naming the limit).
pub const MAX_VALUE_LEN: usize = 1024 * 1024;

/// The grace every face uses for a resign that names none (Python's
/// `RESIGN_GRACE`, Node's `RESIGN_GRACE_MS`, C's `LK_RESIGN_GRACE_MS`):
/// one value, so that a leader leaving the same way in any language keeps
/// its key for the same time while its units of work end. A resign with
/// no unit in flight deletes the key at once whatever the grace.
pub const RESIGN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

fn check_value(value: &[u8]) -> Result<(), Error> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::InvalidArgument(format!(
            "election value must be at most {MAX_VALUE_LEN} bytes (MAX_VALUE_LEN: with the longest name it fits every engine's request limit), got {}",
            value.len()
        )));
    }
    Ok(())
}

/// One candidate in the election called `name`: the whole [`Lock`] API
/// (through `Deref`: `permit()`, `on_fence`, events, stats, close) plus
/// [`Election::campaign`], [`Election::proclaim`], [`Election::resign`]
/// and [`Election::leader`]. A fenced leader campaigns again on its own,
/// with its last value, when the session's `reacquire` option is on (the
/// default).
pub struct Election {
    lock: Lock,
    value: Candidate,
    /// The token of the last campaign won (named by a refused proclaim);
    /// shared with `campaign_then`'s completion.
    last: Arc<std::sync::atomic::AtomicU64>,
}

impl std::ops::Deref for Election {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        &self.lock
    }
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.lock.name())
            .field("state", &self.lock.state())
            .finish()
    }
}

impl Session {
    /// A candidate handle in the election `name` on this session (not
    /// campaigning yet). Same name rules as [`Session::lock`].
    pub fn election(&self, name: &str) -> Result<Election, Error> {
        let lock = self.lock(name)?;
        lock.metrics()
            .election
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let value: Candidate = Arc::default();
        lock.command(Command::Campaign {
            lock: lock.id(),
            value: value.clone(),
        })?;
        Ok(Election {
            lock,
            value,
            last: Arc::default(),
        })
    }
}

impl Client {
    /// A candidate handle in the election `name` on the default session.
    pub fn election(&self, name: &str) -> Result<Election, Error> {
        self.default_session().election(name)
    }

    /// Observes the election `name` (no lease, no key of its own): the
    /// first event is the current state, then one per change. Dropping the
    /// observer ends its watch. [`Error::Shutdown`] on a shut-down client.
    pub fn observe(&self, name: &str) -> Result<Observer, Error> {
        check_name(name)?;
        self.default_session().open().map_err(|e| match e {
            Error::Released => Error::Shutdown,
            e => e,
        })?;
        if crate::forked() {
            return Err(Error::Forked);
        }
        Ok(Observer::start(
            self.backend().clone(),
            name.into(),
            self.options().retry_interval,
        ))
    }
}

fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > crate::MAX_NAME_LEN || name.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "election name must be 1 to {} bytes without NUL, got {} bytes",
            crate::MAX_NAME_LEN,
            name.len()
        )));
    }
    Ok(())
}

impl Election {
    /// The election's lock (the same handle `Deref` reaches).
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// Sets the value the candidate key is put with; refused once closed.
    fn prepare(&self, value: &[u8]) -> Result<(), Error> {
        check_value(value)?;
        self.lock.session().open()?;
        *crate::sync::lock(&self.value) = value.to_vec();
        Ok(())
    }

    fn won(&self, r: Result<Token, Error>) -> Result<Token, Error> {
        if let Ok(t) = &r {
            self.last
                .store(t.get(), std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    /// Campaigns with `value`: waits up to `timeout` to lead (zero tries
    /// once) and returns the leader's token (its key's create revision).
    /// Every wait ends with a read of our own key, so a candidate whose key
    /// went meanwhile (lease expired) is never told it leads.
    /// [`Error::Timeout`]: not elected in time (nothing held);
    /// [`Error::Released`]: the session is closed.
    pub fn campaign(&self, value: &[u8], timeout: Duration) -> Result<Token, Error> {
        self.prepare(value)?;
        self.won(self.lock.acquire(timeout))
    }

    /// [`Election::campaign`] for async code (`None`: no time limit).
    /// Dropping the future leaves nothing held.
    pub async fn campaign_async(
        &self,
        value: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Token, Error> {
        self.prepare(value)?;
        self.won(self.lock.acquire_async(timeout).await)
    }

    /// [`Election::campaign`] in completion form (the faces' form, as
    /// [`Lock::acquire_then`]); bad input is refused before anything starts.
    pub fn campaign_then(
        &self,
        value: &[u8],
        timeout: Option<Duration>,
        done: impl FnOnce(Result<Token, Error>) + Send + 'static,
    ) -> Result<Acquisition, Error> {
        self.prepare(value)?;
        let last = self.last.clone();
        Ok(self.lock.acquire_then(true, timeout, move |r| {
            if let Ok(t) = &r {
                last.store(t.get(), std::sync::atomic::Ordering::Relaxed);
            }
            done(r)
        }))
    }

    /// Puts a new value in the leader's key, guarded by its token (one
    /// transaction comparing the key's create revision; the token does not
    /// change). [`Error::Fenced`]: the leadership was lost;
    /// [`Error::NotHeld`]: not leading (never elected, resigned, released).
    pub fn proclaim(&self, value: &[u8]) -> Result<(), Error> {
        let (reply, rx) = Reply::blocking();
        self.proclaim_command(value, reply)?;
        rx.recv().map_err(|_| Error::Shutdown)?
    }

    /// [`Election::proclaim`] for async code.
    pub async fn proclaim_async(&self, value: &[u8]) -> Result<(), Error> {
        let (reply, rx) = Reply::future();
        self.proclaim_command(value, reply)?;
        rx.await.map_err(|_| Error::Shutdown)?
    }

    fn proclaim_command(&self, value: &[u8], reply: Reply<Result<(), Error>>) -> Result<(), Error> {
        check_value(value)?;
        let token = match self.lock.token() {
            Some(t) => t,
            None => {
                return Err(match self.lock.state() {
                    State::Fenced | State::Reacquiring => {
                        Error::Fenced(self.last.load(std::sync::atomic::Ordering::Relaxed))
                    }
                    _ => Error::NotHeld,
                });
            }
        };
        self.lock.command(Command::Proclaim {
            lock: self.lock.id(),
            token,
            value: value.to_vec(),
            reply,
        })
    }

    /// Steps down: no permit from now on; the key is deleted once the
    /// permits in flight end, or after `grace` with some still in flight
    /// (the session's machine times it), so the next leader starts only
    /// after this one's work. Returns once the delete had its first try.
    /// Campaigning again is allowed.
    pub fn resign(&self, grace: Duration) -> Result<(), Error> {
        let (done, rx) = Reply::blocking();
        self.lock.command(Command::Resign {
            lock: self.lock.id(),
            grace,
            done,
        })?;
        rx.recv().map_err(|_| Error::Shutdown)
    }

    /// [`Election::resign`] for async code.
    pub async fn resign_async(&self, grace: Duration) -> Result<(), Error> {
        let (done, rx) = Reply::future();
        self.lock.command(Command::Resign {
            lock: self.lock.id(),
            grace,
            done,
        })?;
        rx.await.map_err(|_| Error::Shutdown)
    }

    /// The current leader as the service sees it (`None`: nobody leads).
    /// Blocks for one read.
    pub fn leader(&self) -> Result<Option<Leader>, Error> {
        let backend = self.lock.session().backend().clone();
        let name = self.lock.name().to_owned();
        crate::driver::block_on(async move { backend.next_leader(&name, None).await })?
            .map_err(|e| Error::Backend(e.to_string()))
    }

    /// [`Election::leader`] for async code (and the faces' completion
    /// form through [`crate::spawn_then`]).
    pub async fn leader_async(&self) -> Result<Option<Leader>, Error> {
        let backend = self.lock.session().backend().clone();
        backend
            .next_leader(self.lock.name(), None)
            .await
            .map_err(|e| Error::Backend(e.to_string()))
    }
}

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

/// A stream of an election's leaders (see [`Client::observe`]): pull with
/// [`Observer::recv`] or [`Observer::recv_blocking`]. Dropping it ends
/// the watch.
pub struct Observer {
    queue: Arc<Queue>,
    task: tokio::task::AbortHandle,
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

impl Observer {
    fn start(backend: Arc<dyn Backend>, name: String, retry: Duration) -> Observer {
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
        Observer {
            queue,
            task: task.abort_handle(),
            _live: crate::fork::Live::new(),
        }
    }

    /// The next event (`None` once ended).
    pub async fn recv(&mut self) -> Option<Observed> {
        loop {
            let notified = self.queue.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut q = crate::sync::lock(&self.queue.inner);
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
    /// takes). [`Error::Timeout`] if none came; `Ok(None)` once ended.
    pub fn recv_blocking(&mut self, timeout: Option<Duration>) -> Result<Option<Observed>, Error> {
        let limit = timeout.map(|t| std::time::Instant::now() + t);
        let mut q = crate::sync::lock(&self.queue.inner);
        loop {
            if let Some(e) = q.pop() {
                return Ok(Some(e));
            }
            if q.ended {
                return Ok(None);
            }
            q = match limit {
                None => crate::sync::wait(&self.queue.grew, q),
                Some(limit) => {
                    let left = limit.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(Error::Timeout);
                    }
                    crate::sync::wait_timeout(&self.queue.grew, q, left)
                }
            };
        }
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Option<Observed> {
        crate::sync::lock(&self.queue.inner).pop()
    }

    /// Ends the observation: the stream ends after the events queued.
    pub fn close(&self) {
        self.task.abort();
        self.queue.end();
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(token: u64, value: &str) -> Option<Leader> {
        Some(Leader {
            key: format!("e/{token:x}"),
            value: value.into(),
            token: Token(token),
            lease: token as i64,
        })
    }

    #[test]
    fn the_backlog_is_bounded_and_rebased_on_what_was_read() {
        let mut b = Backlog::default();
        b.push(Observed::Leader(leader(5, "a").unwrap()));
        assert!(matches!(b.pop(), Some(Observed::Leader(_))));
        // A new leader, then many proclaims: the leader's event is dropped,
        // and the first kept is told as a new leader (never read).
        b.push(Observed::Leader(leader(9, "b0").unwrap()));
        for i in 1..1000 {
            b.push(Observed::Proclaimed(leader(9, &format!("b{i}")).unwrap()));
        }
        assert!(b.events.len() <= OBSERVER_BACKLOG);
        assert!(matches!(b.pop(), Some(Observed::Leader(l)) if l.token == Token(9)));
        let mut last = None;
        while let Some(e) = b.pop() {
            assert!(matches!(e, Observed::Proclaimed(_)), "{e:?}");
            last = e.leader().cloned();
        }
        assert_eq!(last.unwrap().value, b"b999");
        // Back to the state read: nothing to tell.
        b.push(Observed::Proclaimed(leader(9, "x").unwrap()));
        for _ in 0..OBSERVER_BACKLOG {
            b.push(Observed::Proclaimed(leader(9, "b999").unwrap()));
        }
        let kept: Vec<_> = std::iter::from_fn(|| b.pop()).collect();
        assert!(kept.len() < OBSERVER_BACKLOG, "{}", kept.len());
        // Large values: bounded by bytes, the newest always kept.
        let big = "v".repeat(1024 * 1024);
        for i in 0..20 {
            b.push(Observed::Proclaimed(
                leader(9, &format!("{i}{big}")).unwrap(),
            ));
        }
        assert!(b.bytes <= OBSERVER_BACKLOG_BYTES + 2 * 1024 * 1024);
        assert!(b.events.len() <= 5, "{}", b.events.len());
        let newest = std::iter::from_fn(|| b.pop()).last().unwrap();
        assert!(newest.leader().unwrap().value.starts_with(b"19v"));
    }

    #[test]
    fn changes_name_leader_proclaim_and_no_leader() {
        assert_eq!(change(None, &None), Some(Observed::NoLeader));
        let a = leader(5, "a");
        assert!(matches!(change(None, &a), Some(Observed::Leader(_))));
        assert_eq!(change(Some(&a), &a), None);
        let a2 = leader(5, "b");
        assert!(matches!(
            change(Some(&a), &a2),
            Some(Observed::Proclaimed(_))
        ));
        let b = leader(9, "b");
        assert!(matches!(change(Some(&a2), &b), Some(Observed::Leader(_))));
        assert_eq!(change(Some(&b), &None), Some(Observed::NoLeader));
        assert_eq!(change(Some(&None), &None), None);
    }

    #[test]
    fn values_over_the_request_limit_are_refused() {
        assert!(check_value(&vec![0; MAX_VALUE_LEN]).is_ok());
        let e = check_value(&vec![0; MAX_VALUE_LEN + 1]).unwrap_err();
        assert_eq!(e.code(), "invalid_argument");
    }
}
