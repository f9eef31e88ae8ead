//! [`Session`]: one lease shared by any number of locks, with its own
//! settings, keepalive loop and deadline (docs/design.md §23). Its locks
//! are made by `Session::lock`, beside [`crate::Lock`] in `client.rs`.

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::backend::Backend;
use crate::clock::Clock;
use crate::driver::{Command, Reply, spawn_session};
use crate::identity::Identity;
use crate::machine::LeaseId;
use crate::metrics::Shared;
use crate::{Error, Options};

/// One lease shared by any number of locks: one keepalive loop, one local
/// deadline. A failed keepalive drains every lock of the session; the
/// deadline or a lost lease fences them all; a deleted key fences its lock
/// alone. Acquiring is one put (and the wait for one's turn), releasing one
/// delete. Cheap to clone; dropped with its last clone and lock (the lease
/// is then revoked).
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<SessionInner>,
}

pub(crate) struct SessionInner {
    /// Dropped with the last handle (the task then closes the session),
    /// except in a forked child: there the driver does not exist and the
    /// lease is the parent's.
    pub(crate) commands: ManuallyDrop<mpsc::UnboundedSender<Command>>,
    pub(crate) options: Options,
    pub(crate) clock: Clock,
    pub(crate) shared: Arc<Shared>,
    pub(crate) drained: Arc<tokio::sync::Notify>,
    /// The client's default session: closed only with the client.
    pub(crate) default: bool,
    /// [`Session::close`] was called: no new lock.
    pub(crate) closed: std::sync::atomic::AtomicBool,
    /// Shut down ([`crate::shutdown`], [`crate::Client::shutdown`]): every call
    /// that would start something fails with [`Error::Shutdown`].
    pub(crate) shut: Arc<std::sync::atomic::AtomicBool>,
    /// The service, for an election's reads (`Election::leader`).
    pub(crate) backend: Arc<dyn Backend>,
    /// A fork while the session lives makes the child forked.
    _live: crate::fork::Live,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        if !crate::forked() {
            // SAFETY: dropped once, here; never used again.
            unsafe { ManuallyDrop::drop(&mut self.commands) }
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &self.lease())
            .field("locks", &self.locks())
            .finish()
    }
}

/// What [`Session::stats`] reports.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionStats {
    /// The lease, while one is granted.
    pub lease: Option<LeaseId>,
    /// Keepalives sent.
    pub keepalives: u64,
    /// Locks of the session (handles, and released locks not yet done).
    pub locks: u64,
    /// Round trip of the last confirmed keepalive.
    pub last_keepalive_rtt: Option<Duration>,
}

impl Session {
    /// A new session; `default_of`: the default session of that client.
    pub(crate) fn start(
        backend: Arc<dyn Backend>,
        options: Options,
        clock: Clock,
        identity: Option<Arc<Identity>>,
        default_of: Option<u64>,
    ) -> Session {
        // A stop signal releases what the process holds (issue 32, 8).
        crate::signals::install(options.keepalive_timeout);
        let shared = Arc::new(Shared::default());
        let drained = Arc::new(tokio::sync::Notify::new());
        let service = backend.clone();
        let commands = spawn_session(
            backend,
            options.clone(),
            clock.clone(),
            shared.clone(),
            drained.clone(),
            identity,
        );
        let session = Session {
            inner: Arc::new(SessionInner {
                commands: ManuallyDrop::new(commands),
                options,
                clock,
                shared,
                drained,
                default: default_of.is_some(),
                closed: std::sync::atomic::AtomicBool::new(false),
                shut: Arc::default(),
                backend: service,
                _live: crate::fork::Live::new(),
            }),
        };
        match default_of {
            Some(client) => session.of(client),
            None => session,
        }
    }

    /// Registers the session as one of `client`'s, for shutdown and
    /// [`crate::Client::snapshot`].
    pub(crate) fn of(self, client: u64) -> Session {
        crate::metrics::register(client, &self.inner.shared);
        crate::lifecycle::register(crate::lifecycle::Registered {
            client,
            commands: self.inner.commands.downgrade(),
            shut: self.inner.shut.clone(),
            keepalive_timeout: self.inner.options.keepalive_timeout,
        });
        self
    }

    /// [`Error::Shutdown`] once the session was shut down.
    pub(crate) fn live(&self) -> Result<(), Error> {
        if crate::lifecycle::is_shut(&self.inner.shut) {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    pub(crate) fn send(&self, c: Command) -> Result<(), Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        self.inner.commands.send(c).map_err(|_| Error::Shutdown)
    }

    pub(crate) fn closing(&self) -> Result<(), Error> {
        if self.inner.default {
            return Err(Error::InvalidArgument(
                "the client's default session closes with the client; close or drop its locks instead".into(),
            ));
        }
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// The service the session talks to (elections read it directly).
    pub(crate) fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// [`Error::Shutdown`] once shut down, [`Error::Released`] once closed.
    pub(crate) fn open(&self) -> Result<(), Error> {
        self.live()?;
        if self.inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Released);
        }
        Ok(())
    }

    /// Whether this is its client's default session.
    pub fn is_default(&self) -> bool {
        self.inner.default
    }

    /// The session's options.
    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// The lease, while one is granted (after the first acquisition).
    pub fn lease(&self) -> Option<LeaseId> {
        use std::sync::atomic::Ordering::Relaxed;
        Some(self.inner.shared.lease.load(Relaxed)).filter(|l| *l != 0)
    }

    /// Locks of the session not yet done with.
    pub fn locks(&self) -> u64 {
        self.inner
            .shared
            .locks
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The lease, the keepalives sent, the locks, the last round trip.
    pub fn stats(&self) -> SessionStats {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.inner.shared;
        let rtt = s.last_rtt_ns.load(Relaxed);
        SessionStats {
            lease: self.lease(),
            keepalives: s.keepalives.load(Relaxed),
            locks: s.locks.load(Relaxed),
            last_keepalive_rtt: (rtt > 0).then(|| Duration::from_nanos(rtt)),
        }
    }

    /// Releases every lock of the session and revokes its lease (one
    /// request deletes every key); returns once revoked, or after a
    /// keepalive timeout if the service does not answer (the revoke goes on
    /// in the background until it does). With no lease of its own left (a
    /// fence), it waits the same way for a fenced lease's revoke already
    /// under way. The session's locks stay usable
    /// as handles but refuse to acquire again, and the session makes no new
    /// lock ([`Error::Released`]). The client's default session closes only
    /// with its client: closing it is [`Error::InvalidArgument`].
    pub fn close(&self) -> Result<(), Error> {
        self.closing()?;
        let (done, rx) = Reply::blocking();
        self.send(Command::Close { done })?;
        rx.recv().map_err(|_| Error::Shutdown)
    }

    /// [`Session::close`] for async code.
    pub async fn close_async(&self) -> Result<(), Error> {
        self.closing()?;
        let (done, rx) = Reply::future();
        self.send(Command::Close { done })?;
        rx.await.map_err(|_| Error::Shutdown)
    }
}
