//! The driver: performs the machine's actions (docs/design.md §15, §19). It owns
//! I/O, timers and the hand-off to the callback thread; it decides nothing
//! about leases, deadlines, tokens or ordering: those are [`Holder`]'s.
//!
//! One background thread per process runs a current-thread tokio runtime,
//! created on first use. Each lock has one task there that owns its
//! [`Holder`]; backend calls run as tasks of their own and report back by
//! channel, so a hung request never delays the deadline timer.

use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tracing::Instrument;

use crate::backend::{Backend, BackendError};
use crate::callbacks::Callbacks;
use crate::clock::Instant;
use crate::events::LockEvent;
use crate::gate::Gate;
use crate::machine::{AcquireError, Action, Event, Holder, LeaseId, Reason, State, Token};
use crate::{Error, Options};

/// The driver runtime's handle, creating the runtime thread on first use.
pub(crate) fn runtime() -> &'static tokio::runtime::Handle {
    static RT: OnceLock<tokio::runtime::Handle> = OnceLock::new();
    RT.get_or_init(|| {
        crate::fork::watch();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("dlock: cannot build the driver runtime");
        let handle = rt.handle().clone();
        std::thread::Builder::new()
            .name("dlock-driver".into())
            .spawn(move || {
                block_sigpipe();
                ON_DRIVER.set(true);
                rt.block_on(std::future::pending::<()>())
            })
            .expect("dlock: cannot spawn the driver thread");
        handle
    })
}

thread_local! {
    static ON_DRIVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is the driver's: it must never wait for the
/// driver (a handle dropped there, say by a task dropping a callback that
/// owned it).
pub(crate) fn on_driver_thread() -> bool {
    ON_DRIVER.get()
}

/// Runs `fut` on the driver; the receiver gets its output ([`Error::Shutdown`]
/// if the driver dropped it). The blocking and async forms of every call
/// share this.
pub(crate) fn on_driver<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> oneshot::Receiver<T> {
    let (tx, rx) = oneshot::channel();
    runtime().spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx
}

/// Runs `fut` on the driver and blocks the calling thread for its output.
pub(crate) fn block_on<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> Result<T, Error> {
    on_driver(fut).blocking_recv().map_err(|_| Error::Shutdown)
}

/// Blocks SIGPIPE on the driver thread (and the threads it starts), where
/// all network I/O runs. A peer that closes a socket mid-write (an etcd
/// member dying, a TLS handshake refused) then gives that write EPIPE
/// instead of killing the process: Rust programs ignore SIGPIPE, but a C
/// host linking libdlock keeps the default action. The signal is
/// thread-directed, so the application's own threads keep their setting.
fn block_sigpipe() {
    // SAFETY: plain libc calls on a local, initialised signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Where a caller waits for the outcome: a blocked thread or a future.
pub(crate) enum Reply<T> {
    Blocking(std_mpsc::SyncSender<T>),
    Async(oneshot::Sender<T>),
}

impl<T> Reply<T> {
    fn send(self, r: T) {
        match self {
            Reply::Blocking(tx) => drop(tx.try_send(r)),
            Reply::Async(tx) => drop(tx.send(r)),
        }
    }

    /// A reply channel for a blocking caller.
    pub(crate) fn blocking() -> (Reply<T>, std_mpsc::Receiver<T>) {
        let (tx, rx) = std_mpsc::sync_channel(1);
        (Reply::Blocking(tx), rx)
    }

    /// A reply channel for an async caller.
    pub(crate) fn future() -> (Reply<T>, oneshot::Receiver<T>) {
        let (tx, rx) = oneshot::channel();
        (Reply::Async(tx), rx)
    }
}

/// A guarded write asked of the lock's task.
pub(crate) struct Write {
    pub(crate) token: Token,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) reply: Reply<Result<(), Error>>,
}

/// What a lock handle asks of its task.
pub(crate) enum Command {
    Acquire {
        wait: bool,
        timeout: Option<Duration>,
        reply: Reply<Result<Token, Error>>,
    },
    Release {
        done: Reply<()>,
    },
    /// The handle is dropped: release, and answer once the release is
    /// published (permits then report invalid), without waiting for the
    /// revoke.
    Drop {
        published: Reply<()>,
    },
    Write(Write),
}

/// A backend call's outcome, with the error text when it failed.
type Outcome = (Event, Option<String>);

/// Starts the task of one lock.
pub(crate) fn spawn_lock(
    gate: Arc<Gate>,
    callbacks: Arc<Callbacks>,
    backend: Arc<dyn Backend>,
    name: Arc<str>,
    opts: Options,
) -> mpsc::UnboundedSender<Command> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (events_tx, events) = mpsc::unbounded_channel();
    let span = tracing::info_span!("dlock_lock", name = %name, token = tracing::field::Empty);
    let task = LockTask {
        machine: Holder::new(opts.clone()),
        opts,
        gate,
        callbacks,
        backend,
        name,
        events_tx,
        waiters: Vec::new(),
        releases: Vec::new(),
        lock_calls: Vec::new(),
        published_state: (State::Idle, None, None),
        armed: false,
        last_error: None,
        publish_acks: Vec::new(),
        span: span.clone(),
    };
    runtime().spawn(task.run(rx, events).instrument(span));
    tx
}

struct LockTask {
    machine: Holder,
    opts: Options,
    gate: Arc<Gate>,
    callbacks: Arc<Callbacks>,
    backend: Arc<dyn Backend>,
    name: Arc<str>,
    events_tx: mpsc::UnboundedSender<Outcome>,
    waiters: Vec<Reply<Result<Token, Error>>>,
    releases: Vec<Reply<()>>,
    lock_calls: Vec<(LeaseId, AbortHandle)>,
    published_state: (State, Option<Token>, Option<Instant>),
    /// The gate's drain watch is armed.
    armed: bool,
    /// The last backend failure of an acquisition, for its error.
    last_error: Option<String>,
    /// Answered once the next state is published (a dropped handle).
    publish_acks: Vec<Reply<()>>,
    span: tracing::Span,
}

impl LockTask {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut events: mpsc::UnboundedReceiver<Outcome>,
    ) {
        let clock = self.gate.clock.clone();
        let mut open = true;
        loop {
            self.step();
            let timer = self.machine.poll_timeout();
            // Dropped and released: done once nothing is left to do (a held
            // revoke, a drain to report).
            if !open
                && self.machine.state() == State::Released
                && timer.is_none()
                && !self.machine.watching_permits()
            {
                return;
            }
            let gate = self.gate.clone();
            tokio::select! {
                biased;
                cmd = commands.recv(), if open => {
                    let now = clock.now();
                    match cmd {
                        None => {
                            open = false;
                            self.machine.handle(now, Event::Release);
                        }
                        Some(Command::Acquire { wait, timeout, reply }) => {
                            self.waiters.push(reply);
                            let until = timeout.map(|t| now + t);
                            self.machine.handle(now, Event::Acquire { wait, until });
                        }
                        Some(Command::Release { done }) => {
                            self.releases.push(done);
                            self.machine.handle(now, Event::Release);
                        }
                        Some(Command::Drop { published }) => {
                            self.publish_acks.push(published);
                            self.machine.handle(now, Event::Release);
                        }
                        Some(Command::Write(w)) => self.write(now, w),
                    }
                }
                Some((ev, error)) = events.recv() => {
                    if error.is_some() {
                        self.last_error = error;
                    }
                    self.machine.handle(clock.now(), ev);
                }
                _ = gate.drained.notified(), if self.armed => {
                    // A wake-up left over from an earlier watch finds this
                    // one still armed.
                    if !self.gate.watching() {
                        self.gate.unwatch_drain();
                        self.armed = false;
                        self.machine.handle(clock.now(), Event::PermitsEnded);
                    }
                }
                _ = async { clock.sleep_until(timer.unwrap()).await }, if timer.is_some() => {
                    self.machine.handle(clock.now(), Event::Timer);
                }
            }
        }
    }

    /// Publishes the machine's state, performs its actions in order, and
    /// arms the drain watch the machine asks for.
    fn step(&mut self) {
        loop {
            self.perform();
            let want = self.machine.watching_permits();
            if want && !self.armed {
                if self.gate.watch_drain() {
                    // None in flight now: tell the machine at once.
                    let now = self.gate.clock.now();
                    self.machine.handle(now, Event::PermitsEnded);
                    continue;
                }
                self.armed = true;
            } else if !want && self.armed {
                self.gate.unwatch_drain();
                self.armed = false;
            }
            return;
        }
    }

    fn perform(&mut self) {
        let m = &self.machine;
        let now_published = (m.state(), m.token(), m.deadline());
        if now_published != self.published_state {
            self.gate
                .publish(now_published.0, now_published.1, now_published.2);
            self.published_state = now_published;
        }
        finish_releases(std::mem::take(&mut self.publish_acks));
        let at = self.gate.clock.now();
        while let Some(action) = self.machine.poll_action() {
            match action {
                Action::Grant { req, ttl } => {
                    let b = self.backend.clone();
                    self.call(async move {
                        match b.grant(ttl).await {
                            Ok(g) => (
                                Event::LeaseGranted {
                                    req,
                                    lease: g.lease,
                                    ttl: g.ttl,
                                },
                                None,
                            ),
                            Err(e) => {
                                tracing::debug!(error = %e, "lease grant failed");
                                (Event::GrantFailed { req }, Some(e.to_string()))
                            }
                        }
                    });
                }
                Action::Keepalive { req, lease } => {
                    let (b, clock) = (self.backend.clone(), self.gate.clock.clone());
                    let gate = self.gate.clone();
                    self.call(async move {
                        let sent = clock.now();
                        match b.keepalive(lease).await {
                            Ok(ttl) => {
                                let rtt = clock.now().saturating_since(sent);
                                let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
                                gate.counters
                                    .last_rtt_ns
                                    .store(ns.max(1), std::sync::atomic::Ordering::Relaxed);
                                (Event::KeepaliveConfirmed { req, ttl }, None)
                            }
                            Err(BackendError::LeaseNotFound) => (Event::LeaseLost { lease }, None),
                            Err(e) => {
                                tracing::debug!(error = %e, "keepalive failed");
                                (Event::KeepaliveFailed { req }, None)
                            }
                        }
                    });
                }
                Action::Lock { req, lease, wait } => {
                    let (b, name) = (self.backend.clone(), self.name.clone());
                    self.spawn_tracked(lease, async move {
                        match b.lock(&name, lease, wait).await {
                            Ok(token) => (Event::Locked { req, lease, token }, None),
                            Err(BackendError::LeaseNotFound) => (Event::LeaseLost { lease }, None),
                            Err(e) => (
                                Event::LockFailed {
                                    req,
                                    busy: e == BackendError::Busy,
                                },
                                Some(e.to_string()),
                            ),
                        }
                    });
                }
                Action::Revoke { lease } => {
                    self.lock_calls.retain(|(l, h)| {
                        if *l == lease {
                            h.abort();
                        }
                        *l != lease
                    });
                    let revoke = self.revoke(lease);
                    runtime().spawn(revoke.instrument(self.span.clone()));
                }
                Action::Transition(change) => {
                    tracing::debug!(lock = %self.name, %change, "state change");
                    self.count(change);
                    self.deliver(LockEvent::State { change, at }, None);
                }
                Action::Fence { token } => {
                    let in_flight = self.gate.in_flight();
                    tracing::warn!(lock = %self.name, %token, in_flight, "fenced");
                    // The machine holds the lease's revoke until on_fence
                    // has returned: say so from the callback thread.
                    let tx = self.events_tx.clone();
                    let delivered = Box::new(move || {
                        let _ = tx.send((Event::FenceDelivered { token }, None));
                    });
                    self.deliver(
                        LockEvent::Fence {
                            token,
                            in_flight,
                            at,
                        },
                        Some(delivered),
                    );
                }
                Action::Acquired { token } => {
                    self.span.record("token", token.get());
                    self.last_error = None;
                    if let Some(lease) = self.machine.lease() {
                        self.watch_lock(lease, token);
                    }
                    self.deliver(LockEvent::Acquired { token, at }, None);
                    for w in self.waiters.drain(..) {
                        w.send(Ok(token));
                    }
                }
                Action::AcquireFailed { error } => {
                    let e = self.error_of(error);
                    for w in self.waiters.drain(..) {
                        w.send(Err(e.clone()));
                    }
                }
                Action::AcquireRefused { error } => {
                    let e = self.error_of(error);
                    if let Some(w) = self.waiters.pop() {
                        w.send(Err(e));
                    }
                }
                Action::Drained => self.deliver(LockEvent::Drained { at }, None),
            }
        }
        finish_releases(std::mem::take(&mut self.releases));
    }

    fn error_of(&mut self, error: AcquireError) -> Error {
        match error {
            AcquireError::Timeout => Error::Timeout,
            AcquireError::WouldBlock => Error::WouldBlock,
            AcquireError::AlreadyHeld => Error::AlreadyHeld,
            AcquireError::Released => Error::Released,
            AcquireError::Backend => Error::Backend(match self.last_error.take() {
                Some(e) => format!("the lock service failed: {e}"),
                None => "the lock service did not answer in time".into(),
            }),
        }
    }

    /// The counters of `Lock::stats()`.
    fn count(&self, change: crate::machine::StateChange) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.gate.counters;
        let counter = match (change.to, change.reason) {
            (State::Holding, Reason::Acquired | Reason::Reacquired) => &c.acquisitions,
            (State::Holding, Reason::Resumed) => &c.resumes,
            (State::Draining, _) => &c.drains,
            (State::Fenced, Reason::Deadline) => &c.fences_deadline,
            (State::Fenced, Reason::LockLost) => &c.fences_lock_lost,
            (State::Fenced, _) => &c.fences_lease_lost,
            _ => return,
        };
        counter.fetch_add(1, Relaxed);
    }

    fn deliver(&self, event: LockEvent, then: Option<crate::callbacks::Job>) {
        self.callbacks.deliver(event, then);
    }

    /// A guarded write: the machine says whether `token` is the one held
    /// (and under which lease); the service then decides atomically.
    fn write(&mut self, now: Instant, w: Write) {
        let Some(lease) = self.machine.write_lease(now, w.token) else {
            w.reply.send(Err(Error::Fenced(w.token.get())));
            return;
        };
        let (b, name, ttl) = (self.backend.clone(), self.name.clone(), self.opts.ttl);
        runtime().spawn(
            async move {
                let write = b.guarded_write(&name, lease, w.token, &w.key, w.value.as_deref());
                let r = match tokio::time::timeout(ttl, write).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(BackendError::Fenced)) => Err(Error::Fenced(w.token.get())),
                    Ok(Err(e)) => Err(Error::Backend(format!(
                        "guarded write: {e} (the outcome is unknown: it may have committed)"
                    ))),
                    Err(_) => Err(Error::Backend(
                        "guarded write: no answer within the TTL (the outcome is unknown: it may have committed)"
                            .into(),
                    )),
                };
                w.reply.send(r);
            }
            .instrument(self.span.clone()),
        );
    }

    /// Revokes `lease`; `release()` calls waiting now return once it is
    /// revoked, or after a keepalive timeout. A revoke the service does not
    /// answer is tried again every retry interval until it answers: a lease
    /// we know is ours and dead must never outlive an outage (etcd restores
    /// leases with a fresh TTL when it comes back).
    fn revoke(&mut self, lease: LeaseId) -> impl Future<Output = ()> + Send + 'static {
        let (b, mut done) = (self.backend.clone(), std::mem::take(&mut self.releases));
        let (wait_for, retry) = (self.opts.keepalive_timeout, self.opts.retry_interval);
        async move {
            loop {
                let r = tokio::time::timeout(wait_for, b.revoke(lease)).await;
                finish_releases(std::mem::take(&mut done));
                match r {
                    Ok(Ok(())) | Ok(Err(BackendError::LeaseNotFound)) => return,
                    Ok(Err(e)) => tracing::debug!(lease, error = %e, "revoke failed; trying again"),
                    Err(_) => tracing::debug!(lease, "revoke unanswered; trying again"),
                }
                tokio::time::sleep(retry).await;
            }
        }
    }

    /// Runs one backend call as its own task, bounded by the TTL (after
    /// which no reply could matter), and feeds its outcome back.
    fn call(&self, call: impl Future<Output = Outcome> + Send + 'static) {
        let (tx, ttl) = (self.events_tx.clone(), self.opts.ttl);
        runtime().spawn(
            async move {
                if let Ok(out) = tokio::time::timeout(ttl, call).await {
                    let _ = tx.send(out);
                }
            }
            .instrument(self.span.clone()),
        );
    }

    /// Placeholder while sessions land: no key watch.
    fn watch_lock(&mut self, _lease: LeaseId, _token: Token) {}

    /// Runs `call` (a lock call or watch of `lease`) as its own task, feeds
    /// its outcome back, and keeps it to abort when `lease` is revoked.
    fn spawn_tracked(
        &mut self,
        lease: LeaseId,
        call: impl Future<Output = Outcome> + Send + 'static,
    ) {
        let tx = self.events_tx.clone();
        let task = runtime().spawn(
            async move {
                let _ = tx.send(call.await);
            }
            .instrument(self.span.clone()),
        );
        self.track(lease, task.abort_handle());
    }

    /// Keeps `task` (a lock call or watch of `lease`) to abort when `lease`
    /// is revoked; forgets the finished ones.
    fn track(&mut self, lease: LeaseId, task: AbortHandle) {
        self.lock_calls.retain(|(_, h)| !h.is_finished());
        self.lock_calls.push((lease, task));
    }
}

impl Drop for LockTask {
    /// A task dropped with a watch armed (a runtime shutting down) leaves
    /// no entry behind for a permit to find.
    fn drop(&mut self) {
        if self.armed {
            self.gate.unwatch_drain();
        }
    }
}

fn finish_releases(done: Vec<Reply<()>>) {
    for d in done {
        d.send(());
    }
}
