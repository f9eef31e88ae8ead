//! The driver: a pump for the machine (docs/design.md §15, §19), shaped as
//! quinn's `ConnectionDriver`. It sends [`Holder`]'s requests, publishes its
//! notices, sleeps until its timer and hands events to the callback thread;
//! it decides nothing about leases, deadlines, tokens, retries, waits or
//! ordering: those are [`Holder`]'s.
//!
//! One background thread per process runs a current-thread tokio runtime,
//! created on first use. Each session has one task there that owns its
//! [`Holder`] (the lease and every lock of the session); backend calls run
//! as tasks of their own and report back by channel, so a hung request
//! never delays the deadline timer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc as std_mpsc;
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
    Bounds, Event, Holder, LeaseId, LockId, Notice, Reason, ReqId, Request, State, StateChange,
    Token,
};
use crate::{Error, Options};

/// The driver runtime's handle, creating the runtime thread on first use
/// (in a child of fork(), its own: the parent's thread did not follow it).
pub(crate) fn runtime() -> &'static tokio::runtime::Handle {
    static RT: crate::fork::PerFork<tokio::runtime::Handle> = crate::fork::PerFork::new();
    RT.get(
        || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("dlock: cannot build the driver runtime");
            (rt.handle().clone(), rt)
        },
        |rt| {
            std::thread::Builder::new()
                .name("dlock-driver".into())
                .spawn(move || {
                    block_signals();
                    ON_DRIVER.set(true);
                    rt.block_on(std::future::pending::<()>())
                })
                .expect("dlock: cannot spawn the driver thread");
        },
    )
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
/// The stop signals are blocked too ([`crate::signals::block_stop`]): their
/// handler waits for the driver, so it must never run on it.
pub(crate) fn block_signals() {
    // SAFETY: plain libc calls on a local, initialised signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    crate::signals::block_stop();
}

/// A completion run once on the callback thread.
pub(crate) type Then<T> = Box<dyn FnOnce(T) + Send>;

/// Where a caller waits for the outcome: a blocked thread, a future, or a
/// completion run on the callback thread (the faces' one form: no face
/// runs an executor).
pub(crate) enum Reply<T> {
    Blocking(std_mpsc::SyncSender<T>),
    Async(oneshot::Sender<T>),
    Then(Then<T>),
}

impl<T: Send + 'static> Reply<T> {
    pub(crate) fn send(self, r: T) {
        match self {
            Reply::Blocking(tx) => drop(tx.try_send(r)),
            Reply::Async(tx) => drop(tx.send(r)),
            Reply::Then(done) => crate::callbacks::dispatch(Box::new(move || done(r))),
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

/// What an acquisition's handle ([`crate::Acquisition`]) shares with the
/// driver: the token it won, once answered, so that a cancel after the
/// answer releases exactly that acquisition.
#[derive(Default)]
pub(crate) struct Ticket {
    won: std::sync::Mutex<Option<Token>>,
}

/// An acquire call waiting for its outcome.
struct Acquirer {
    reply: Reply<Result<Token, Error>>,
    /// Set for a cancellable acquisition.
    ticket: Option<Arc<Ticket>>,
    /// When it was asked, and where its wait is counted.
    since: Instant,
    clock: Clock,
    shared: Arc<Shared>,
}

impl Acquirer {
    fn send(self, r: Result<Token, Error>) {
        let waited = self.clock.now().saturating_since(self.since);
        self.shared.metrics.acquire_answered(&r, waited);
        if let (Some(t), Ok(token)) = (&self.ticket, &r) {
            *crate::sync::lock(&t.won) = Some(*token);
        }
        self.reply.send(r);
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
        /// Set for a cancellable acquisition.
        ticket: Option<Arc<Ticket>>,
    },
    /// An acquisition is cancelled: it leaves nothing held.
    Cancel {
        lock: LockId,
        ticket: Arc<Ticket>,
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
    /// The lock is an election's candidate: its key holds `value` (read at
    /// each acquisition, so a recampaign carries the last proclaimed one).
    Campaign {
        lock: LockId,
        value: Candidate,
    },
    /// Puts the candidate's value, guarded by `token` (see
    /// [`Backend::proclaim`]).
    Proclaim {
        lock: LockId,
        token: Token,
        value: Vec<u8>,
        reply: Reply<Result<(), Error>>,
    },
    /// Resigns: as a release, but the key's delete waits for the permits
    /// in flight, up to `grace` (the machine's timer).
    Resign {
        lock: LockId,
        grace: Duration,
        done: Reply<()>,
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
    /// Histograms and keepalive results for `Client::snapshot`.
    pub(crate) metrics: Arc<crate::metrics::SessionMetrics>,
}

/// A backend call in flight, to drop when the machine abandons it or a new
/// try replaces it: requests by id, revokes by lease.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
enum Call {
    Req(ReqId),
    Revoke(LeaseId),
}

/// Starts the task of one session; it ends once every handle is gone and
/// the machine has nothing left to do (a held revoke, a key to delete).
pub(crate) fn spawn_session(
    backend: Arc<dyn Backend>,
    opts: Options,
    clock: Clock,
    shared: Arc<Shared>,
    drained: Arc<Notify>,
) -> mpsc::UnboundedSender<Command> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (replies_tx, replies) = mpsc::unbounded_channel();
    let (gone_tx, gone) = mpsc::unbounded_channel();
    let span = tracing::info_span!("dlock_session", lease = tracing::field::Empty);
    let task = SessionTask {
        ttl: opts.ttl,
        machine: Holder::new(opts),
        clock,
        shared,
        drained,
        backend,
        replies_tx,
        gone_tx,
        locks: BTreeMap::new(),
        armed: BTreeSet::new(),
        dropped: BTreeSet::new(),
        watch: None,
        calls: HashMap::new(),
        closes: HashMap::new(),
        next_close: 0,
        publish_acks: Vec::new(),
        touched: BTreeSet::new(),
        published_deadline: None,
        span: span.clone(),
    };
    runtime().spawn(task.run(rx, replies, gone).instrument(span));
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
    /// The token whose key is watched.
    watched: Option<Token>,
    /// An election's value: its key is put holding it.
    candidate: Option<Candidate>,
}

/// The value an election's candidate key holds, shared with its handle.
pub(crate) type Candidate = Arc<std::sync::Mutex<Vec<u8>>>;

/// The calls waiting on one lock.
#[derive(Default)]
struct Waiting {
    acquires: Vec<Acquirer>,
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

    fn take_acquires(&mut self) -> Vec<Acquirer> {
        let taken = self
            .waiting
            .as_mut()
            .map(|w| std::mem::take(&mut w.acquires))
            .unwrap_or_default();
        self.tidy();
        taken
    }

    fn pop_acquire(&mut self) -> Option<Acquirer> {
        let popped = self.waiting.as_mut().and_then(|w| w.acquires.pop());
        self.tidy();
        popped
    }

    /// The waiting acquire call of `ticket`, taken out of the queue.
    fn remove_acquire(&mut self, ticket: &Arc<Ticket>) -> Option<Acquirer> {
        let w = self.waiting.as_mut()?;
        let i = w
            .acquires
            .iter()
            .position(|a| a.ticket.as_ref().is_some_and(|t| Arc::ptr_eq(t, ticket)))?;
        let taken = w.acquires.remove(i);
        self.tidy();
        Some(taken)
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

/// The pump of one session (quinn's `ConnectionDriver`): feeds the machine
/// what happens, sends its requests, publishes its notices. Every timing
/// rule is the machine's.
struct SessionTask {
    machine: Holder,
    /// Bound of a guarded write's reply.
    ttl: Duration,
    clock: Clock,
    shared: Arc<Shared>,
    drained: Arc<Notify>,
    backend: Arc<dyn Backend>,
    /// Replies of backend calls, and the callback thread's reports.
    replies_tx: mpsc::UnboundedSender<(Option<Call>, Event)>,
    gone_tx: mpsc::UnboundedSender<KeyGone>,
    locks: BTreeMap<LockId, Entry>,
    /// Locks whose gate's drain watch is armed.
    armed: BTreeSet<LockId>,
    /// Locks whose handle is gone: forgotten once the machine is done.
    dropped: BTreeSet<LockId>,
    /// The key watch of the current lease.
    watch: Option<(LeaseId, Box<dyn KeyWatch>)>,
    calls: HashMap<Call, AbortHandle>,
    /// `Session::close` calls waiting, by the machine's waiter id.
    closes: HashMap<u64, Reply<()>>,
    next_close: u64,
    /// Dropped handles, answered once their release is published.
    publish_acks: Vec<Reply<()>>,
    /// Locks an event or notice named since the last step.
    touched: BTreeSet<LockId>,
    published_deadline: Option<Instant>,
    span: tracing::Span,
}

impl SessionTask {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut replies: mpsc::UnboundedReceiver<(Option<Call>, Event)>,
        mut gone: mpsc::UnboundedReceiver<KeyGone>,
    ) {
        let clock = self.clock.clone();
        let drained = self.drained.clone();
        let mut open = true;
        loop {
            self.step();
            // Every handle gone: done once nothing is left to do.
            if !open && self.machine.idle() {
                return;
            }
            let timer = self.machine.poll_timeout();
            tokio::select! {
                biased;
                cmd = commands.recv(), if open => match cmd {
                    None => {
                        open = false;
                        self.machine.handle(clock.now(), Event::Close { waiter: None });
                    }
                    Some(cmd) => self.command(clock.now(), cmd),
                },
                Some((call, ev)) = replies.recv() => self.reply(call, ev),
                Some(g) = gone.recv() => self.key_gone(g),
                _ = drained.notified(), if !self.armed.is_empty() => self.permits_ended(),
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
                let e = Entry {
                    gate,
                    callbacks: None,
                    waiting: None,
                    watched: None,
                    candidate: None,
                };
                self.locks.insert(lock, e);
            }
            Command::Acquire {
                lock,
                wait,
                timeout,
                reply,
                ticket,
            } => {
                let Some(e) = self.locks.get_mut(&lock) else {
                    return reply.send(Err(Error::Released));
                };
                e.waiting().acquires.push(Acquirer {
                    reply,
                    ticket,
                    since: now,
                    clock: self.clock.clone(),
                    shared: self.shared.clone(),
                });
                let until = timeout.map(|t| now + t);
                self.machine
                    .handle(now, Event::Acquire { lock, wait, until });
            }
            Command::Release { lock, done } => self.release(now, lock, Some(done), None),
            Command::Drop { lock, published } => self.release(now, lock, None, Some(published)),
            Command::Write { lock, write } => self.write(now, lock, write),
            Command::Campaign { lock, value } => {
                if let Some(e) = self.locks.get_mut(&lock) {
                    e.candidate = Some(value);
                }
            }
            Command::Proclaim {
                lock,
                token,
                value,
                reply,
            } => self.proclaim(now, lock, token, value, reply),
            Command::Resign { lock, grace, done } => {
                let Some(e) = self.locks.get_mut(&lock) else {
                    return done.send(());
                };
                e.waiting().releases.push(done);
                self.touched.insert(lock);
                self.machine.handle(now, Event::Resign { lock, grace });
            }
            Command::Cancel { lock, ticket } => self.cancel(now, lock, ticket),
            Command::Close { done } => {
                let waiter = self.next_close;
                self.next_close += 1;
                self.closes.insert(waiter, done);
                let waiter = Some(waiter);
                self.machine.handle(now, Event::Close { waiter });
            }
        }
    }

    /// A release (`done`: answered once the key's delete had its first
    /// try) or a dropped handle (`published`: answered once the release is
    /// published, so permits report invalid before the drop returns).
    fn release(
        &mut self,
        now: Instant,
        lock: LockId,
        done: Option<Reply<()>>,
        published: Option<Reply<()>>,
    ) {
        let Some(e) = self.locks.get_mut(&lock) else {
            finish(done.into_iter().chain(published).collect());
            return;
        };
        if let Some(done) = done {
            e.waiting().releases.push(done);
        }
        if let Some(published) = published {
            self.publish_acks.push(published);
            self.dropped.insert(lock);
        }
        self.touched.insert(lock);
        self.machine.handle(now, Event::Release { lock });
    }

    /// A cancelled acquisition: a call still waiting is answered `Released`
    /// and its acquisition cut short; one answered already gives up the
    /// token it won. The machine decides what is held (§19, §23).
    fn cancel(&mut self, now: Instant, lock: LockId, ticket: Arc<Ticket>) {
        let Some(e) = self.locks.get_mut(&lock) else {
            return;
        };
        let token = match e.remove_acquire(&ticket) {
            Some(waiting) => {
                waiting.send(Err(Error::Released));
                None
            }
            None => match *crate::sync::lock(&ticket.won) {
                Some(t) => Some(t),
                // Failed already: nothing is held.
                None => return,
            },
        };
        self.touched.insert(lock);
        self.machine.handle(now, Event::Cancel { lock, token });
    }

    /// A backend call's reply, or the callback thread's report.
    fn reply(&mut self, call: Option<Call>, ev: Event) {
        if let Some(call) = call {
            self.calls.remove(&call);
        }
        if let Event::Unlocked { lock, .. } | Event::FenceDelivered { lock, .. } = ev {
            self.touched.insert(lock);
        }
        self.machine.handle(self.clock.now(), ev);
    }

    /// The last permit of some watched lock ended: which?
    fn permits_ended(&mut self) {
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
            self.machine
                .handle(self.clock.now(), Event::PermitsEnded { lock });
        }
    }

    /// A watched key went: the lock alone (deleted) or with the lease.
    fn key_gone(&mut self, g: KeyGone) {
        let Some(lock) = self
            .locks
            .iter()
            .find(|(_, e)| e.watched == Some(g.token))
            .map(|(id, _)| *id)
        else {
            return;
        };
        let now = self.clock.now();
        tracing::warn!(lock = ?self.machine.name(lock), token = %g.token, why = ?g.why, "the lock key is gone");
        let ev = match (g.why, self.watch.as_ref()) {
            (LockGone::KeyDeleted, _) => Event::LockLost {
                lock,
                token: g.token,
            },
            (LockGone::LeaseLost, Some((lease, _))) => Event::LeaseLost { lease: *lease },
            (LockGone::LeaseLost, None) => return,
        };
        self.machine.handle(now, ev);
    }

    /// Pumps the machine until it is quiet: its notices, then its
    /// requests, then the drain watches it asks for; then forgets the
    /// dropped locks it is done with.
    fn step(&mut self) {
        loop {
            self.pump();
            if !self.arm_drain_watches() {
                break;
            }
        }
        self.forget_finished();
    }

    fn pump(&mut self) {
        let at = self.clock.now();
        let lease = self.machine.lease();
        self.shared.lease.store(lease.unwrap_or(0), Relaxed);
        // The key watch belongs to one lease.
        if self.watch.as_ref().is_some_and(|(l, _)| Some(*l) != lease) {
            self.watch = None;
        }
        // Published before anything is sent: a permit never outlives the
        // key's delete.
        while let Some(n) = self.machine.poll_notice() {
            self.notice(n, at);
        }
        while let Some(r) = self.machine.poll_request() {
            self.request(r);
        }
        finish(std::mem::take(&mut self.publish_acks));
    }

    /// Arms or disarms the gates' drain watches the machine asks for;
    /// whether it told the machine something (then pump again).
    fn arm_drain_watches(&mut self) -> bool {
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
        again
    }

    /// Forgets the dropped locks the machine is done with.
    fn forget_finished(&mut self) {
        let touched = std::mem::take(&mut self.touched);
        let done: Vec<LockId> = touched
            .into_iter()
            .filter(|id| self.dropped.contains(id) && self.machine.finished(*id))
            .collect();
        for lock in done {
            self.machine.remove_lock(lock);
            self.dropped.remove(&lock);
            if let Some(e) = self.locks.remove(&lock) {
                if self.armed.remove(&lock) {
                    e.gate.unwatch_drain();
                }
                self.shared.locks.fetch_sub(1, Relaxed);
            }
        }
    }

    fn notice(&mut self, n: Notice, at: Instant) {
        match n {
            Notice::Transition { lock, change } => self.transition(lock, change, at),
            Notice::Deadline => self.publish_deadline(),
            Notice::Fence { lock, token } => self.fence(lock, token, at),
            Notice::Acquired { lock, token } => self.acquired(lock, token, at),
            Notice::AcquireFailed { lock, error } => {
                self.touched.insert(lock);
                let err = Error::from(error);
                if let Some(e) = self.locks.get_mut(&lock) {
                    for w in e.take_acquires() {
                        w.send(Err(err.clone()));
                    }
                }
            }
            Notice::AcquireRefused { lock, error } => {
                if let Some(w) = self.locks.get_mut(&lock).and_then(Entry::pop_acquire) {
                    w.send(Err(error.into()));
                }
            }
            Notice::Drained { lock } => {
                self.touched.insert(lock);
                self.deliver(lock, LockEvent::Drained { at }, None);
            }
            Notice::ReleaseDone { lock } => {
                if let Some(e) = self.locks.get_mut(&lock) {
                    finish(e.take_releases());
                }
            }
            Notice::CloseDone { waiter } => {
                if let Some(done) = self.closes.remove(&waiter) {
                    done.send(());
                }
            }
        }
    }

    fn transition(&mut self, lock: LockId, change: StateChange, at: Instant) {
        self.touched.insert(lock);
        self.publish(lock);
        self.count(lock, change);
        self.time_hold(lock, change, at);
        self.log(lock, change);
        if !matches!(change.to, State::Holding | State::Draining) {
            self.unwatch(lock);
        }
        self.deliver(lock, LockEvent::State { change, at }, None);
    }

    fn publish_deadline(&mut self) {
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

    fn fence(&mut self, lock: LockId, token: Token, at: Instant) {
        self.touched.insert(lock);
        let Some(e) = self.locks.get(&lock) else {
            return;
        };
        let in_flight = e.gate.in_flight();
        let deadline = Instant::from_nanos(e.gate.metrics.deadline.load(Relaxed));
        let late = self.clock.now().saturating_since(deadline);
        tracing::warn!(lock = ?self.machine.name(lock), %token, in_flight, late = ?late, "fenced");
        // The lateness is `on_fence` start − deadline: stamped on the
        // callback thread as the fence's callbacks begin.
        let (shared, clock) = (self.shared.clone(), self.clock.clone());
        let started: crate::callbacks::Job = Box::new(move || {
            let late = clock.now().saturating_since(deadline);
            shared.metrics.fence_lateness.observe(late);
        });
        // The machine holds the lease's revoke until on_fence has
        // returned: say so from the callback thread.
        let tx = self.replies_tx.clone();
        let delivered = Box::new(move || {
            let ev = Event::FenceDelivered { lock, token };
            let _ = tx.send((None, ev));
        });
        let fence = LockEvent::Fence {
            token,
            in_flight,
            at,
        };
        match self.locks.get(&lock).and_then(|e| e.callbacks.as_ref()) {
            Some(callbacks) => callbacks.deliver_with(fence, Some(started), Some(delivered)),
            None => {
                started();
                delivered();
            }
        }
    }

    fn acquired(&mut self, lock: LockId, token: Token, at: Instant) {
        self.touched.insert(lock);
        self.watch_key(lock, token);
        self.deliver(lock, LockEvent::Acquired { token, at }, None);
        if let Some(e) = self.locks.get_mut(&lock) {
            // Taken, not drained: a held lock keeps no capacity.
            for w in e.take_acquires() {
                w.send(Ok(token));
            }
        }
    }

    fn request(&mut self, r: Request) {
        match r {
            Request::Grant { req, ttl, bounds } => self.grant(req, ttl, bounds),
            Request::Lock {
                req,
                lock,
                lease,
                wait,
            } => self.lock(req, lock, lease, wait),
            Request::Unlock {
                req,
                lock,
                lease,
                token,
            } => self.unlock(req, lock, lease, token),
            Request::Keepalive { req, lease, bounds } => self.keepalive(req, lease, bounds),
            Request::Revoke { lease } => self.revoke(lease),
            Request::Abandon { req } => {
                if let Some(call) = self.calls.remove(&Call::Req(req)) {
                    call.abort();
                }
            }
        }
    }

    /// Runs one backend call as its own task (a hung request never delays
    /// the machine's timers) and feeds its reply back; a call of the same
    /// name still in flight (an earlier try) is dropped.
    fn spawn_call(&mut self, call: Call, reply: impl Future<Output = Event> + Send + 'static) {
        let tx = self.replies_tx.clone();
        let task = runtime().spawn(
            async move {
                let _ = tx.send((Some(call), reply.await));
            }
            .instrument(self.span.clone()),
        );
        if let Some(earlier) = self.calls.insert(call, task.abort_handle()) {
            earlier.abort();
        }
    }

    fn grant(&mut self, req: ReqId, ttl: Duration, bounds: Bounds) {
        let b = self.backend.clone();
        self.spawn_call(Call::Req(req), async move {
            match b.grant(ttl, bounds).await {
                Ok(g) => Event::LeaseGranted {
                    req,
                    lease: g.lease,
                    ttl: g.ttl,
                },
                Err(e) => {
                    tracing::debug!(error = %e, "lease grant failed");
                    let error = e.to_string();
                    Event::GrantFailed { req, error }
                }
            }
        });
    }

    fn keepalive(&mut self, req: ReqId, lease: LeaseId, bounds: Bounds) {
        let (b, clock) = (self.backend.clone(), self.clock.clone());
        let shared = self.shared.clone();
        shared.keepalives.fetch_add(1, Relaxed);
        self.spawn_call(Call::Req(req), async move {
            let sent = clock.now();
            match b.keepalive(lease, bounds).await {
                Ok(ttl) => {
                    let rtt = clock.now().saturating_since(sent);
                    let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
                    shared.last_rtt_ns.store(ns.max(1), Relaxed);
                    shared.metrics.keepalive_rtt.observe(rtt);
                    shared.metrics.keepalives_ok.fetch_add(1, Relaxed);
                    Event::KeepaliveConfirmed { req, ttl }
                }
                Err(BackendError::LeaseNotFound) => {
                    shared.metrics.keepalives_lease_lost.fetch_add(1, Relaxed);
                    Event::LeaseLost { lease }
                }
                Err(e) => {
                    shared.metrics.keepalives_failed.fetch_add(1, Relaxed);
                    tracing::debug!(error = %e, "keepalive failed");
                    Event::KeepaliveFailed { req }
                }
            }
        });
    }

    fn lock(&mut self, req: ReqId, lock: LockId, lease: LeaseId, wait: bool) {
        let Some(name) = self.machine.name(lock) else {
            return;
        };
        let b = self.backend.clone();
        let value = self
            .locks
            .get(&lock)
            .and_then(|e| e.candidate.as_ref())
            .map(|v| crate::sync::lock(v).clone());
        self.spawn_call(Call::Req(req), async move {
            let locked = match &value {
                Some(v) => b.campaign(&name, lease, v, wait).await,
                None => b.lock(&name, lease, wait).await,
            };
            match locked {
                Ok(token) => Event::Locked {
                    req,
                    lock,
                    lease,
                    token,
                },
                Err(BackendError::LeaseNotFound) => Event::LeaseLost { lease },
                Err(BackendError::TooLarge(error)) => Event::LockRefused { req, lock, error },
                Err(e) => Event::LockFailed {
                    req,
                    lock,
                    busy: e == BackendError::Busy,
                    error: e.to_string(),
                },
            }
        });
    }

    /// One try of deleting the key of `lock` (the machine tries again until
    /// one is answered).
    fn unlock(&mut self, req: ReqId, lock: LockId, lease: LeaseId, token: Option<Token>) {
        // A stray reply's delete names an older token: the current one
        // stays watched.
        if token.is_none() || self.locks.get(&lock).is_some_and(|e| e.watched == token) {
            self.unwatch(lock);
        }
        let Some(name) = self.machine.name(lock) else {
            return;
        };
        let b = self.backend.clone();
        self.spawn_call(Call::Req(req), async move {
            match b.unlock(&name, lease, token).await {
                Ok(()) | Err(BackendError::LeaseNotFound) => Event::Unlocked { req, lock },
                Err(e) => {
                    tracing::debug!(lock = %name, error = %e, "unlock failed; trying again");
                    Event::UnlockFailed { req }
                }
            }
        });
    }

    /// One try of revoking `lease` (the machine tries again until one is
    /// answered).
    fn revoke(&mut self, lease: LeaseId) {
        if self.watch.as_ref().is_some_and(|(l, _)| *l == lease) {
            self.watch = None;
        }
        // A held revoke let go: its dropped locks may be done.
        self.touched.extend(self.dropped.iter().copied());
        let b = self.backend.clone();
        self.spawn_call(Call::Revoke(lease), async move {
            match b.revoke(lease).await {
                Ok(()) | Err(BackendError::LeaseNotFound) => Event::Revoked { lease },
                Err(e) => {
                    tracing::debug!(lease, error = %e, "revoke failed; trying again");
                    Event::RevokeFailed { lease }
                }
            }
        });
    }

    fn unwatch(&mut self, lock: LockId) {
        if let Some(e) = self.locks.get_mut(&lock)
            && let Some(t) = e.watched.take()
            && let Some((_, w)) = &self.watch
        {
            w.remove(t);
        }
    }

    /// Watches the key of `lock`, held with `token` under the current lease.
    fn watch_key(&mut self, lock: LockId, token: Token) {
        let Some(lease) = self.machine.lease() else {
            return;
        };
        if self.watch.as_ref().is_none_or(|(l, _)| *l != lease) {
            let (bounds, gone) = (self.machine.bounds(), self.gone_tx.clone());
            self.watch = Some((lease, self.backend.watch_keys(lease, bounds, gone)));
            self.span.record("lease", lease);
        }
        let Some(e) = self.locks.get_mut(&lock) else {
            return;
        };
        e.watched = Some(token);
        if let (Some((_, w)), Some(name)) = (&self.watch, self.machine.name(lock)) {
            w.add(&name, token);
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

    /// One event per transition an operator cares about (docs/metrics.md):
    /// holds begin and resume at INFO, drains and fences at WARN.
    fn log(&self, lock: LockId, change: StateChange) {
        let Some(e) = self.locks.get(&lock) else {
            return;
        };
        let name = self.machine.name(lock);
        let in_flight = e.gate.in_flight();
        match (change.to, change.reason) {
            (State::Holding, Reason::Resumed) => {
                tracing::info!(lock = ?name, in_flight, "resumed");
            }
            (State::Holding, _) => {
                let token = self.machine.token(lock).map_or(0, |t| t.0);
                tracing::info!(lock = ?name, token, reason = ?change.reason, "acquired");
            }
            (State::Draining, _) => tracing::warn!(lock = ?name, in_flight, "draining"),
            (State::Fenced, reason) => {
                tracing::warn!(lock = ?name, in_flight, ?reason, "fence decided");
            }
            _ => {}
        }
    }

    /// The hold-duration histogram: a hold runs from an acquisition until
    /// the lock is fenced, released or idle again.
    fn time_hold(&self, lock: LockId, change: StateChange, at: Instant) {
        let Some(e) = self.locks.get(&lock) else {
            return;
        };
        let since = &e.gate.metrics.held_since;
        match change.to {
            State::Holding if matches!(change.reason, Reason::Acquired | Reason::Reacquired) => {
                since.store(at.as_nanos().max(1), Relaxed);
            }
            State::Fenced | State::Released | State::Idle => {
                let t = since.swap(0, Relaxed);
                if t != 0 {
                    let held = at.saturating_since(Instant::from_nanos(t));
                    self.shared.metrics.hold.observe(held);
                }
            }
            _ => {}
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
        let (Some(lease), Some(name)) = (
            self.machine.write_lease(now, lock, w.token),
            self.machine.name(lock),
        ) else {
            w.reply.send(Err(Error::Fenced(w.token.get())));
            return;
        };
        let (b, ttl) = (self.backend.clone(), self.ttl);
        runtime().spawn(
            async move {
                let write = b.guarded_write(&name, lease, w.token, &w.key, w.value.as_deref());
                let r = match tokio::time::timeout(ttl, write).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(BackendError::Fenced)) => Err(Error::Fenced(w.token.get())),
                    Ok(Err(BackendError::TooLarge(m))) => Err(Error::InvalidArgument(format!(
                        "guarded write: the service refused it as too large (nothing written): {m}"
                    ))),
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
}

impl SessionTask {
    /// A proclaim: the machine says whether `token` is held (and under
    /// which lease); the service then decides atomically.
    fn proclaim(
        &mut self,
        now: Instant,
        lock: LockId,
        token: Token,
        value: Vec<u8>,
        reply: Reply<Result<(), Error>>,
    ) {
        let (Some(lease), Some(name)) = (
            self.machine.write_lease(now, lock, token),
            self.machine.name(lock),
        ) else {
            let error = match self.machine.state(lock) {
                crate::State::Fenced | crate::State::Reacquiring => Error::Fenced(token.get()),
                _ => Error::NotHeld,
            };
            reply.send(Err(error));
            return;
        };
        let candidate = self.locks.get(&lock).and_then(|e| e.candidate.clone());
        let (b, ttl) = (self.backend.clone(), self.ttl);
        runtime().spawn(
            async move {
                let r = match tokio::time::timeout(ttl, b.proclaim(&name, lease, token, &value))
                    .await
                {
                    Ok(Ok(())) => {
                        if let Some(c) = candidate {
                            *crate::sync::lock(&c) = value;
                        }
                        Ok(())
                    }
                    Ok(Err(BackendError::Fenced)) => Err(Error::Fenced(token.get())),
                    Ok(Err(BackendError::TooLarge(m))) => Err(Error::InvalidArgument(format!(
                        "proclaim: the service refused it as too large (nothing written): {m}"
                    ))),
                    Ok(Err(e)) => Err(Error::Backend(format!(
                        "proclaim: {e} (the outcome is unknown: it may have committed)"
                    ))),
                    Err(_) => Err(Error::Backend(
                        "proclaim: no answer within the TTL (the outcome is unknown)".into(),
                    )),
                };
                reply.send(r);
            }
            .instrument(self.span.clone()),
        );
    }
}

impl Drop for SessionTask {
    /// A task dropped with watches armed (a runtime shutting down) leaves
    /// no entry behind for a permit to find; its calls in flight end.
    fn drop(&mut self) {
        for lock in &self.armed {
            if let Some(e) = self.locks.get(lock) {
                e.gate.unwatch_drain();
            }
        }
    }
}

fn finish(done: Vec<Reply<()>>) {
    for d in done {
        d.send(());
    }
}
