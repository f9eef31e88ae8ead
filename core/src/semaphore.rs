//! Semaphores (docs/design.md §26, issue 29): N holders at once, each
//! fenced on its own slot. A semaphore of limit N on `name` is N ordinary
//! locks, slot `i` named `<name>/slot/<i>` ([`slot_name`]), plus the limit,
//! recorded once on the engine under `<name>/limit` ([`limit_key`]).
//!
//! Why slots and not one counter: one token order cannot fence N holders
//! at once (a live holder with a low token would be refused), so tokens
//! rise per slot, and a resource keeps its highest token per slot name.
//! Each slot being an ordinary lock, everything a lock has holds for it
//! unchanged: drain, fence, reacquire on its own slot, events, exit and
//! cancel, `FenceGate` and guarded writes on the slot's name and token, and
//! `etcdctl lock <name>/slot/<i>` excludes it (both ways).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::{Client, Error, Lock, MAX_NAME_LEN, Session};

/// The largest limit a semaphore may have. Waiting costs the same at
/// any limit (one key in the semaphore's queue per waiter, one head
/// reading the slots); the bound keeps a head's read of every slot's
/// keys, and `try_acquire`'s, to one small reply.
pub const MAX_SEMAPHORE_LIMIT: u32 = 1024;

/// The lock name of slot `slot` of the semaphore `name`:
/// `<name>/slot/<slot>`. The one definition: `FenceGate`, guarded writes,
/// `dlock.guard` and `etcdctl lock` take this name.
pub fn slot_name(name: &str, slot: u32) -> String {
    format!("{name}/slot/{slot}")
}

/// The lock name of the semaphore `name`'s one queue: `<name>/queue`. A
/// waiter queues there as an ordinary lock; its holder, the head, alone
/// waits for a free slot ([`crate::Backend::free_slot`]), and lets the next
/// waiter be head once it has its slot (or gives up).
pub fn queue_name(name: &str) -> String {
    format!("{name}/queue")
}

/// The slot a key under `<name>/slot/` (`<name>/slot/<i>/<lease>`) is of.
pub(crate) fn slot_of_key(name: &str, key: &str) -> Option<u32> {
    let rest = key.strip_prefix(name)?.strip_prefix("/slot/")?;
    rest.split('/').next()?.parse().ok()
}

/// The lowest slot below `limit` that is not `taken`.
pub(crate) fn first_free(limit: u32, taken: impl IntoIterator<Item = u32>) -> Option<u32> {
    let mut free = vec![true; limit as usize];
    for t in taken {
        if let Some(f) = free.get_mut(t as usize) {
            *f = false;
        }
    }
    free.iter().position(|f| *f).map(|i| i as u32)
}

/// The key the limit of the semaphore `name` is recorded under:
/// `<name>/limit`, outside every slot's key prefix (`<name>/slot/<i>/`), so
/// it never takes part in a slot's lock. On etcd it is a plain key, which
/// (being under `<name>/`) keeps `<name>` itself from being locked as a
/// plain lock: a semaphore's name is not also a lock's.
pub fn limit_key(name: &str) -> String {
    format!("{name}/limit")
}

/// A counting semaphore: at most [`Semaphore::limit`] holders at once,
/// each holding one slot's ordinary [`Lock`]. Cheap to keep; holds nothing
/// itself. Made by [`Session::semaphore`] or [`Client::semaphore`].
#[derive(Clone)]
pub struct Semaphore {
    session: Session,
    name: Arc<str>,
    limit: u32,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .finish()
    }
}

/// Refuses a name or a limit before anything is sent.
fn check(name: &str, limit: u32) -> Result<(), Error> {
    if limit == 0 || limit > MAX_SEMAPHORE_LIMIT {
        return Err(Error::InvalidArgument(format!(
            "semaphore limit must be 1 to {MAX_SEMAPHORE_LIMIT} (MAX_SEMAPHORE_LIMIT), got {limit}"
        )));
    }
    let longest = slot_name(name, limit - 1).len();
    if name.is_empty() || longest > MAX_NAME_LEN || name.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "semaphore name must be 1 byte or more without NUL, and its slot names (`<name>/slot/<i>`) at most {MAX_NAME_LEN} bytes, got a name of {} bytes",
            name.len()
        )));
    }
    Ok(())
}

/// A limit as recorded under [`limit_key`]: decimal text.
pub(crate) fn parse_limit(stored: &[u8]) -> Option<u32> {
    std::str::from_utf8(stored).ok()?.parse().ok()
}

/// The limit recorded for `name`, compared with the one asked for.
fn compare(name: &str, limit: u32, stored: &[u8]) -> Result<(), Error> {
    let recorded = parse_limit(stored).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "semaphore `{name}`: its limit key `{}` holds {:?}, not a limit",
            limit_key(name),
            String::from_utf8_lossy(stored)
        ))
    })?;
    if recorded != limit {
        return Err(Error::InvalidArgument(format!(
            "semaphore `{name}` has limit {recorded} (recorded by its first handle), not {limit}"
        )));
    }
    Ok(())
}

impl Session {
    /// A semaphore of `limit` slots called `name` on this session. The
    /// first handle of `name` anywhere records `limit` on the engine (one
    /// put-if-absent); a handle asking for another limit is refused with
    /// [`Error::InvalidArgument`] naming both, as are a limit of 0 or over
    /// [`MAX_SEMAPHORE_LIMIT`]. Blocks for that one request (at most about
    /// a TTL).
    pub fn semaphore(&self, name: &str, limit: u32) -> Result<Semaphore, Error> {
        let record = self.record_limit(name, limit)?;
        crate::driver::block_on(record)??;
        Ok(self.semaphore_of(name, limit))
    }

    /// [`Session::semaphore`] for async code.
    pub async fn semaphore_async(&self, name: &str, limit: u32) -> Result<Semaphore, Error> {
        let record = self.record_limit(name, limit)?;
        crate::driver::on_driver(record)
            .await
            .map_err(|_| Error::Shutdown)??;
        Ok(self.semaphore_of(name, limit))
    }

    /// The checks, then the request that records (or compares) the limit,
    /// bounded by the TTL: a service that does not answer in that time is
    /// [`Error::Backend`]. A failure worth retrying (a connection refused,
    /// a member without quorum) is tried again every retry interval within
    /// that bound, as a lock's requests are: a blip at start must not
    /// refuse the handle (`dlock run -n` gave up on one).
    fn record_limit(
        &self,
        name: &str,
        limit: u32,
    ) -> Result<impl Future<Output = Result<(), Error>> + Send + 'static, Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        check(name, limit)?;
        self.open()?;
        let backend = self.backend().clone();
        let (bound, retry) = (self.options().ttl, self.options().retry_interval);
        let name = name.to_owned();
        Ok(async move {
            let key = limit_key(&name);
            let value = limit.to_string();
            let until = tokio::time::Instant::now() + bound;
            loop {
                let put = backend.put_if_absent(key.as_bytes(), value.as_bytes());
                let failed = match tokio::time::timeout_at(until, put).await {
                    Ok(Ok(stored)) => return compare(&name, limit, &stored),
                    Ok(Err(e @ crate::backend::BackendError::Unavailable(_))) => e,
                    Ok(Err(e)) => {
                        return Err(Error::Backend(format!("the lock service failed: {e}")));
                    }
                    Err(_) => {
                        return Err(Error::Backend(
                            "the lock service did not answer in time".into(),
                        ));
                    }
                };
                if tokio::time::Instant::now() + retry >= until {
                    return Err(Error::Backend(format!("the lock service failed: {failed}")));
                }
                tokio::time::sleep(retry).await;
            }
        })
    }

    fn semaphore_of(&self, name: &str, limit: u32) -> Semaphore {
        Semaphore {
            session: self.clone(),
            name: name.into(),
            limit,
        }
    }
}

impl Client {
    /// A semaphore on the client's default session (see
    /// [`Session::semaphore`]).
    pub fn semaphore(&self, name: &str, limit: u32) -> Result<Semaphore, Error> {
        self.default_session().semaphore(name, limit)
    }

    /// [`Client::semaphore`] for async code.
    pub async fn semaphore_async(&self, name: &str, limit: u32) -> Result<Semaphore, Error> {
        self.default_session().semaphore_async(name, limit).await
    }
}

impl Semaphore {
    /// The core's rule for a semaphore's name and limit, without a
    /// session: what a face checks before it connects (the command's
    /// `run -n`), so the refusal is the one a handle would give.
    pub fn check(name: &str, limit: u32) -> Result<(), Error> {
        check(name, limit)
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many holders it admits at once.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The lock name of slot `slot` (`<name>/slot/<slot>`): what
    /// `FenceGate`, guarded writes and `etcdctl lock` take for that slot.
    pub fn slot_name(&self, slot: u32) -> String {
        slot_name(&self.name, slot)
    }

    /// The session its slots are held under.
    pub fn session(&self) -> &Session {
        &self.session
    }

    fn slot_lock(&self, slot: u32) -> Result<Lock, Error> {
        let lock = self.session.lock_in(&self.slot_name(slot), Some(slot))?;
        // For the snapshot's `LockSnapshot::semaphore`.
        lock.metrics()
            .semaphore_limit
            .store(self.limit, std::sync::atomic::Ordering::Relaxed);
        Ok(lock)
    }

    /// The slot an acquire tries alone first: a free slot then costs what a
    /// lock's acquire costs, not one queued request per slot. It turns per
    /// call and starts at the process id, so neighbours try different slots.
    fn first_try(&self) -> u32 {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let turn = NEXT.fetch_add(1, Ordering::Relaxed);
        std::process::id().wrapping_add(turn) % self.limit
    }

    /// Takes a slot, waiting up to `timeout` for one to be free (zero tries
    /// once, as [`Semaphore::try_acquire`]); returns that slot's held
    /// [`Lock`] ([`Lock::slot`], [`Lock::token`], permits, `on_fence`,
    /// release: the whole lock API). One slot is tried alone first; then
    /// the wait queues in the semaphore's one queue ([`queue_name`], an
    /// ordinary lock): its head alone waits for a free slot, woken by the
    /// engine's own watch or notification when a slot's key goes, and
    /// tries it. A service that does not answer is waited through, as a
    /// lock's wait does. [`Error::Timeout`]: no slot was won in time;
    /// nothing is held then. Blocks.
    pub fn acquire(&self, timeout: Duration) -> Result<Lock, Error> {
        if timeout.is_zero() {
            return self.try_acquire();
        }
        // The first try blocks as a lock's does (no task of its own: a
        // free slot costs what a lock's acquire costs); the wait runs on
        // the driver.
        let until = self.until(Some(timeout));
        let lock = self.slot_lock(self.first_try())?;
        let tried = lock.try_acquire();
        if let Some(won) = kept(lock, tried)? {
            return Ok(won);
        }
        let sem = self.clone();
        crate::driver::block_on(async move { sem.queued(until).await })?
    }

    /// [`Semaphore::acquire`] for async code, on any executor (`None`: no
    /// time limit). Dropping the future before it is ready leaves nothing
    /// held, even a slot won just then, and leaves the queue.
    pub async fn acquire_async(&self, timeout: Option<Duration>) -> Result<Lock, Error> {
        if timeout.is_some_and(|t| t.is_zero()) {
            return self.try_acquire_async().await;
        }
        let until = self.until(timeout);
        // A lock's async try runs on any executor; the wait on the driver.
        let lock = self.slot_lock(self.first_try())?;
        let tried = lock.try_acquire_async().await;
        if let Some(won) = kept(lock, tried)? {
            return Ok(won);
        }
        let sem = self.clone();
        crate::driver::on_driver_until_dropped(async move { sem.queued(until).await }).await
    }

    /// The end of a timeout from now, on the session's clock (as a lock's
    /// timeout is).
    fn until(&self, timeout: Option<Duration>) -> Option<crate::clock::Instant> {
        timeout.map(|t| self.session.inner.clock.now() + t)
    }

    /// The acquire as one future (`acquire_then`'s), on the driver.
    async fn wait(&self, timeout: Option<Duration>) -> Result<Lock, Error> {
        if timeout.is_some_and(|t| t.is_zero()) {
            return self.try_once().await;
        }
        let until = self.until(timeout);
        let lock = self.slot_lock(self.first_try())?;
        let tried = lock.try_acquire_async().await;
        if let Some(won) = kept(lock, tried)? {
            return Ok(won);
        }
        self.queued(until).await
    }

    /// The wait after the first try, until `until`, on the driver (its
    /// timers and the engine's I/O need the driver's reactor).
    async fn queued(&self, until: Option<crate::clock::Instant>) -> Result<Lock, Error> {
        let clock = self.session.inner.clock.clone();
        let left = || until.map(|u| u.saturating_since(clock.now()));
        if left().is_some_and(|l| l.is_zero()) {
            return Err(Error::Timeout);
        }
        // The head of the queue is the one waiter that looks for a slot.
        // Dropped (won, failed, or this future dropped), the queue's key
        // goes and the next waiter is head.
        let head = self.session.lock_in(&queue_name(&self.name), None)?;
        head.acquire_async(left()).await?;
        let retry = self.session.options().retry_interval;
        loop {
            let free = self
                .session
                .backend()
                .free_slot(&self.name, self.limit, true);
            let free = match until {
                Some(u) => tokio::select! {
                    free = free => free,
                    _ = clock.sleep_until(u) => return Err(Error::Timeout),
                },
                None => free.await,
            };
            match free {
                Ok(Some(slot)) => {
                    let lock = self.slot_lock(slot)?;
                    match lock.try_acquire_async().await {
                        Ok(_) => return Ok(lock),
                        // Someone took it first, or no answer: look again.
                        Err(Error::WouldBlock | Error::Timeout | Error::Backend(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(None) => {}
                Err(crate::backend::BackendError::Unavailable(_)) => {
                    // Waited through, as a lock's wait is.
                    let pause = left().map_or(retry, |l| l.min(retry));
                    clock.sleep(pause).await;
                }
                Err(e) => return Err(Error::Backend(format!("the lock service failed: {e}"))),
            }
            if left().is_some_and(|l| l.is_zero()) {
                return Err(Error::Timeout);
            }
        }
    }

    /// Takes a free slot if there is one, else [`Error::WouldBlock`]: one
    /// read of the slots' keys, then a try of a free slot (never two at
    /// once, so a try never holds a slot it does not keep), read again if
    /// someone took it first. Blocks for about two round trips.
    pub fn try_acquire(&self) -> Result<Lock, Error> {
        let sem = self.clone();
        crate::driver::block_on(async move { sem.try_once().await })?
    }

    /// The completion form of [`Semaphore::acquire_async`] (`Some(ZERO)`:
    /// one try), for faces that run no executor of their own, as
    /// [`Lock::acquire_then`] is a lock's: the acquire runs on dlock's
    /// driver, `done` runs once on the callback thread (`Ok`: a slot won,
    /// waiting in the returned handle for [`SemaphoreAcquisition::take`]).
    /// [`SemaphoreAcquisition::cancel`] leaves nothing held, whenever
    /// called; `done` then gets [`Error::Released`].
    pub fn acquire_then(
        &self,
        timeout: Option<Duration>,
        done: impl FnOnce(Result<(), Error>) + Send + 'static,
    ) -> SemaphoreAcquisition {
        let handle = SemaphoreAcquisition::default();
        let (sem, started) = (self.clone(), handle.clone());
        let work = UntilCancelled {
            future: Box::pin(async move { sem.wait(timeout).await }),
            started: started.clone(),
        };
        crate::lifecycle::spawn_then(work, move |got| {
            done(match got {
                Some(Ok(lock)) => {
                    let mut s = crate::sync::lock(&started.0);
                    if s.cancelled {
                        drop(s);
                        drop(lock); // cancelled as it was won: the slot goes
                        Err(Error::Released)
                    } else {
                        s.won = Some(lock);
                        Ok(())
                    }
                }
                Some(Err(e)) => Err(e),
                None => Err(Error::Released),
            })
        });
        handle
    }

    /// [`Semaphore::try_acquire`] for async code, on any executor.
    pub async fn try_acquire_async(&self) -> Result<Lock, Error> {
        let sem = self.clone();
        crate::driver::on_driver_until_dropped(async move { sem.try_once().await }).await
    }

    /// The try, on the driver.
    async fn try_once(&self) -> Result<Lock, Error> {
        // Bounded: each lost race means a slot was taken meanwhile.
        for _ in 0..self.limit {
            let free = self
                .session
                .backend()
                .free_slot(&self.name, self.limit, false);
            let bound = self.session.options().keepalive_timeout * 2;
            let slot = match tokio::time::timeout(bound, free).await {
                Ok(Ok(Some(slot))) => slot,
                Ok(Ok(None)) => return Err(Error::WouldBlock),
                Ok(Err(e)) => return Err(Error::Backend(format!("the lock service failed: {e}"))),
                Err(_) => {
                    return Err(Error::Backend(
                        "the lock service did not answer in time".into(),
                    ));
                }
            };
            let lock = self.slot_lock(slot)?;
            match lock.try_acquire_async().await {
                Ok(_) => return Ok(lock),
                Err(Error::WouldBlock) => {}
                Err(e) => return Err(e),
            }
        }
        Err(Error::WouldBlock)
    }
}

/// The first try's outcome: the lock if it won; `None` when the slot was
/// taken or gave no answer in time (the wait goes on through both, as a
/// lock's does: a slow first reply must not end it); else the error.
fn kept(lock: Lock, tried: Result<crate::Token, Error>) -> Result<Option<Lock>, Error> {
    match tried {
        Ok(_) => Ok(Some(lock)),
        Err(Error::WouldBlock | Error::Timeout | Error::Backend(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A semaphore's acquire started by [`Semaphore::acquire_then`]. Its
/// clones are one handle; a slot won and never taken is released when the
/// last is dropped.
#[derive(Clone, Default)]
pub struct SemaphoreAcquisition(Arc<std::sync::Mutex<Started>>);

#[derive(Default)]
struct Started {
    cancelled: bool,
    /// The driver's waker of the acquire, to end it at the cancel.
    waker: Option<std::task::Waker>,
    /// The slot won, until taken.
    won: Option<Lock>,
}

impl std::fmt::Debug for SemaphoreAcquisition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = crate::sync::lock(&self.0);
        f.debug_struct("SemaphoreAcquisition")
            .field("cancelled", &s.cancelled)
            .field("won", &s.won.as_ref().map(Lock::name))
            .finish()
    }
}

impl SemaphoreAcquisition {
    /// Leaves nothing held by this acquire, whenever called: the acquire
    /// is dropped on the driver (its queue key and any slot try go), and
    /// a slot won but not taken is released. Idempotent; waits for no
    /// reply from the service.
    pub fn cancel(&self) {
        let (waker, won) = {
            let mut s = crate::sync::lock(&self.0);
            s.cancelled = true;
            (s.waker.take(), s.won.take())
        };
        if let Some(w) = waker {
            w.wake();
        }
        drop(won);
    }

    /// The slot won (once `done` said `Ok`), at most once.
    pub fn take(&self) -> Option<Lock> {
        crate::sync::lock(&self.0).won.take()
    }
}

/// An acquire until it is cancelled: then `None`, and the acquire (its
/// wait, its queue key and any slot won with it) is dropped on the driver.
struct UntilCancelled<F> {
    future: Pin<Box<F>>,
    started: SemaphoreAcquisition,
}

impl<F: Future> Future for UntilCancelled<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        {
            let mut s = crate::sync::lock(&self.started.0);
            if s.cancelled {
                return Poll::Ready(None);
            }
            s.waker = Some(cx.waker().clone());
        }
        self.future.as_mut().poll(cx).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_and_the_limit_key_do_not_overlap() {
        assert_eq!(slot_name("jobs", 0), "jobs/slot/0");
        assert_eq!(slot_name("jobs", 12), "jobs/slot/12");
        assert_eq!(limit_key("jobs"), "jobs/limit");
        // Slot 1's key prefix does not contain slot 10's keys.
        let key10 = crate::lock_key(&slot_name("jobs", 10), 0xab);
        assert!(!key10.starts_with(&format!("{}/", slot_name("jobs", 1))));
        assert!(!limit_key("jobs").starts_with(&format!("{}/", slot_name("jobs", 0))));
    }

    #[test]
    fn limits_and_names_are_checked_first() {
        for bad in [0, MAX_SEMAPHORE_LIMIT + 1] {
            let e = check("s", bad).unwrap_err();
            assert_eq!(e.code(), "invalid_argument");
            assert!(e.to_string().contains(&bad.to_string()), "{e}");
        }
        check("s", MAX_SEMAPHORE_LIMIT).unwrap();
        assert!(check("", 1).is_err());
        assert!(check("a\0b", 1).is_err());
        let longest = "n".repeat(MAX_NAME_LEN - "/slot/63".len());
        check(&longest, 64).unwrap();
        assert!(check(&format!("{longest}n"), 64).is_err());
    }

    #[test]
    fn a_recorded_limit_is_compared() {
        compare("s", 3, b"3").unwrap();
        let e = compare("s", 4, b"3").unwrap_err().to_string();
        assert!(e.contains("limit 3") && e.contains("not 4"), "{e}");
        assert!(compare("s", 3, b"x").is_err());
    }
}
