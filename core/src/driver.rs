//! The driver: owns I/O, timers and callbacks around the sans-IO machine.
//!
//! One background thread per process runs a current-thread tokio runtime,
//! created on first use. Each lock has one task there that owns its
//! [`Holder`]; backend calls run as tasks of their own and report back by
//! channel, so a hung request never delays the deadline timer. Callbacks run
//! on one separate thread, so a slow callback delays no keepalive or fence.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::backend::{Backend, BackendError, LockGone};
use crate::clock::Instant;
use crate::gate::{Gate, Job, Notice};
use crate::machine::{AcquireError, Action, Event, Holder, LeaseId, State, Token};
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
                rt.block_on(std::future::pending::<()>())
            })
            .expect("dlock: cannot spawn the driver thread");
        handle
    })
}

/// Runs `fut` on the driver and blocks the calling thread for its output;
/// [`Error::Shutdown`] if the driver dropped it.
pub(crate) fn block_on<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> Result<T, Error> {
    let (tx, rx) = std_mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().map_err(|_| Error::Shutdown)
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

/// Queues a callback call on the callback thread.
pub(crate) fn dispatch(job: Option<Job>) {
    static TX: OnceLock<std_mpsc::Sender<Job>> = OnceLock::new();
    // A forked child has no callback thread and must not start one.
    let Some(job) = job.filter(|_| !crate::forked()) else {
        return;
    };
    let tx = TX.get_or_init(|| {
        let (tx, rx) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("dlock-callbacks".into())
            .spawn(move || {
                for job in rx {
                    if let Err(panic) = catch_unwind(AssertUnwindSafe(job)) {
                        let msg = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        tracing::error!(panic = %msg, "a dlock callback panicked; the lock goes on");
                    }
                }
            })
            .expect("dlock: cannot spawn the callback thread");
        tx
    });
    let _ = tx.send(job);
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
}

/// Starts the task of one lock.
pub(crate) fn spawn_lock(
    gate: Arc<Gate>,
    backend: Arc<dyn Backend>,
    name: Arc<str>,
    opts: Options,
) -> mpsc::UnboundedSender<Command> {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = LockTask {
        machine: Holder::new(opts.clone()),
        opts,
        gate,
        backend,
        name,
        waiters: Vec::new(),
        releases: Vec::new(),
        lock_calls: Vec::new(),
        published: (State::Idle, None, None),
    };
    runtime().spawn(task.run(rx));
    tx
}

struct LockTask {
    machine: Holder,
    opts: Options,
    gate: Arc<Gate>,
    backend: Arc<dyn Backend>,
    name: Arc<str>,
    waiters: Vec<Reply<Result<Token, Error>>>,
    releases: Vec<Reply<()>>,
    lock_calls: Vec<(LeaseId, AbortHandle)>,
    published: (State, Option<Token>, Option<Instant>),
}

impl LockTask {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
        let clock = self.gate.clock.clone();
        let mut open = true;
        loop {
            self.step(&events_tx);
            if !open && self.machine.state() == State::Released {
                return;
            }
            let timer = self.machine.poll_timeout();
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
                    }
                }
                Some(ev) = events.recv() => self.machine.handle(clock.now(), ev),
                _ = async { clock.sleep_until(timer.unwrap()).await }, if timer.is_some() => {
                    self.machine.handle(clock.now(), Event::Timer);
                }
            }
        }
    }

    /// Publishes the machine's state, then performs its actions in order.
    fn step(&mut self, events: &mpsc::UnboundedSender<Event>) {
        let m = &self.machine;
        let now_published = (m.state(), m.token(), m.deadline());
        if now_published != self.published {
            self.gate
                .publish(now_published.0, now_published.1, now_published.2);
            self.published = now_published;
        }
        let mut drain = false;
        // A fence's revoke waits until on_fence has returned: the lock can
        // pass to another holder through our revoke only after the holder
        // was told (else only by the server's expiry, a margin later).
        let (mut fencing, mut revokes) = (false, Vec::new());
        while let Some(action) = self.machine.poll_action() {
            match action {
                Action::Grant { req, ttl } => {
                    let b = self.backend.clone();
                    self.call(events, async move {
                        match b.grant(ttl).await {
                            Ok(g) => Event::LeaseGranted {
                                req,
                                lease: g.lease,
                                ttl: g.ttl,
                            },
                            Err(e) => {
                                tracing::debug!(error = %e, "lease grant failed");
                                Event::GrantFailed { req }
                            }
                        }
                    });
                }
                Action::Keepalive { req, lease } => {
                    let b = self.backend.clone();
                    self.call(events, async move {
                        match b.keepalive(lease).await {
                            Ok(ttl) => Event::KeepaliveConfirmed { req, ttl },
                            Err(BackendError::LeaseNotFound) => Event::LeaseLost { lease },
                            Err(e) => {
                                tracing::debug!(error = %e, "keepalive failed");
                                Event::KeepaliveFailed { req }
                            }
                        }
                    });
                }
                Action::Lock { req, lease, wait } => {
                    let (b, name, tx) = (self.backend.clone(), self.name.clone(), events.clone());
                    let task = runtime().spawn(async move {
                        let ev = match b.lock(&name, lease, wait).await {
                            Ok(token) => Event::Locked { req, lease, token },
                            Err(BackendError::LeaseNotFound) => Event::LeaseLost { lease },
                            Err(e) => Event::LockFailed {
                                req,
                                busy: e == BackendError::Busy,
                            },
                        };
                        let _ = tx.send(ev);
                    });
                    self.track(lease, task.abort_handle());
                }
                Action::Revoke { lease } => {
                    self.lock_calls.retain(|(l, h)| {
                        if *l == lease {
                            h.abort();
                        }
                        *l != lease
                    });
                    revokes.push(self.revoke(lease));
                }
                Action::Transition(change) => {
                    tracing::debug!(lock = %self.name, %change, "state change");
                    if change.from == State::Holding {
                        drain |= matches!(change.to, State::Draining | State::Fenced);
                    }
                    if change.to == State::Holding {
                        drain = false;
                        self.gate.stop_drain();
                    }
                    self.notify(Notice::StateChange(change));
                }
                Action::Fence { token } => {
                    fencing = true;
                    let in_flight = self.gate.in_flight();
                    tracing::warn!(lock = %self.name, %token, in_flight, "fenced");
                    self.notify(Notice::Fence { token, in_flight });
                }
                Action::Acquired { token } => {
                    if let Some(lease) = self.machine.lease() {
                        self.watch_lock(events, lease, token);
                    }
                    self.notify(Notice::Acquired(token));
                    for w in self.waiters.drain(..) {
                        w.send(Ok(token));
                    }
                }
                Action::AcquireFailed { error } => {
                    let e = match error {
                        AcquireError::Timeout => Error::Timeout,
                        AcquireError::WouldBlock => Error::WouldBlock,
                        AcquireError::AlreadyHeld => Error::AlreadyHeld,
                        AcquireError::Released => Error::Released,
                        AcquireError::Backend => {
                            Error::Backend("the lock service did not answer".into())
                        }
                    };
                    for w in self.waiters.drain(..) {
                        w.send(Err(e.clone()));
                    }
                }
            }
        }
        if fencing && !revokes.is_empty() {
            // Queued behind the Fence notice on the callback thread.
            dispatch(Some(Box::new(move || {
                for revoke in revokes {
                    runtime().spawn(revoke);
                }
            })));
        } else {
            for revoke in revokes {
                runtime().spawn(revoke);
            }
        }
        finish_releases(std::mem::take(&mut self.releases));
        if drain {
            self.gate.start_drain();
        }
    }

    /// Revokes `lease`; `release()` calls waiting now return once it is
    /// revoked, or after a keepalive timeout. The revoke itself goes on
    /// until the lease would have expired anyway.
    fn revoke(&mut self, lease: LeaseId) -> impl Future<Output = ()> + Send + 'static {
        let (b, done) = (self.backend.clone(), std::mem::take(&mut self.releases));
        let (wait_for, ttl) = (self.opts.keepalive_timeout, self.opts.ttl);
        async move {
            let revoke = b.revoke(lease);
            tokio::pin!(revoke);
            let first = tokio::time::timeout(wait_for, &mut revoke).await;
            finish_releases(done);
            if first.is_err() {
                let _ = tokio::time::timeout(ttl, revoke).await;
            }
        }
    }

    /// Runs one backend call as its own task, bounded by the TTL (after
    /// which no reply could matter), and feeds its outcome back.
    fn call(
        &self,
        events: &mpsc::UnboundedSender<Event>,
        call: impl Future<Output = Event> + Send + 'static,
    ) {
        let (tx, ttl) = (events.clone(), self.opts.ttl);
        runtime().spawn(async move {
            if let Ok(ev) = tokio::time::timeout(ttl, call).await {
                let _ = tx.send(ev);
            }
        });
    }

    /// Watches the lock key while it is held under `lease`: if it vanishes
    /// (an operator deleted it), the machine fences at once. Aborted with
    /// the lease's other calls when the lease is revoked.
    fn watch_lock(&mut self, events: &mpsc::UnboundedSender<Event>, lease: LeaseId, token: Token) {
        let (b, name, tx) = (self.backend.clone(), self.name.clone(), events.clone());
        let task = runtime().spawn(async move {
            let gone = b.watch_lock(&name, lease, token).await;
            tracing::warn!(lock = %name, %token, ?gone, "the lock key is gone");
            let _ = tx.send(match gone {
                LockGone::KeyDeleted => Event::LockLost { lease },
                LockGone::LeaseLost => Event::LeaseLost { lease },
            });
        });
        self.track(lease, task.abort_handle());
    }

    /// Keeps `task` (a lock call or watch of `lease`) to abort when `lease`
    /// is revoked; forgets the finished ones.
    fn track(&mut self, lease: LeaseId, task: AbortHandle) {
        self.lock_calls.retain(|(_, h)| !h.is_finished());
        self.lock_calls.push((lease, task));
    }

    fn notify(&self, n: Notice) {
        dispatch(self.gate.callbacks.job(n));
    }
}

fn finish_releases(done: Vec<Reply<()>>) {
    for d in done {
        d.send(());
    }
}
