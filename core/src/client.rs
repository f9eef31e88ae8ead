//! The public face: [`Client`] and [`Lock`] — the one contract every
//! other face (C, Python, Node) converts and calls. A client holds a
//! `dyn Backend` and names none: `connect.rs` chooses and connects it;
//! sessions are `session.rs`'s, permits `permit.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::backend::Backend;
use crate::callbacks::Callbacks;
use crate::clock::{Clock, Instant};
use crate::driver::{Command, Reply, Ticket, Write};
use crate::events::{EventStream, LockEvent};
use crate::gate::Gate;
use crate::identity::{Identity, IdentityOptions, LockHolder};
use crate::lifecycle::{Acquisition, CancelOnDrop};
use crate::machine::{LockId, Refused, State, StateChange, Token};
use crate::permit::{OwnedPermit, Permit};
use crate::session::Session;
use crate::{Error, Options};

/// Longest lock (and election) name accepted, in bytes, on every engine:
/// with [`crate::election::MAX_VALUE_LEN`] it keeps every request within
/// etcd's default request limit, and a PostgreSQL key within its index's
/// row limit. Refused before anything is sent ([`Error::InvalidArgument`]).
pub const MAX_NAME_LEN: usize = 1024;

/// Longest key of a guarded write ([`Lock::guarded_put`],
/// [`Lock::guarded_delete`]), in bytes, on every engine: PostgreSQL keeps
/// the key in a btree index (`dlock.kv`'s primary key), whose rows hold at
/// most 2,704 bytes (8 KiB pages), and etcd counts it in its request limit.
/// Its value: at most [`crate::election::MAX_VALUE_LEN`] (1 MiB), which with
/// this key and the lock's own key in the same transaction fits etcd's
/// default request limit (`--max-request-bytes`, 1.5 MiB). Both refused
/// before anything is sent ([`Error::InvalidArgument`], naming the limit).
pub const MAX_KEY_LEN: usize = 2048;

/// A connection to a lock service. Its locks share one default
/// [`Session`] (one lease, one keepalive loop); [`Client::session`] makes
/// another for locks that must not share its fate. Cheap to clone; the
/// default session ends (its lease revoked) once every clone and every
/// lock of it is gone.
#[derive(Clone)]
pub struct Client {
    /// Names the client's sessions in the process-wide registry.
    id: u64,
    backend: Arc<dyn Backend>,
    clock: Clock,
    /// The default session; its options are the client's.
    session: Session,
    /// Recorded beside the lease of each of its sessions.
    identity: Option<Arc<Identity>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("options", self.options())
            .field("embedded", &self.link().is_some())
            .finish()
    }
}

impl Client {
    /// A client of `backend` with `options` (validated) on the system clock.
    pub fn new(backend: impl Backend, options: Options) -> Result<Client, Error> {
        Client::with_clock(backend, options, Clock::system())
    }

    /// A client whose deadlines are read from `clock` (a
    /// [`crate::ManualClock`]'s, in tests; use the same clock for a memory
    /// service).
    pub fn with_clock(
        backend: impl Backend,
        options: Options,
        clock: Clock,
    ) -> Result<Client, Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        options.validate()?;
        let identity = Identity::of_process(&IdentityOptions::default());
        Ok(Client::assemble(
            Arc::new(backend),
            options,
            clock,
            Some(Arc::new(identity)),
        ))
    }

    /// A client of `backend` with its default session; `options` are
    /// valid.
    pub(crate) fn assemble(
        backend: Arc<dyn Backend>,
        options: Options,
        clock: Clock,
        identity: Option<Arc<Identity>>,
    ) -> Client {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let session = Session::start(
            backend.clone(),
            options,
            clock.clone(),
            identity.clone(),
            Some(id),
        );
        Client {
            id,
            backend,
            clock,
            session,
            identity,
        }
    }

    /// Who this client is, as recorded beside each of its sessions' leases
    /// (see [`Lock::holder`]); `None` when it records none
    /// ([`IdentityOptions::record`]).
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_deref()
    }

    /// The options of the default session.
    pub fn options(&self) -> &Options {
        self.session.options()
    }

    /// The clock deadlines are read from.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// A handle on the lock called `name` (not acquired yet), on the
    /// client's default session. Register callbacks, then
    /// [`Lock::acquire`].
    ///
    /// Names nest as in etcd's lock protocol: the lock `a`'s key is
    /// `a/<lease>`, so a holder of `a/b` (or `a/`) blocks `a`. Two handles
    /// of one name on one session exclude each other (the second waits).
    pub fn lock(&self, name: &str) -> Result<Lock, Error> {
        self.session.lock(name)
    }

    /// The service this client talks to (observers read it directly;
    /// `Client::link` downcasts it).
    pub(crate) fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The default session, shared by [`Client::lock`]'s locks.
    pub fn default_session(&self) -> &Session {
        &self.session
    }

    /// A new session with `options` (validated): its own lease, keepalive
    /// loop and deadline, so its locks fence independently of every other
    /// session's. Its lease is granted on its first acquisition and revoked
    /// by [`Session::close`] or once the session and its locks are dropped.
    pub fn session(&self, options: Options) -> Result<Session, Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        options.validate()?;
        Ok(Session::start(
            self.backend.clone(),
            options,
            self.clock.clone(),
            self.identity.clone(),
            None,
        )
        .of(self.id))
    }

    /// Every session and lock of this client with its counters, gauges and
    /// histograms, read at once with atomics (no call to the driver);
    /// render it with [`crate::MetricsSnapshot::to_text`] or
    /// [`crate::MetricsSnapshot::families`] (docs/metrics.md).
    pub fn snapshot(&self) -> crate::metrics::Snapshot {
        crate::metrics::snapshot(self.id)
    }

    /// Ends every session of this client at once, as [`crate::shutdown`]
    /// does for the whole process: every held lock's key is deleted (each
    /// session's lease revoked), in parallel, bounded by one keepalive
    /// timeout in total; afterwards its handles behave as closed (permits
    /// refuse `released`, acquiring fails with [`Error::Shutdown`], release
    /// and close do nothing). Other clients are untouched. Idempotent.
    ///
    /// Dropping the last handle of a client (the client, its sessions and
    /// locks all gone) ends its sessions the same way, in the background.
    pub fn shutdown(&self) {
        let id = self.id;
        crate::lifecycle::shut_down(|s| s.client == id);
    }
}

impl Session {
    /// A handle on the lock called `name` on this session (see
    /// [`Client::lock`]).
    pub fn lock(&self, name: &str) -> Result<Lock, Error> {
        self.lock_in(name, None)
    }

    /// A handle on `name`; `slot`: it is that slot of a semaphore.
    pub(crate) fn lock_in(&self, name: &str, slot: Option<u32>) -> Result<Lock, Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        crate::options::check_name("lock", name.as_bytes())?;
        self.live()?;
        if self.inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Released);
        }
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let gate = Arc::new(Gate::new(
            self.inner.clock.clone(),
            self.inner.drained.clone(),
        ));
        let name: Arc<str> = name.into();
        self.send(Command::Add {
            lock: id,
            name: name.clone(),
            gate: gate.clone(),
        })?;
        crate::metrics::add_lock(&self.inner.shared.metrics, name.clone(), &gate);
        // Counted here, so `stats()` sees the lock at once; the driver
        // uncounts it once done with it.
        self.inner
            .shared
            .locks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Lock {
            gate,
            callbacks: std::sync::OnceLock::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            session: self.clone(),
            id,
            name,
            slot,
        })
    }
}

/// What [`Lock::stats`] reports; cheap enough to read often (atomics and
/// one clock read).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStats {
    /// Acquisitions, first and after fences.
    pub acquisitions: u64,
    /// Drains begun (a failed keepalive while holding).
    pub drains: u64,
    /// Drains that ended with a confirmed keepalive.
    pub resumes: u64,
    /// Fences at the deadline.
    pub fences_deadline: u64,
    /// Fences on a lease-lost reply.
    pub fences_lease_lost: u64,
    /// Fences on a deleted lock key.
    pub fences_lock_lost: u64,
    /// Round trip of the last confirmed keepalive.
    pub last_keepalive_rtt: Option<Duration>,
    /// Deadline − now while holding or draining.
    pub slack: Option<Duration>,
    /// Permits in flight.
    pub in_flight: u64,
}

/// One named lock. Dropping it releases it, and once the drop returns no
/// callback of it runs again (as [`Lock::close`], without waiting for the
/// revoke).
///
/// Callbacks run on dlock's callback thread, one at a time, in order; a
/// callback may call any method of the lock, even [`Lock::close`].
pub struct Lock {
    gate: Arc<Gate>,
    /// Made on the first callback or stream (most locks of a large session
    /// have none) and handed to the driver then.
    callbacks: std::sync::OnceLock<Arc<Callbacks>>,
    /// [`Lock::close`] was called.
    closed: std::sync::atomic::AtomicBool,
    session: Session,
    id: LockId,
    name: Arc<str>,
    /// The slot of a semaphore this lock is ([`crate::Semaphore`]).
    slot: Option<u32>,
}

impl Lock {
    /// Its figures for [`crate::Client::snapshot`] beside the gate's.
    pub(crate) fn metrics(&self) -> &crate::gate::LockMetrics {
        &self.gate.metrics
    }

    /// The lock's name (a semaphore slot's: `<semaphore>/slot/<i>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The semaphore slot this lock holds (`None` for a plain lock): a
    /// lock from [`crate::Semaphore::acquire`] is that slot's ordinary lock.
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    fn send(&self, c: Command) -> Result<(), Error> {
        self.session.send(c)
    }

    /// Who holds this lock now, as the service sees it: the key every
    /// later one waits for, its token and lease, and the identity
    /// recorded beside that lease (host, pid, process start, face and
    /// version, the application's description), also when another
    /// process holds it. `None` when nothing holds it; `identity` is
    /// `None` for a holder that records none (`etcdctl lock`). One read
    /// of the service (etcd: two), blocking at most its request timeout.
    pub fn holder(&self) -> Result<Option<LockHolder>, Error> {
        let backend = self.session.backend().clone();
        let name = self.name.clone();
        crate::driver::block_on(async move { backend.holder(&name).await })?
            .map_err(|e| Error::Backend(e.to_string()))
    }

    /// [`Lock::holder`] for async code.
    pub async fn holder_async(&self) -> Result<Option<LockHolder>, Error> {
        let backend = self.session.backend().clone();
        backend
            .holder(&self.name)
            .await
            .map_err(|e| Error::Backend(e.to_string()))
    }

    /// The session the lock is held under.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The lock's id in its session's driver.
    pub(crate) fn id(&self) -> LockId {
        self.id
    }

    /// Sends a command about this lock to the session's driver.
    pub(crate) fn command(&self, c: Command) -> Result<(), Error> {
        self.send(c)
    }

    /// The acquire request for `timeout`: zero tries once, like
    /// [`Lock::try_acquire`].
    fn acquire_command(
        &self,
        wait: bool,
        timeout: Option<Duration>,
        reply: Reply<Result<Token, Error>>,
        ticket: Option<Arc<Ticket>>,
    ) -> Command {
        let try_once = !wait || timeout.is_some_and(|t| t.is_zero());
        Command::Acquire {
            lock: self.id,
            wait: !try_once,
            timeout: if try_once {
                Some(self.session.options().keepalive_timeout * 2)
            } else {
                timeout
            },
            reply,
            ticket,
        }
    }

    fn acquire_blocking(&self, wait: bool, timeout: Option<Duration>) -> Result<Token, Error> {
        self.session.live()?;
        let (reply, rx) = Reply::blocking();
        self.send(self.acquire_command(wait, timeout, reply, None))?;
        rx.recv().map_err(|_| Error::Shutdown)?
    }

    /// Starts a cancellable acquisition answered through `reply`.
    pub(crate) fn acquire_start(
        &self,
        wait: bool,
        timeout: Option<Duration>,
        reply: Reply<Result<Token, Error>>,
    ) -> Result<Acquisition, (Error, Reply<Result<Token, Error>>)> {
        if let Err(e) = self.session.live() {
            return Err((e, reply));
        }
        if crate::forked() {
            return Err((Error::Forked, reply));
        }
        let ticket = Arc::new(Ticket::default());
        let command = self.acquire_command(wait, timeout, reply, Some(ticket.clone()));
        match self.session.inner.commands.send(command) {
            Ok(()) => Ok(Acquisition::new(
                self.session.inner.commands.downgrade(),
                self.id,
                ticket,
            )),
            Err(mpsc::error::SendError(Command::Acquire { reply, .. })) => {
                Err((Error::Shutdown, reply))
            }
            Err(_) => unreachable!("the command sent is an acquire"),
        }
    }

    async fn acquire_future(&self, wait: bool, timeout: Option<Duration>) -> Result<Token, Error> {
        let (reply, rx) = Reply::future();
        let acquisition = self
            .acquire_start(wait, timeout, reply)
            .map_err(|(e, _)| e)?;
        // Dropped before the answer: the acquisition leaves nothing held.
        let mut guard = CancelOnDrop(Some(acquisition));
        let r = rx.await;
        guard.0 = None;
        r.map_err(|_| Error::Shutdown)?
    }

    /// Starts an acquisition and returns at once; `done` runs exactly once,
    /// on dlock's callback thread (in order with the lock's callbacks), with
    /// the outcome. `wait == false` tries once ([`Error::WouldBlock`] if
    /// held, as [`Lock::try_acquire`]); `timeout == None` waits as long as it
    /// takes. [`Acquisition::cancel`] leaves nothing held, whenever called;
    /// a `done` that has not run then gets [`Error::Released`]. This is the
    /// completion form the faces use: no face runs an executor.
    pub fn acquire_then(
        &self,
        wait: bool,
        timeout: Option<Duration>,
        done: impl FnOnce(Result<Token, Error>) + Send + 'static,
    ) -> Acquisition {
        match self.acquire_start(wait, timeout, Reply::Then(Box::new(done))) {
            Ok(a) => a,
            Err((e, reply)) => {
                reply.send(Err(e));
                // Nothing started: cancelling it does nothing.
                Acquisition::new(
                    self.session.inner.commands.downgrade(),
                    self.id,
                    Arc::new(Ticket::default()),
                )
            }
        }
    }

    /// Acquires the lock, waiting up to `timeout` for one's turn; zero tries
    /// once (as [`Lock::try_acquire`]). Returns the fencing token. Blocks.
    /// [`Error::Timeout`]: the wait ran out; [`Error::Backend`]: the service
    /// failed or did not answer; [`Error::AlreadyHeld`]: this handle holds
    /// the lock or another acquire of it is in progress.
    pub fn acquire(&self, timeout: Duration) -> Result<Token, Error> {
        self.acquire_blocking(true, Some(timeout))
    }

    /// Acquires the lock if nobody holds it, else fails with
    /// [`Error::WouldBlock`]. Blocks for at most about two keepalive
    /// timeouts. If the lock fences later, it reacquires by waiting its
    /// turn, as every reacquisition does.
    pub fn try_acquire(&self) -> Result<Token, Error> {
        self.acquire_blocking(false, None)
    }

    /// Acquires the lock, waiting up to `timeout` (`None`: as long as it
    /// takes). Works on any executor. Dropping the future before it is
    /// ready cancels the acquisition ([`Acquisition::cancel`]): it leaves
    /// nothing held, even if the lock was won just then.
    pub async fn acquire_async(&self, timeout: Option<Duration>) -> Result<Token, Error> {
        self.acquire_future(true, timeout).await
    }

    /// [`Lock::try_acquire`] for async code.
    pub async fn try_acquire_async(&self) -> Result<Token, Error> {
        self.acquire_future(false, None).await
    }

    /// Releases the lock: no permit is valid from now on; returns once its
    /// key is deleted (the session's lease lives on for its other locks), or
    /// after a keepalive timeout if the service does not answer (the delete
    /// goes on in the background until it does).
    pub fn release(&self) -> Result<(), Error> {
        let (done, rx) = Reply::blocking();
        self.send(Command::Release {
            lock: self.id,
            done,
        })?;
        rx.recv().map_err(|_| Error::Shutdown)
    }

    /// [`Lock::release`] for async code.
    pub async fn release_async(&self) -> Result<(), Error> {
        let (done, rx) = Reply::future();
        self.send(Command::Release {
            lock: self.id,
            done,
        })?;
        rx.await.map_err(|_| Error::Shutdown)
    }

    /// Releases the lock (as [`Lock::release`]) and ends its callbacks:
    /// every event up to the release is delivered, then no callback of this
    /// lock runs again once `close` returns, and its event streams end. A
    /// callback of this lock running on the callback thread is waited for,
    /// unless `close` is called from a callback. Permits in flight stay safe
    /// to end and report `valid() == false`. Closing twice is harmless.
    pub fn close(&self) -> Result<(), Error> {
        let released = match self.release() {
            Err(Error::Shutdown) => Ok(()),
            r => r,
        };
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(callbacks) = self.callbacks.get() {
            callbacks.close();
        }
        released
    }

    /// [`Lock::close`] for async code: the release is awaited, and the
    /// wait for a running callback happens off the caller's executor.
    pub async fn close_async(&self) -> Result<(), Error> {
        let released = match self.release_async().await {
            Err(Error::Shutdown) => Ok(()),
            r => r,
        };
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let Some(callbacks) = self.callbacks.get().cloned() else {
            return released;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("dlock-close".into())
            .spawn(move || {
                callbacks.close();
                let _ = tx.send(());
            })
            .map_err(|e| Error::Backend(format!("cannot start a thread to close: {e}")))?;
        let _ = rx.await;
        released
    }

    /// Whether [`Lock::close`] was called (callbacks are off).
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.gate.read().state
    }

    /// The token held, while `Holding` or `Draining`.
    pub fn token(&self) -> Option<Token> {
        let s = self.gate.read();
        matches!(s.state, State::Holding | State::Draining).then_some(s.token)
    }

    /// The last token published (the one fenced, once `Fenced`).
    pub(crate) fn last_token(&self) -> u64 {
        self.gate.read().token.get()
    }

    /// The local deadline, while `Holding` or `Draining`.
    pub fn deadline(&self) -> Option<Instant> {
        let s = self.gate.read();
        matches!(s.state, State::Holding | State::Draining).then_some(s.deadline)
    }

    /// Time left before the deadline (zero once passed), while `Holding` or
    /// `Draining`.
    pub fn time_left(&self) -> Option<Duration> {
        self.gate.time_left()
    }

    /// Units of work in flight (permits not yet ended).
    pub fn in_flight(&self) -> u64 {
        self.gate.in_flight()
    }

    /// For a health endpoint (the analogue of client-go's leader-election
    /// `Check`): `false` once the lock is still holding or draining more
    /// than `max_overdue` past its deadline, i.e. the fence that was due
    /// did not happen (a stuck driver or callback thread). A lock not
    /// held is healthy: not holding is no fault.
    pub fn healthy(&self, max_overdue: Duration) -> bool {
        let s = self.gate.read();
        !matches!(s.state, State::Holding | State::Draining)
            || self.gate.clock.now().saturating_since(s.deadline) <= max_overdue
    }

    /// Counters, the last keepalive's round trip, the slack and the permits
    /// in flight.
    pub fn stats(&self) -> LockStats {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.gate.counters;
        let rtt = self.session.inner.shared.last_rtt_ns.load(Relaxed);
        LockStats {
            acquisitions: c.acquisitions.load(Relaxed),
            drains: c.drains.load(Relaxed),
            resumes: c.resumes.load(Relaxed),
            fences_deadline: c.fences_deadline.load(Relaxed),
            fences_lease_lost: c.fences_lease_lost.load(Relaxed),
            fences_lock_lost: c.fences_lock_lost.load(Relaxed),
            last_keepalive_rtt: (rtt > 0).then(|| Duration::from_nanos(rtt)),
            slack: self.gate.time_left(),
            in_flight: self.gate.in_flight(),
        }
    }

    /// Permission to start one unit of work: granted only while `Holding`
    /// and before the deadline, read from the clock on every call. Counted in
    /// flight until dropped.
    #[inline(always)]
    pub fn permit(&self) -> Result<Permit<'_>, Refused> {
        Ok(Permit::new(self.permit_owned()?))
    }

    /// [`Lock::permit`] for work that outlives the borrow (another thread, a
    /// binding). As cheap: no allocation, no reference count; it stays safe
    /// to end after the lock is closed or dropped (the permits in flight
    /// keep the lock's state).
    #[inline(always)]
    pub fn permit_owned(&self) -> Result<OwnedPermit, Refused> {
        let s = self.gate.enter()?;
        Ok(OwnedPermit::new(&self.gate, s.token, s.deadline))
    }

    /// The lock's callbacks, made (and handed to the driver) on first use.
    fn listeners(&self) -> &Arc<Callbacks> {
        self.callbacks.get_or_init(|| {
            let callbacks = Arc::new(Callbacks::default());
            if self.is_closed() {
                callbacks.close_now();
            }
            let listen = Command::Listen {
                lock: self.id,
                callbacks: callbacks.clone(),
            };
            // Refused only when the driver is gone (or in a fork child):
            // then no event comes anyway.
            let _ = self.session.send(listen);
            callbacks
        })
    }

    /// Called with every event of the lock, in order (beside the `on_*`
    /// callbacks of its kind).
    pub fn on_event(&self, f: impl Fn(&LockEvent) + Send + Sync + 'static) {
        self.listeners().on_event(f);
    }

    /// The lock's events from now on, for callers that pull (async code,
    /// bindings); the stream ends when the lock is closed or dropped.
    pub fn events(&self) -> EventStream {
        self.listeners().stream()
    }

    /// Called once per fenced token with the number of permits then in
    /// flight: stop the work now. After a lease fence, the session's lease
    /// is revoked (letting the next holders in) only after this returned
    /// and the last permit ended (a key deleted by an operator is gone
    /// already).
    pub fn on_fence(&self, f: impl Fn(Token, u64) + Send + Sync + 'static) {
        self.listeners().on_fence(f);
    }

    /// Called on every state change.
    pub fn on_state_change(&self, f: impl Fn(StateChange) + Send + Sync + 'static) {
        self.listeners().on_state_change(f);
    }

    /// Called on every acquisition (first and after a fence) with its token.
    pub fn on_acquired(&self, f: impl Fn(Token) + Send + Sync + 'static) {
        self.listeners().on_acquired(f);
    }

    /// Called once the lock has left `Holding` (drain or fence) and no permit
    /// is in flight any more.
    pub fn on_drained(&self, f: impl Fn() + Send + Sync + 'static) {
        self.listeners().on_drained(f);
    }

    fn write_command(
        &self,
        token: Token,
        key: &[u8],
        value: Option<&[u8]>,
        reply: Reply<Result<(), Error>>,
    ) -> Result<Command, Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        if self.mode() == Some(crate::Mode::Read) {
            return Err(Error::InvalidArgument(
                "guarded write: a read holder may not write (acquire a writer)".into(),
            ));
        }
        if key.is_empty() {
            return Err(Error::InvalidArgument("guarded write: empty key".into()));
        }
        if key.len() > MAX_KEY_LEN {
            return Err(Error::InvalidArgument(format!(
                "guarded write: the key must be at most {MAX_KEY_LEN} bytes (MAX_KEY_LEN: every engine's limit), got {}",
                key.len()
            )));
        }
        if let Some(v) = value.filter(|v| v.len() > crate::election::MAX_VALUE_LEN) {
            return Err(Error::InvalidArgument(format!(
                "guarded write: the value must be at most {} bytes (MAX_VALUE_LEN: with the longest key it fits every engine's request limit), got {}",
                crate::election::MAX_VALUE_LEN,
                v.len()
            )));
        }
        let own = format!("{}/", self.name);
        if key.starts_with(own.as_bytes()) {
            return Err(Error::InvalidArgument(format!(
                "guarded write: the key is inside the lock's own key prefix `{own}`"
            )));
        }
        Ok(Command::Write {
            lock: self.id,
            write: Write {
                token,
                key: key.to_vec(),
                value: value.map(<[u8]>::to_vec),
                reply,
            },
        })
    }

    fn write_blocking(&self, token: Token, key: &[u8], value: Option<&[u8]>) -> Result<(), Error> {
        let (reply, rx) = Reply::blocking();
        self.send(self.write_command(token, key, value, reply)?)?;
        rx.recv().map_err(|_| Error::Shutdown)?
    }

    async fn write_future(
        &self,
        token: Token,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), Error> {
        let (reply, rx) = Reply::future();
        self.send(self.write_command(token, key, value, reply)?)?;
        rx.await.map_err(|_| Error::Shutdown)?
    }

    /// Puts `key` = `value` in the lock service only while `token` is the
    /// token this handle holds and the service agrees (etcd: one transaction
    /// comparing the lock key's `create_revision`). [`Error::Fenced`] if the
    /// token is stale or not this handle's; [`Error::InvalidArgument`] for
    /// an empty key or one inside the lock's own prefix (`<name>/…`);
    /// [`Error::Backend`]: the outcome is unknown, the write may have
    /// committed. Blocks, at most about a TTL.
    pub fn guarded_put(&self, token: Token, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.write_blocking(token, key, Some(value))
    }

    /// Deletes `key` under the rules of [`Lock::guarded_put`].
    pub fn guarded_delete(&self, token: Token, key: &[u8]) -> Result<(), Error> {
        self.write_blocking(token, key, None)
    }

    /// [`Lock::guarded_put`] for async code.
    pub async fn guarded_put_async(
        &self,
        token: Token,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), Error> {
        self.write_future(token, key, Some(value)).await
    }

    /// [`Lock::guarded_delete`] for async code.
    pub async fn guarded_delete_async(&self, token: Token, key: &[u8]) -> Result<(), Error> {
        self.write_future(token, key, None).await
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if crate::forked() {
            return;
        }
        // Released and published before the drop returns (permits in flight
        // report invalid), without waiting for the revoke.
        // The driver's own thread must not wait for the driver.
        let wait = !crate::driver::on_driver_thread();
        let (published, rx) = Reply::blocking();
        let drop = Command::Drop {
            lock: self.id,
            published,
        };
        if self.session.send(drop).is_ok() && wait {
            let _ = rx.recv();
        }
        if let Some(callbacks) = self.callbacks.get() {
            if wait {
                callbacks.close();
            } else {
                callbacks.close_now();
            }
        }
        self.gate.orphan();
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.gate.read();
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("slot", &self.slot)
            .field("mode", &self.mode())
            .field("state", &s.state)
            .field("token", &s.token)
            .finish()
    }
}
