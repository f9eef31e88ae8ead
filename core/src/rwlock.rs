//! Read/write locks (docs/design.md §27, issue 30): many readers or one
//! writer, fenced by mode on the resource side.
//!
//! Readers and writers queue in the one order of the name (etcd: the key's
//! create revision; PostgreSQL: the sequence), so their tokens come from one
//! order. A writer holds when no earlier key is left; a reader when no
//! earlier key is a writer. FIFO: a queued writer blocks later readers, so
//! writers are not starved. The key is the lock's (`<name>/<lease>`) with
//! the mode in its value ([`READ_MARKER`] for a reader), so `etcdctl lock`
//! and Go's `concurrency.Mutex` see every dlock holder as exclusive, and a
//! key without the marker (theirs, or a plain dlock lock) is a writer.
//!
//! Each holder is an ordinary [`Lock`] with a [`Lock::mode`]: permits,
//! drain, fence, reacquire, events, exit and cancel are a lock's, per
//! holder. The resource fences both modes with two watermarks
//! ([`crate::FenceGate::admit_read`], [`crate::FenceGate::admit_write`]).

use std::sync::Arc;

use crate::driver::{Command, Reply};
use crate::{Client, Error, Lock, Session, State};

pub use crate::mode::{Mode, READ_MARKER, holds};

/// A read/write lock called `name`: cheap, holds nothing itself; its
/// [`RwLock::read`] and [`RwLock::write`] make holders, each an ordinary
/// [`Lock`] to acquire. Made by [`Session::rwlock`] or [`Client::rwlock`].
#[derive(Clone)]
pub struct RwLock {
    session: Session,
    name: Arc<str>,
}

impl std::fmt::Debug for RwLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock").field("name", &self.name).finish()
    }
}

impl Session {
    /// A read/write lock called `name` on this session. Same name rules as
    /// [`Session::lock`]; sends nothing.
    pub fn rwlock(&self, name: &str) -> Result<RwLock, Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        crate::options::check_name("lock", name.as_bytes())?;
        self.open()?;
        Ok(RwLock {
            session: self.clone(),
            name: name.into(),
        })
    }
}

impl Client {
    /// A read/write lock on the client's default session (see
    /// [`Session::rwlock`]).
    pub fn rwlock(&self, name: &str) -> Result<RwLock, Error> {
        self.default_session().rwlock(name)
    }
}

impl RwLock {
    /// The lock's name: what `FenceGate`, guarded writes and `etcdctl lock`
    /// take, for both modes.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session its holders hold under.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// A new reader's handle (not acquired yet): acquire it as any
    /// [`Lock`]. Readers share the name; a reader waits for every earlier
    /// writer, queued or holding.
    pub fn read(&self) -> Result<Lock, Error> {
        self.holder(Mode::Read)
    }

    /// A new writer's handle (not acquired yet): acquire it as any
    /// [`Lock`]. A writer waits for every earlier holder, and blocks every
    /// later reader while it waits.
    pub fn write(&self) -> Result<Lock, Error> {
        self.holder(Mode::Write)
    }

    /// A holder's handle in `mode`.
    pub fn holder(&self, mode: Mode) -> Result<Lock, Error> {
        let lock = self.session.lock(&self.name)?;
        // Before the handle is returned, so before any acquire is sent.
        lock.metrics().set_mode(mode);
        Ok(lock)
    }
}

impl Lock {
    /// A read/write lock holder's mode (`None` for a plain lock, which
    /// queues as a writer).
    pub fn mode(&self) -> Option<Mode> {
        self.metrics().mode()
    }

    /// Write → read: the held key gets the read marker, keeping the key and
    /// its token, and readers queued behind it hold. A reader's downgrade
    /// does nothing. [`Error::InvalidArgument`]: not a read/write lock;
    /// [`Error::NotHeld`] / [`Error::Fenced`]: not holding. Blocks for one
    /// request (at most a TTL).
    pub fn downgrade(&self) -> Result<(), Error> {
        let (reply, rx) = Reply::blocking();
        self.downgrade_with(reply);
        rx.recv().map_err(|_| Error::Shutdown)?
    }

    /// [`Lock::downgrade`] for async code.
    pub async fn downgrade_async(&self) -> Result<(), Error> {
        let (reply, rx) = Reply::future();
        self.downgrade_with(reply);
        rx.await.map_err(|_| Error::Shutdown)?
    }

    /// The completion form of [`Lock::downgrade`], for the faces: `done`
    /// runs once on the callback thread (not at all if dlock's driver is
    /// already gone at the call).
    pub fn downgrade_then(&self, done: impl FnOnce(Result<(), Error>) + Send + 'static) {
        self.downgrade_with(Reply::Then(Box::new(done)));
    }

    /// Read → write is refused ([`Error::InvalidArgument`]): two readers
    /// upgrading at once would wait for each other forever. Release the
    /// reader and acquire a writer instead.
    pub fn upgrade(&self) -> Result<(), Error> {
        Err(Error::InvalidArgument(match self.mode() {
            None => "upgrade: not a read/write lock".into(),
            Some(_) => "upgrade is refused (two upgrading readers would wait for each other): release the reader and acquire a writer".into(),
        }))
    }

    /// Checks, then sends the downgrade; a refusal before anything is sent
    /// is answered on `reply` at once.
    fn downgrade_with(&self, reply: Reply<Result<(), Error>>) {
        let token = match (self.mode(), self.token()) {
            (None, _) => {
                return reply.send(Err(Error::InvalidArgument(
                    "downgrade: not a read/write lock".into(),
                )));
            }
            (Some(Mode::Read), _) => return reply.send(Ok(())),
            (Some(Mode::Write), Some(t)) => t,
            (Some(Mode::Write), None) => {
                return reply.send(Err(match self.state() {
                    State::Fenced | State::Reacquiring => Error::Fenced(self.last_token()),
                    _ => Error::NotHeld,
                }));
            }
        };
        // A failed send drops the reply: a blocked or async caller gets
        // `shutdown`.
        let _ = self.command(Command::Downgrade {
            lock: self.id(),
            token,
            reply,
        });
    }
}
