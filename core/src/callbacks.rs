//! The application's side of a lock (docs/design.md §10, §16): its callbacks and
//! event streams, and the one thread that calls them.
//!
//! Every event of every lock is one [`Job`] on one process-wide callback
//! thread, so a lock's events arrive in order and a slow callback delays no
//! keepalive or fence timer. [`Callbacks::close`] is the lifecycle rule every
//! face relies on: once it returns, no callback of that lock runs again.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};

use crate::events::{EventStream, LockEvent, Queue};
use crate::machine::{StateChange, Token};

type EventFn = dyn Fn(&LockEvent) + Send + Sync;
type FenceFn = dyn Fn(Token, u64) + Send + Sync;
type StateFn = dyn Fn(StateChange) + Send + Sync;
type TokenFn = dyn Fn(Token) + Send + Sync;
type DrainedFn = dyn Fn() + Send + Sync;

/// A call to run on the callback thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

thread_local! {
    /// Set on the callback thread (for its whole life): callbacks run there
    /// and nowhere else.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// One lock's callbacks and streams. Each callback is cloned out of its slot
/// before it is called, so a callback may register another or call back
/// into the lock (even close it).
#[derive(Default)]
pub(crate) struct Callbacks {
    on_event: Slot<EventFn>,
    on_fence: Slot<FenceFn>,
    on_state_change: Slot<StateFn>,
    on_acquired: Slot<TokenFn>,
    on_drained: Slot<DrainedFn>,
    streams: Mutex<Vec<Arc<Queue>>>,
    /// A callback was set or a stream opened: events go to the callback
    /// thread (else they are not sent there at all).
    heard: AtomicBool,
    closed: AtomicBool,
    /// Held while a job of this lock runs, so `close` can wait for it.
    running: Mutex<()>,
}

pub(crate) struct Slot<T: ?Sized>(Mutex<Option<Arc<T>>>);

impl<T: ?Sized> Default for Slot<T> {
    fn default() -> Self {
        Slot(Mutex::new(None))
    }
}

impl<T: ?Sized> Slot<T> {
    fn get(&self) -> Option<Arc<T>> {
        crate::sync::lock(&self.0).clone()
    }

    fn set(&self, f: Arc<T>) {
        *crate::sync::lock(&self.0) = Some(f);
    }
}

/// Calls `f`, logging a panic instead of passing it on: a callback that
/// panics changes nothing about the lock.
fn guarded(what: &str, f: impl FnOnce()) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(f)) {
        let msg = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(callback = what, panic = %msg, "a dlock callback panicked; the lock goes on");
    }
}

impl Callbacks {
    fn set<T: ?Sized>(&self, slot: &Slot<T>, f: Arc<T>) {
        slot.set(f);
        self.heard.store(true, SeqCst);
    }

    pub(crate) fn on_event(&self, f: impl Fn(&LockEvent) + Send + Sync + 'static) {
        self.set(&self.on_event, Arc::new(f));
    }
    pub(crate) fn on_fence(&self, f: impl Fn(Token, u64) + Send + Sync + 'static) {
        self.set(&self.on_fence, Arc::new(f));
    }
    pub(crate) fn on_state_change(&self, f: impl Fn(StateChange) + Send + Sync + 'static) {
        self.set(&self.on_state_change, Arc::new(f));
    }
    pub(crate) fn on_acquired(&self, f: impl Fn(Token) + Send + Sync + 'static) {
        self.set(&self.on_acquired, Arc::new(f));
    }
    pub(crate) fn on_drained(&self, f: impl Fn() + Send + Sync + 'static) {
        self.set(&self.on_drained, Arc::new(f));
    }

    /// A new stream of this lock's events from now on; already ended if the
    /// lock is closed.
    pub(crate) fn stream(&self) -> EventStream {
        let queue = Arc::new(Queue::default());
        let mut streams = crate::sync::lock(&self.streams);
        if self.closed.load(SeqCst) {
            queue.end();
        } else {
            streams.push(queue.clone());
            self.heard.store(true, SeqCst);
        }
        EventStream { queue }
    }

    /// Delivers `event` on the callback thread, then runs `then` there
    /// (also once the lock is closed: the core's own follow-ups, such as
    /// telling the machine that `on_fence` returned, never depend on the
    /// application).
    pub(crate) fn deliver(self: &Arc<Self>, event: LockEvent, then: Option<Job>) {
        self.deliver_with(event, None, then);
    }

    /// [`Callbacks::deliver`], running `start` on the callback thread just
    /// before the event's callbacks (or at once when nobody listens): the
    /// moment `on_fence` starts, for the fence lateness.
    pub(crate) fn deliver_with(
        self: &Arc<Self>,
        event: LockEvent,
        start: Option<Job>,
        then: Option<Job>,
    ) {
        if !self.listened() {
            // Nobody to tell: no hop to the callback thread (nor its start).
            for job in [start, then].into_iter().flatten() {
                job();
            }
            return;
        }
        let me = self.clone();
        dispatch(Box::new(move || {
            {
                let _running = crate::sync::lock(&me.running);
                if let Some(start) = start {
                    start();
                }
                if !me.closed.load(SeqCst) {
                    me.call(&event);
                }
            }
            if let Some(then) = then {
                then();
            }
        }));
    }

    /// Whether a callback or a stream may see an event now.
    fn listened(&self) -> bool {
        self.heard.load(SeqCst) && !self.closed.load(SeqCst)
    }

    fn call(&self, event: &LockEvent) {
        if let Some(f) = self.on_event.get() {
            guarded("on_event", || f(event));
        }
        match *event {
            LockEvent::State { change, .. } => {
                if let Some(f) = self.on_state_change.get() {
                    guarded("on_state_change", || f(change));
                }
            }
            LockEvent::Fence {
                token, in_flight, ..
            } => {
                if let Some(f) = self.on_fence.get() {
                    guarded("on_fence", || f(token, in_flight));
                }
            }
            LockEvent::Acquired { token, .. } => {
                if let Some(f) = self.on_acquired.get() {
                    guarded("on_acquired", || f(token));
                }
            }
            LockEvent::Drained { .. } => {
                if let Some(f) = self.on_drained.get() {
                    guarded("on_drained", || f());
                }
            }
        }
        let mut streams = crate::sync::lock(&self.streams);
        streams.retain(|q| {
            q.push(*event);
            Arc::strong_count(q) > 1
        });
    }

    /// After this returns, no callback of this lock runs again and its
    /// streams end. Events already queued before the call are delivered
    /// first (a barrier on the callback thread), and a callback of this lock
    /// running now is waited for, except when called from a callback (which
    /// runs on the callback thread: waiting would deadlock) or in a forked
    /// child (no callback thread).
    pub(crate) fn close(&self) {
        // A lock nobody listened to has no job to wait for.
        let wait = self.listened() && !IN_CALLBACK.get() && !crate::forked();
        if wait {
            let (tx, rx) = std_mpsc::sync_channel::<()>(1);
            dispatch(Box::new(move || {
                let _ = tx.send(());
            }));
            let _ = rx.recv();
        }
        self.close_now();
        if wait {
            drop(self.running.lock());
        }
    }

    /// [`Callbacks::close`] without waiting for anything (on the driver's
    /// thread): no callback starts after this, one running may finish.
    pub(crate) fn close_now(&self) {
        self.closed.store(true, SeqCst);
        for q in crate::sync::lock(&self.streams).drain(..) {
            q.end();
        }
    }
}

/// Queues `job` on the callback thread, starting it on first use (in a
/// child of fork() that inherited no handle, its own). A forked child has
/// no callback thread and must not start one: there the job is dropped.
pub(crate) fn dispatch(job: Job) {
    static TX: crate::fork::PerFork<std_mpsc::Sender<Job>> = crate::fork::PerFork::new();
    if crate::forked() {
        return;
    }
    let tx = TX.get(std_mpsc::channel::<Job>, |rx| {
        std::thread::Builder::new()
            .name("dlock-callbacks".into())
            .spawn(move || {
                crate::signals::block_stop();
                IN_CALLBACK.set(true);
                for job in rx {
                    guarded("job", job);
                }
            })
            .expect("dlock: cannot spawn the callback thread");
    });
    let _ = tx.send(job);
}
