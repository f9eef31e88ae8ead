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
//!
//! Layout: the session's task and its loop stand here; its backend calls
//! (`calls`) and the publishing of the machine's notices (`publish`) are
//! its other two halves. Beneath them: the runtime thread (`runtime`), the
//! commands and replies the handles exchange with the task (`command`),
//! and the calls waiting on a lock (`waiters`). Imports run one way: the
//! halves read this file and the leaves, this file reads only the leaves.

mod calls;
mod command;
mod publish;
mod runtime;
mod waiters;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;
use tracing::Instrument;

use command::{Call, finish};
pub(crate) use command::{Candidate, Command, Reply, Ticket, Write};
pub(crate) use runtime::{block_on, on_driver, on_driver_thread, on_driver_until_dropped, runtime};
use waiters::{Acquirer, Entry};

use crate::backend::{Backend, KeyGone, KeyWatch, LockGone};
use crate::clock::{Clock, Instant};
use crate::identity::Identity;
use crate::machine::{Event, Holder, LeaseId, LockId};
use crate::metrics::Shared;
use crate::{Error, Options};

/// Starts the task of one session; it ends once every handle is gone and
/// the machine has nothing left to do (a held revoke, a key to delete).
pub(crate) fn spawn_session(
    backend: Arc<dyn Backend>,
    opts: Options,
    clock: Clock,
    shared: Arc<Shared>,
    drained: Arc<Notify>,
    identity: Option<Arc<Identity>>,
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
        identity,
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
        cancelled: Vec::new(),
        touched: BTreeSet::new(),
        published_deadline: None,
        span: span.clone(),
    };
    runtime().spawn(task.run(rx, replies, gone).instrument(span));
    tx
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
    /// Written beside each lease this session is granted (none: not
    /// recorded).
    identity: Option<Arc<Identity>>,
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
    /// Cancelled waits, answered `Released` once the state their cancel
    /// led to is published: a caller reading the state on the answer sees
    /// it (Python's cancelled `acquire_async` read `Acquiring` under load).
    cancelled: Vec<Acquirer>,
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
            Command::Downgrade { lock, token, reply } => self.downgrade(now, lock, token, reply),
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
                self.cancelled.push(waiting);
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
        for waiting in std::mem::take(&mut self.cancelled) {
            waiting.send(Err(Error::Released));
        }
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
