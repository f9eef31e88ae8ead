//! Leader election (docs/design.md §12, docs/elections.md): an election is
//! a lock that carries a value, on etcd's election keys, so dlock, `etcdctl
//! elect` and Go's `concurrency.Election` elect among each other. Drain =
//! stop starting leader work; fence = stopped leading, at the holder's own
//! deadline, before the service can elect anyone else; reacquire = campaign
//! again with a higher token. [`Observer`]s need no lease.

use std::sync::Arc;
use std::time::Duration;

pub use crate::backend::Leader;
use crate::driver::{Candidate, Command, Reply};
use crate::machine::{State, Token};
pub use crate::observer::{OBSERVER_BACKLOG, OBSERVER_BACKLOG_BYTES, Observed, Observer};
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
