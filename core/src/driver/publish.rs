//! The pump's notices: what the machine decided, published to the gates
//! (the permit fast path), the counters and histograms, the log, and the
//! callback thread. Publishing only: nothing here decides.

use std::sync::atomic::Ordering::Relaxed;

use super::SessionTask;
use super::command::finish;
use super::waiters::Entry;
use crate::Error;
use crate::clock::Instant;
use crate::events::LockEvent;
use crate::machine::{Event, LockId, Notice, Reason, State, StateChange, Token};

impl SessionTask {
    pub(super) fn notice(&mut self, n: Notice, at: Instant) {
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

    pub(super) fn transition(&mut self, lock: LockId, change: StateChange, at: Instant) {
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

    pub(super) fn publish_deadline(&mut self) {
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

    pub(super) fn fence(&mut self, lock: LockId, token: Token, at: Instant) {
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

    pub(super) fn acquired(&mut self, lock: LockId, token: Token, at: Instant) {
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

    /// The counters of `Lock::stats()`.
    pub(super) fn count(&self, lock: LockId, change: StateChange) {
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
    pub(super) fn log(&self, lock: LockId, change: StateChange) {
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
    pub(super) fn time_hold(&self, lock: LockId, change: StateChange, at: Instant) {
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

    pub(super) fn publish(&self, lock: LockId) {
        if let Some(e) = self.locks.get(&lock) {
            let state = self.machine.state(lock);
            let token = self.machine.token(lock);
            let deadline = self.machine.deadline();
            e.gate.publish(state, token, deadline);
        }
    }

    pub(super) fn deliver(
        &self,
        lock: LockId,
        event: LockEvent,
        then: Option<crate::callbacks::Job>,
    ) {
        match self.locks.get(&lock).and_then(|e| e.callbacks.as_ref()) {
            Some(callbacks) => callbacks.deliver(event, then),
            None => {
                if let Some(then) = then {
                    then();
                }
            }
        }
    }
}
