//! The driver: performs the machine's actions (docs/design.md §15, §19). It owns
//! I/O, timers and the hand-off to the callback thread; it decides nothing
//! about leases, deadlines, tokens or ordering: those are [`Holder`]'s.
//!
//! One background thread per process runs a current-thread tokio runtime,
//! created on first use. Each session has one task there that owns its
//! [`Holder`] (the lease and every lock of the session); backend calls run
//! as tasks of their own and report back by channel, so a hung request
//! never delays the deadline timer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::AbortHandle;
use tracing::Instrument;

use crate::backend::{Backend, BackendError, KeyGone, KeyWatch, LockGone};
use crate::callbacks::Callbacks;
use crate::clock::{Clock, Instant};
use crate::events::LockEvent;
use crate::gate::Gate;
use crate::machine::{
    AcquireError, Action, Event, Holder, LeaseId, LockId, Reason, State, StateChange, Token,
};
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

/// A guarded write asked of a lock.
pub(crate) struct Write {
    pub(crate) token: Token,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) reply: Reply<Result<(), Error>>,
}

/// What the handles of a session (its `Session` and its locks) ask of its
/// task.
pub(crate) enum Command {
    /// A new lock handle.
    Add {
        lock: LockId,
        name: Arc<str>,
        gate: Arc<Gate>,
    },
    /// The lock's first callback or stream: deliver its events from now on.
    Listen {
        lock: LockId,
        callbacks: Arc<Callbacks>,
    },
    Acquire {
        lock: LockId,
        wait: bool,
        timeout: Option<Duration>,
        reply: Reply<Result<Token, Error>>,
    },
    Release {
        lock: LockId,
        done: Reply<()>,
    },
    /// The handle is dropped: release, and answer once the release is
    /// published (permits then report invalid), without waiting for the
    /// key's delete.
    Drop {
        lock: LockId,
        published: Reply<()>,
    },
    Write {
        lock: LockId,
        write: Write,
    },
    /// Releases every lock and revokes the lease; answered once revoked
    /// (or after a keepalive timeout).
    Close {
        done: Reply<()>,
    },
}

/// What a session shares with its handles, beside the command channel.
#[derive(Default)]
pub(crate) struct Shared {
    /// The current lease, 0 for none.
    pub(crate) lease: AtomicI64,
    /// Last confirmed keepalive's round trip in ns; 0: none yet.
    pub(crate) last_rtt_ns: AtomicU64,
    /// Keepalives sent.
    pub(crate) keepalives: AtomicU64,
    /// Locks of the session (handles not yet finished).
    pub(crate) locks: AtomicU64,
}

/// A backend call's outcome, with the error text when it failed.
type Outcome = (Event, Option<String>);

/// Starts the task of one session; it ends once every handle is gone and
/// nothing is left to do (a held revoke, a key to delete).
pub(crate) fn spawn_session(
    backend: Arc<dyn Backend>,
    opts: Options,
    clock: Clock,
    shared: Arc<Shared>,
    drained: Arc<Notify>,
) -> mpsc::UnboundedSender<Command> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (events_tx, events) = mpsc::unbounded_channel();
    let (gone_tx, gone) = mpsc::unbounded_channel();
    let span = tracing::info_span!("dlock_session", lease = tracing::field::Empty);
    let task = SessionTask {
        machine: Holder::new(opts.clone()),
        opts,
        clock,
        shared,
        drained,
        backend,
        events_tx,
        gone_tx,
        locks: BTreeMap::new(),
        armed: BTreeSet::new(),
        tokens: HashMap::new(),
        watch: None,
        closes: Vec::new(),
        revoking: Vec::new(),
        deferred: Vec::new(),
        publish_acks: Vec::new(),
        release_check: Vec::new(),
        touched: BTreeSet::new(),
        published_deadline: None,
        last_error: None,
        span: span.clone(),
    };
    runtime().spawn(task.run(rx, events, gone).instrument(span));
    tx
}

/// The driver's side of one lock.
struct Entry {
    gate: Arc<Gate>,
    /// None until the handle's first callback or stream: no trip to the
    /// callback thread for a lock nobody listens to.
    callbacks: Option<Arc<Callbacks>>,
    /// The calls waiting on this lock, while any does (a held lock keeps
    /// nothing here).
    waiting: Option<Box<Waiting>>,
    /// The lock call in flight, with its lease.
    call: Option<(LeaseId, AbortHandle)>,
    /// The token whose key is watched.
    watched: Option<Token>,
    /// The handle is gone: forget the lock once the machine is done with it.
    dropped: bool,
}

/// The calls waiting on one lock.
#[derive(Default)]
struct Waiting {
    acquires: Vec<Reply<Result<Token, Error>>>,
    releases: Vec<Reply<()>>,
}

impl Entry {
    fn waiting(&mut self) -> &mut Waiting {
        self.waiting.get_or_insert_with(Box::default)
    }

    /// Drops the box once nothing waits.
    fn tidy(&mut self) {
        if self
            .waiting
            .as_ref()
            .is_some_and(|w| w.acquires.is_empty() && w.releases.is_empty())
        {
            self.waiting = None;
        }
    }

    fn take_acquires(&mut self) -> Vec<Reply<Result<Token, Error>>> {
        let taken = self
            .waiting
            .as_mut()
            .map(|w| std::mem::take(&mut w.acquires))
            .unwrap_or_default();
        self.tidy();
        taken
    }

    fn pop_acquire(&mut self) -> Option<Reply<Result<Token, Error>>> {
        let popped = self.waiting.as_mut().and_then(|w| w.acquires.pop());
        self.tidy();
        popped
    }

    fn take_releases(&mut self) -> Vec<Reply<()>> {
        let taken = self
            .waiting
            .as_mut()
            .map(|w| std::mem::take(&mut w.releases))
            .unwrap_or_default();
        self.tidy();
        taken
    }
}

struct SessionTask {
    machine: Holder,
    opts: Options,
    clock: Clock,
    shared: Arc<Shared>,
    drained: Arc<Notify>,
    backend: Arc<dyn Backend>,
    events_tx: mpsc::UnboundedSender<Outcome>,
    gone_tx: mpsc::UnboundedSender<KeyGone>,
    locks: BTreeMap<LockId, Entry>,
    /// Locks whose gate's drain watch is armed.
    armed: BTreeSet<LockId>,
    /// Held tokens, for the key watch's news.
    tokens: HashMap<Token, LockId>,
    /// The key watch of the current lease.
    watch: Option<(LeaseId, Box<dyn KeyWatch>)>,
    /// `Session::close` calls waiting for the revoke.
    closes: Vec<Reply<()>>,
    /// Revokes on their first try, with the closes they answer. A close
    /// that finds no lease of its own (a fenced lease's revoke already
    /// sent, once its work ended) waits for the latest of them, so a
    /// process that exits once closed does not cut that revoke off.
    revoking: Vec<RevokeWaiters>,
    /// Closes that came while a fenced lease's revoke was held back: the
    /// next revoke answers them, or a keepalive timeout does.
    deferred: Vec<RevokeWaiters>,
    /// Dropped handles, answered once their release is published.
    publish_acks: Vec<Reply<()>>,
    /// Locks with `release()` calls to answer unless a delete took them.
    release_check: Vec<LockId>,
    /// Locks an event or action named since the last step.
    touched: BTreeSet<LockId>,
    published_deadline: Option<Instant>,
    /// The last backend failure of an acquisition, for its error.
    last_error: Option<String>,
    span: tracing::Span,
}

impl SessionTask {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut events: mpsc::UnboundedReceiver<Outcome>,
        mut gone: mpsc::UnboundedReceiver<KeyGone>,
    ) {
        let clock = self.clock.clone();
        let drained = self.drained.clone();
        let mut open = true;
        loop {
            self.step();
            let timer = self.machine.poll_timeout();
            // Every handle gone: done once nothing is left to do.
            if !open && self.machine.idle() {
                return;
            }
            tokio::select! {
                biased;
                cmd = commands.recv(), if open => {
                    let now = clock.now();
                    match cmd {
                        None => {
                            open = false;
                            self.machine.handle(now, Event::Close);
                        }
                        Some(cmd) => self.command(now, cmd),
                    }
                }
                Some((ev, error)) = events.recv() => {
                    if error.is_some() {
                        self.last_error = error;
                    }
                    if let Event::Unlocked { lock, .. } | Event::FenceDelivered { lock, .. } = ev {
                        self.touched.insert(lock);
                    }
                    self.machine.handle(clock.now(), ev);
                }
                Some(g) = gone.recv() => self.key_gone(g),
                _ = drained.notified(), if !self.armed.is_empty() => {
                    // The last permit of some watched lock ended: which?
                    let ended: Vec<LockId> = self
                        .armed
                        .iter()
                        .copied()
                        .filter(|id| !self.locks[id].gate.watching())
                        .collect();
                    for lock in ended {
                        self.touched.insert(lock);
                        self.armed.remove(&lock);
                        self.locks[&lock].gate.unwatch_drain();
                        self.machine.handle(clock.now(), Event::PermitsEnded { lock });
                    }
                }
                _ = async { clock.sleep_until(timer.unwrap()).await }, if timer.is_some() => {
                    self.machine.handle(clock.now(), Event::Timer);
                }
            }
        }
    }

    fn command(&mut self, now: Instant, cmd: Command) {
        match cmd {
            Command::Listen { lock, callbacks } => {
                if let Some(e) = self.locks.get_mut(&lock) {
                    e.callbacks = Some(callbacks);
                }
            }
            Command::Add { lock, name, gate } => {
                self.machine.add_lock(lock, name);
                self.locks.insert(
                    lock,
                    Entry {
                        gate,
                        callbacks: None,
                        waiting: None,
                        call: None,
                        watched: None,
                        dropped: false,
                    },
                );
            }
            Command::Acquire {
                lock,
                wait,
                timeout,
                reply,
            } => {
                let Some(e) = self.locks.get_mut(&lock) else {
                    return reply.send(Err(Error::Released));
                };
                e.waiting().acquires.push(reply);
                let until = timeout.map(|t| now + t);
                self.machine
                    .handle(now, Event::Acquire { lock, wait, until });
            }
            Command::Release { lock, done } => {
                let Some(e) = self.locks.get_mut(&lock) else {
                    return done.send(());
                };
                e.waiting().releases.push(done);
                self.release_check.push(lock);
                self.touched.insert(lock);
                self.machine.handle(now, Event::Release { lock });
            }
            Command::Drop { lock, published } => {
                let Some(e) = self.locks.get_mut(&lock) else {
                    return published.send(());
                };
                self.publish_acks.push(published);
                e.dropped = true;
                self.touched.insert(lock);
                self.machine.handle(now, Event::Release { lock });
            }
            Command::Write { lock, write } => self.write(now, lock, write),
            Command::Close { done } => {
                self.closes.push(done);
                self.machine.handle(now, Event::Close);
            }
        }
    }

    /// A watched key went: the lock alone (deleted) or with the lease.
    fn key_gone(&mut self, g: KeyGone) {
        let Some(&lock) = self.tokens.get(&g.token) else {
            return;
        };
        let now = self.clock.now();
        tracing::warn!(lock = ?self.machine.name(lock), token = %g.token, why = ?g.why, "the lock key is gone");
        match (g.why, self.watch.as_ref()) {
            (LockGone::KeyDeleted, _) => {
                self.machine.handle(
                    now,
                    Event::LockLost {
                        lock,
                        token: g.token,
                    },
                );
            }
            (LockGone::LeaseLost, Some((lease, _))) => {
                let lease = *lease;
                self.machine.handle(now, Event::LeaseLost { lease });
            }
            (LockGone::LeaseLost, None) => {}
        }
    }

    /// Performs the machine's actions, publishes states, arms the drain
    /// watches the machine asks for, and forgets finished dropped locks.
    fn step(&mut self) {
        loop {
            self.perform();
            let mut again = false;
            let check: Vec<LockId> = self.touched.union(&self.armed).copied().collect();
            for lock in check {
                let want = self.machine.watching_permits(lock);
                let armed = self.armed.contains(&lock);
                let Some(e) = self.locks.get(&lock) else {
                    self.armed.remove(&lock);
                    continue;
                };
                if want && !armed {
                    if e.gate.watch_drain() {
                        // None in flight now: tell the machine at once.
                        let now = self.clock.now();
                        self.machine.handle(now, Event::PermitsEnded { lock });
                        again = true;
                    } else {
                        self.armed.insert(lock);
                    }
                } else if !want && armed {
                    e.gate.unwatch_drain();
                    self.armed.remove(&lock);
                }
            }
            if again {
                continue;
            }
            // Forget the dropped locks the machine is done with.
            let touched = std::mem::take(&mut self.touched);
            let done: Vec<LockId> = touched
                .into_iter()
                .filter(|id| self.locks.get(id).is_some_and(|e| e.dropped))
                .filter(|id| self.machine.finished(*id))
                .collect();
            for lock in done {
                self.forget(lock);
            }
            return;
        }
    }

    fn forget(&mut self, lock: LockId) {
        self.machine.remove_lock(lock);
        if let Some(e) = self.locks.remove(&lock) {
            if self.armed.remove(&lock) {
                e.gate.unwatch_drain();
            }
            if let Some(t) = e.watched {
                self.tokens.remove(&t);
            }
            self.shared.locks.fetch_sub(1, Relaxed);
        }
    }

    fn publish(&self, lock: LockId) {
        if let Some(e) = self.locks.get(&lock) {
            let state = self.machine.state(lock);
            let token = self.machine.token(lock);
            let deadline = self.machine.deadline();
            e.gate.publish(state, token, deadline);
        }
    }

    fn perform(&mut self) {
        let mut touched = std::mem::take(&mut self.touched);
        self.perform_into(&mut touched);
        self.touched.append(&mut touched);
    }

    fn perform_into(&mut self, touched: &mut BTreeSet<LockId>) {
        let at = self.clock.now();
        let lease = self.machine.lease();
        self.shared.lease.store(lease.unwrap_or(0), Relaxed);
        // The key watch belongs to one lease.
        if self.watch.as_ref().is_some_and(|(l, _)| Some(*l) != lease) {
            self.watch = None;
        }
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
                    let (b, clock) = (self.backend.clone(), self.clock.clone());
                    let shared = self.shared.clone();
                    shared.keepalives.fetch_add(1, Relaxed);
                    self.call(async move {
                        let sent = clock.now();
                        match b.keepalive(lease).await {
                            Ok(ttl) => {
                                let rtt = clock.now().saturating_since(sent);
                                let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
                                shared.last_rtt_ns.store(ns.max(1), Relaxed);
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
                Action::Lock {
                    req,
                    lock,
                    lease,
                    wait,
                } => {
                    let (b, tx) = (self.backend.clone(), self.events_tx.clone());
                    let Some(e) = self.locks.get_mut(&lock) else {
                        continue;
                    };
                    let name = self.machine.name(lock).expect("a lock of the machine");
                    let task = runtime().spawn(
                        async move {
                            let out = match b.lock(&name, lease, wait).await {
                                Ok(token) => (
                                    Event::Locked {
                                        req,
                                        lock,
                                        lease,
                                        token,
                                    },
                                    None,
                                ),
                                Err(BackendError::LeaseNotFound) => {
                                    (Event::LeaseLost { lease }, None)
                                }
                                Err(e) => (
                                    Event::LockFailed {
                                        req,
                                        lock,
                                        busy: e == BackendError::Busy,
                                    },
                                    Some(e.to_string()),
                                ),
                            };
                            let _ = tx.send(out);
                        }
                        .instrument(self.span.clone()),
                    );
                    e.call = Some((lease, task.abort_handle()));
                }
                Action::Unlock {
                    req,
                    lock,
                    lease,
                    token,
                } => {
                    let Some(e) = self.locks.get_mut(&lock) else {
                        continue;
                    };
                    if token.is_none()
                        && let Some((_, call)) = e.call.take()
                    {
                        // Cut short: the request in flight is abandoned
                        // (the backend orders the delete after its put).
                        call.abort();
                    }
                    // A stray reply's delete names an older token: the
                    // current one stays watched.
                    if token.is_none() || e.watched == token {
                        self.unwatch(lock);
                    }
                    let Some(e) = self.locks.get_mut(&lock) else {
                        continue;
                    };
                    let done = e.take_releases();
                    let name = self.machine.name(lock).expect("a lock of the machine");
                    let unlock = self.unlock(lock, req, name, lease, token, done);
                    runtime().spawn(unlock.instrument(self.span.clone()));
                }
                Action::Revoke { lease } => {
                    for e in self.locks.values_mut() {
                        if e.call.as_ref().is_some_and(|(l, _)| *l == lease) {
                            let (_, call) = e.call.take().expect("checked");
                            call.abort();
                        }
                    }
                    if self.watch.as_ref().is_some_and(|(l, _)| *l == lease) {
                        self.watch = None;
                    }
                    // A held revoke let go: its dropped locks may be done.
                    touched.extend(
                        self.locks
                            .iter()
                            .filter(|(_, e)| e.dropped)
                            .map(|(id, _)| *id),
                    );
                    let revoke = self.revoke(lease);
                    runtime().spawn(revoke.instrument(self.span.clone()));
                }
                Action::Transition { lock, change } => {
                    touched.insert(lock);
                    self.publish(lock);
                    self.count(lock, change);
                    if !matches!(change.to, State::Holding | State::Draining) {
                        self.unwatch(lock);
                    }
                    self.deliver(lock, LockEvent::State { change, at }, None);
                }
                Action::Deadline => {
                    let d = self.machine.deadline();
                    if d != self.published_deadline {
                        self.published_deadline = d;
                        for (id, e) in &self.locks {
                            let state = self.machine.state(*id);
                            if matches!(state, State::Holding | State::Draining) {
                                e.gate.publish(state, self.machine.token(*id), d);
                            }
                        }
                    }
                }
                Action::Fence { lock, token } => {
                    touched.insert(lock);
                    let Some(e) = self.locks.get(&lock) else {
                        continue;
                    };
                    let in_flight = e.gate.in_flight();
                    tracing::warn!(lock = ?self.machine.name(lock), %token, in_flight, "fenced");
                    // The machine holds the lease's revoke until on_fence
                    // has returned: say so from the callback thread.
                    let tx = self.events_tx.clone();
                    let delivered = Box::new(move || {
                        let _ = tx.send((Event::FenceDelivered { lock, token }, None));
                    });
                    self.deliver(
                        lock,
                        LockEvent::Fence {
                            token,
                            in_flight,
                            at,
                        },
                        Some(delivered),
                    );
                }
                Action::Acquired { lock, token } => {
                    touched.insert(lock);
                    self.last_error = None;
                    self.watch_key(lock, token);
                    self.deliver(lock, LockEvent::Acquired { token, at }, None);
                    if let Some(e) = self.locks.get_mut(&lock) {
                        e.call = None;
                        // Taken, not drained: a held lock keeps no capacity.
                        for w in e.take_acquires() {
                            w.send(Ok(token));
                        }
                    }
                }
                Action::AcquireFailed { lock, error } => {
                    touched.insert(lock);
                    let err = self.error_of(error);
                    if let Some(e) = self.locks.get_mut(&lock) {
                        for w in e.take_acquires() {
                            w.send(Err(err.clone()));
                        }
                    }
                }
                Action::AcquireRefused { lock, error } => {
                    let err = self.error_of(error);
                    if let Some(w) = self.locks.get_mut(&lock).and_then(Entry::pop_acquire) {
                        w.send(Err(err));
                    }
                }
                Action::Drained { lock } => {
                    touched.insert(lock);
                    self.deliver(lock, LockEvent::Drained { at }, None);
                }
            }
        }
        // Dropped handles are answered once their release is published;
        // releases with no key to delete (nothing held) are done now.
        finish(std::mem::take(&mut self.publish_acks));
        for lock in std::mem::take(&mut self.release_check) {
            if let Some(e) = self.locks.get_mut(&lock) {
                finish(e.take_releases());
            }
        }
        if !self.closes.is_empty() && self.machine.lease().is_none() {
            // Closed with no lease to revoke (or its revoke already sent:
            // the revoke's own task answered what it took): answered by a
            // fenced lease's revoke still held back, or the latest revoke
            // still on its first try, or now. So a process that exits once
            // closed right after a fence does not cut that revoke off.
            let closes = std::mem::take(&mut self.closes);
            self.revoking.retain(|w| waiters(w).is_some());
            if self.machine.held_revokes() > 0 {
                // A fenced lease's revoke waits for its work (§11 a): the
                // close waits for it, at most a keepalive timeout.
                let w: RevokeWaiters = Arc::new(std::sync::Mutex::new(Some(closes)));
                self.deferred.push(w.clone());
                let t = self.opts.keepalive_timeout;
                runtime().spawn(async move {
                    tokio::time::sleep(t).await;
                    if let Some(closes) = waiters(&w).take() {
                        finish(closes);
                    }
                });
            } else if let Some(w) = self.revoking.last() {
                match waiters(w).as_mut() {
                    Some(waiting) => waiting.extend(closes),
                    None => finish(closes),
                }
            } else {
                finish(closes);
            }
        }
    }

    fn unwatch(&mut self, lock: LockId) {
        if let Some(e) = self.locks.get_mut(&lock)
            && let Some(t) = e.watched.take()
        {
            if let Some((_, w)) = &self.watch {
                w.remove(t);
            }
            self.tokens.remove(&t);
        }
    }

    /// Watches the key of `lock`, held with `token` under the current lease.
    fn watch_key(&mut self, lock: LockId, token: Token) {
        let Some(lease) = self.machine.lease() else {
            return;
        };
        if self.watch.as_ref().is_none_or(|(l, _)| *l != lease) {
            self.watch = Some((lease, self.backend.watch_keys(lease, self.gone_tx.clone())));
            self.span.record("lease", lease);
        }
        let Some(e) = self.locks.get_mut(&lock) else {
            return;
        };
        if let Some(old) = e.watched.replace(token) {
            self.tokens.remove(&old);
        }
        self.tokens.insert(token, lock);
        if let Some((_, w)) = &self.watch {
            if let Some(name) = self.machine.name(lock) {
                w.add(&name, token);
            }
        }
    }

    fn error_of(&mut self, error: AcquireError) -> Error {
        match error {
            AcquireError::Timeout => Error::Timeout,
            AcquireError::WouldBlock => Error::WouldBlock,
            AcquireError::AlreadyHeld => Error::AlreadyHeld,
            AcquireError::Released => Error::Released,
            AcquireError::Backend => Error::Backend(match self.last_error.clone() {
                Some(e) => format!("the lock service failed: {e}"),
                None => "the lock service did not answer in time".into(),
            }),
        }
    }

    /// The counters of `Lock::stats()`.
    fn count(&self, lock: LockId, change: StateChange) {
        let Some(e) = self.locks.get(&lock) else {
            return;
        };
        let c = &e.gate.counters;
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

    fn deliver(&self, lock: LockId, event: LockEvent, then: Option<crate::callbacks::Job>) {
        match self.locks.get(&lock).and_then(|e| e.callbacks.as_ref()) {
            Some(callbacks) => callbacks.deliver(event, then),
            None => {
                if let Some(then) = then {
                    then();
                }
            }
        }
    }

    /// A guarded write: the machine says whether `token` is the one `lock`
    /// holds (and under which lease); the service then decides atomically.
    fn write(&mut self, now: Instant, lock: LockId, w: Write) {
        let (Some(lease), Some(e)) = (
            self.machine.write_lease(now, lock, w.token),
            self.locks.get(&lock),
        ) else {
            w.reply.send(Err(Error::Fenced(w.token.get())));
            return;
        };
        let _ = e;
        let name = self.machine.name(lock).expect("a lock of the machine");
        let (b, ttl) = (self.backend.clone(), self.opts.ttl);
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

    /// Deletes the key of `lock`; the `release()` calls waiting return once
    /// it is deleted, or after a keepalive timeout. A delete the service
    /// does not answer is tried again every retry interval until it does:
    /// a key left behind would block every other holder while the session
    /// lives. The machine hears `Unlocked` only once it is gone.
    fn unlock(
        &self,
        lock: LockId,
        req: crate::machine::ReqId,
        name: Arc<str>,
        lease: LeaseId,
        token: Option<Token>,
        mut done: Vec<Reply<()>>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (b, tx) = (self.backend.clone(), self.events_tx.clone());
        let (wait_for, retry) = (self.opts.keepalive_timeout, self.opts.retry_interval);
        async move {
            loop {
                let r = tokio::time::timeout(wait_for, b.unlock(&name, lease, token)).await;
                finish(std::mem::take(&mut done));
                match r {
                    Ok(Ok(())) | Ok(Err(BackendError::LeaseNotFound)) => {
                        let _ = tx.send((Event::Unlocked { req, lock }, None));
                        return;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(lock = %name, error = %e, "unlock failed; trying again")
                    }
                    Err(_) => tracing::debug!(lock = %name, "unlock unanswered; trying again"),
                }
                tokio::time::sleep(retry).await;
            }
        }
    }

    /// Revokes `lease`; `Session::close` calls waiting return once it is
    /// revoked, or after a keepalive timeout. A revoke the service does not
    /// answer is tried again every retry interval until it answers: a lease
    /// we know is ours and dead must never outlive an outage (etcd restores
    /// leases with a fresh TTL when it comes back).
    fn revoke(&mut self, lease: LeaseId) -> impl Future<Output = ()> + Send + 'static {
        // A lock's own release waits for its key's delete, not a revoke.
        let mut first = std::mem::take(&mut self.closes);
        for w in self.deferred.drain(..) {
            first.extend(waiters(&w).take().unwrap_or_default());
        }
        let done: RevokeWaiters = Arc::new(std::sync::Mutex::new(Some(first)));
        self.revoking.retain(|w| waiters(w).is_some());
        self.revoking.push(done.clone());
        let b = self.backend.clone();
        let (wait_for, retry) = (self.opts.keepalive_timeout, self.opts.retry_interval);
        async move {
            loop {
                let r = tokio::time::timeout(wait_for, b.revoke(lease)).await;
                if let Some(closes) = waiters(&done).take() {
                    finish(closes);
                }
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
}

impl Drop for SessionTask {
    /// A task dropped with watches armed (a runtime shutting down) leaves
    /// no entry behind for a permit to find.
    fn drop(&mut self) {
        for lock in &self.armed {
            if let Some(e) = self.locks.get(lock) {
                e.gate.unwatch_drain();
            }
        }
    }
}

/// The `Session::close` calls a revoke answers after its first try;
/// `None` once it did.
type RevokeWaiters = Arc<std::sync::Mutex<Option<Vec<Reply<()>>>>>;

fn waiters(w: &RevokeWaiters) -> std::sync::MutexGuard<'_, Option<Vec<Reply<()>>>> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

fn finish(done: Vec<Reply<()>>) {
    for d in done {
        d.send(());
    }
}
