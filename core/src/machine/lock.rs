//! One lock of the session (docs/design.md §5, §7, §9, §10): acquire and
//! its turn behind other locks of the same name, the lock service's
//! replies, the fence of one token, release, resignation and cancel.

use std::time::Duration;

use super::Holder;
use super::messages::{Notice, Request};
use super::records::Resigning;
use super::types::{AcquireError, LeaseId, LockId, Reason, ReqId, State, Token};
use crate::clock::Instant;

impl Holder {
    pub(super) fn on_acquire(
        &mut self,
        now: Instant,
        lock: LockId,
        wait: bool,
        until: Option<Instant>,
    ) {
        if self.closed {
            self.notice(Notice::AcquireRefused {
                lock,
                error: AcquireError::Released,
            });
            return;
        }
        match self.slot(lock).state {
            State::Idle | State::Released | State::Fenced => {
                let s = self.slot(lock);
                s.start_attempt(wait, until);
                self.transition(lock, State::Acquiring, Reason::Acquire);
                self.try_lock(now, lock);
            }
            // One acquire at a time per handle: the one in progress goes on.
            State::Acquiring | State::Holding | State::Draining => {
                self.notice(Notice::AcquireRefused {
                    lock,
                    error: AcquireError::AlreadyHeld,
                })
            }
            // The lock wants itself back anyway: wait for the reacquisition.
            State::Reacquiring => {}
        }
    }

    /// Sends the lock request of an acquiring `lock` if it can go now: a
    /// lease is there and no other lock of this session has the name's
    /// key (nor this one, still deleting its last key).
    pub(super) fn try_lock(&mut self, now: Instant, lock: LockId) {
        let Some(lease) = self.lease else {
            self.ensure_lease(now);
            return;
        };
        let s = &self.locks[&lock];
        if !s.acquiring() || s.lock_req.is_some() || s.acquire_retry_at.is_some() {
            return;
        }
        if let Some(&other) = self.keys.get(&s.name)
            && (other != lock || s.unlocking.is_some())
        {
            let (wait, state) = (s.wait, s.state);
            if other != lock && !wait && state == State::Acquiring {
                // `try_acquire`: held (or being taken) by this session.
                self.fail_acquire(lock, AcquireError::WouldBlock, Reason::WouldBlock);
            } else {
                self.slot(lock).queued = true;
            }
            return;
        }
        let req = self.req();
        let s = self.slot(lock);
        s.lock_req = Some(req);
        let (wait, name) = (s.wait || s.state == State::Reacquiring, s.name.clone());
        self.keys.insert(name, lock);
        self.request(Request::Lock {
            req,
            lock,
            lease,
            wait,
        });
    }

    /// Sends the lock requests that can go now: of the locks called `name`
    /// (a key just freed), or of every acquiring lock (a new lease).
    pub(super) fn send_waiting(&mut self, now: Instant, name: Option<&std::sync::Arc<str>>) {
        let ids: Vec<LockId> = self
            .pending
            .iter()
            .copied()
            .filter(|id| name.is_none_or(|n| self.locks[id].name == *n))
            .collect();
        for id in ids {
            self.try_lock(now, id);
        }
    }

    pub(super) fn on_locked(
        &mut self,
        now: Instant,
        req: ReqId,
        lock: LockId,
        lease: LeaseId,
        token: Token,
    ) {
        let current = self.lease == Some(lease);
        let mine = self
            .locks
            .get(&lock)
            .is_some_and(|s| s.lock_req == Some(req) && s.acquiring());
        if !mine || !current {
            if current
                && self
                    .locks
                    .get(&lock)
                    .is_some_and(|s| s.token == Some(token))
            {
                // A second reply to the acquisition held now: deleting its
                // key by token would take the lock from under it.
                tracing::debug!(lock, %token, "duplicate lock reply: ignored");
                return;
            }
            if current {
                // An acquisition given up on: delete its key, by token (a
                // later acquisition's key has a higher one).
                self.send_delete(lock, lease, Some(token));
            } else {
                self.revoke_stray(lease);
            }
            return;
        }
        let s = self.slot(lock);
        s.lock_req = None;
        s.queued = false;
        if s.last_token.is_some_and(|last| token <= last) {
            tracing::error!(%token, last = ?s.last_token, "lock service returned a token that is not higher; acquiring again");
            self.unlock_key(lock, lease, Some(token));
            return;
        }
        s.token = Some(token);
        s.last_token = Some(token);
        s.give_up_at = None;
        let reason = if s.state == State::Reacquiring {
            Reason::Reacquired
        } else {
            Reason::Acquired
        };
        self.transition(lock, State::Holding, reason);
        self.last_error = None;
        self.notice(Notice::Acquired { lock, token });
        if self.failing {
            self.transition(lock, State::Draining, Reason::KeepaliveFailed);
        }
        let _ = now;
    }

    pub(super) fn on_lock_failed(&mut self, now: Instant, req: ReqId, lock: LockId, busy: bool) {
        let Some(s) = self.locks.get_mut(&lock) else {
            return;
        };
        if s.lock_req != Some(req) || !s.acquiring() {
            return;
        }
        s.lock_req = None;
        if busy && !s.wait && s.state == State::Acquiring {
            self.fail_acquire(lock, AcquireError::WouldBlock, Reason::WouldBlock);
        } else if !s.wait && s.state == State::Acquiring {
            self.fail_acquire(
                lock,
                AcquireError::Backend(self.last_error.clone()),
                Reason::AcquireFailed,
            );
        } else {
            // The request may have put the key: trying again finds it.
            s.acquire_retry_at = Some(now + self.opts.retry_interval);
        }
    }

    /// A lock request the service can never take: a first acquisition
    /// fails at once; a reacquisition (the same request succeeded before)
    /// goes on as after any failure.
    pub(super) fn on_lock_refused(
        &mut self,
        now: Instant,
        req: ReqId,
        lock: LockId,
        error: String,
    ) {
        let Some(s) = self.locks.get_mut(&lock) else {
            return;
        };
        if s.lock_req != Some(req) || !s.acquiring() {
            return;
        }
        if s.state != State::Acquiring {
            return self.on_lock_failed(now, req, lock, false);
        }
        s.lock_req = None;
        self.fail_acquire(lock, AcquireError::Refused(error), Reason::AcquireFailed);
    }

    /// Deletes the key an acquisition of `lock` may have put under the
    /// current lease (a request cut short): the lock waits for the delete
    /// before asking again.
    pub(super) fn drop_key(&mut self, lock: LockId) {
        let Some(lease) = self.lease else { return };
        let name = self.locks[&lock].name.clone();
        if self.keys.get(&name) != Some(&lock) || self.locks[&lock].unlocking.is_some() {
            return;
        }
        self.unlock_key(lock, lease, None);
    }

    /// Deletes the key of `lock` under `lease` (with `token`, or whatever
    /// is there); the lock waits for [`Event::Unlocked`] before putting it
    /// again.
    pub(super) fn unlock_key(&mut self, lock: LockId, lease: LeaseId, token: Option<Token>) {
        if let Some(cut) = self.slot(lock).lock_req.take() {
            // Cut short: the request in flight is abandoned (the service
            // orders the delete after its put).
            self.request(Request::Abandon { req: cut });
        }
        let req = self.send_delete(lock, lease, token);
        self.slot(lock).unlocking = Some(req);
    }

    pub(super) fn fail_acquire(&mut self, lock: LockId, error: AcquireError, reason: Reason) {
        self.drop_key(lock);
        self.slot(lock).start_attempt(false, None);
        self.transition(lock, State::Idle, reason);
        self.notice(Notice::AcquireFailed { lock, error });
    }

    /// Fences the token `lock` holds; it acquires again if the options say
    /// so. The caller deals with the lease.
    pub(super) fn fence(&mut self, lock: LockId, reason: Reason) -> Option<Token> {
        let s = self.slot(lock);
        if !s.holding() {
            return None;
        }
        let token = s.token.take().expect("holding without a token");
        self.transition(lock, State::Fenced, reason);
        self.notice(Notice::Fence { lock, token });
        if self.opts.reacquire && !self.closed {
            // A reacquisition always waits its turn, with no deadline.
            self.slot(lock).start_attempt(true, None);
            self.transition(lock, State::Reacquiring, Reason::Reacquire);
        }
        Some(token)
    }

    /// The key of `lock` was deleted under a live lease: that lock alone
    /// fences and, if it acquires again, does so under the same lease.
    pub(super) fn on_lock_lost(&mut self, now: Instant, lock: LockId, token: Token) {
        let Some(s) = self.locks.get(&lock) else {
            return;
        };
        if !s.holding() || s.token != Some(token) {
            return;
        }
        let name = s.name.clone();
        self.fence(lock, Reason::LockLost);
        if self.keys.get(&name) == Some(&lock) {
            self.keys.remove(&name);
        }
        self.send_waiting(now, Some(&name));
    }

    pub(super) fn on_release(&mut self, now: Instant, lock: LockId) {
        let Some(s) = self.locks.get(&lock) else {
            return;
        };
        if s.state == State::Released {
            self.answer_releases(lock);
            return;
        }
        let (was_acquiring, token) = (s.acquiring(), s.token);
        let name = s.name.clone();
        let s = self.slot(lock);
        s.token = None;
        let wait = s.wait;
        s.start_attempt(wait, None);
        match (token, self.lease) {
            (Some(token), Some(lease)) if self.keys.get(&name) == Some(&lock) => {
                self.unlock_key(lock, lease, Some(token));
            }
            _ => self.drop_key(lock),
        }
        self.transition(lock, State::Released, Reason::Release);
        if was_acquiring {
            self.notice(Notice::AcquireFailed {
                lock,
                error: AcquireError::Released,
            });
        }
        self.answer_releases(lock);
        self.send_waiting(now, Some(&name));
    }

    /// Resigns `lock` (see [`Event::Resign`]): released at once for
    /// permits, its key deleted once the permits in flight end (reported by
    /// [`Event::PermitsEnded`]) or the grace ends. A lock not holding
    /// releases as [`Event::Release`] does.
    pub(super) fn on_resign(&mut self, now: Instant, lock: LockId, grace: Duration) {
        let Some(s) = self.locks.get(&lock) else {
            return;
        };
        let (Some(token), Some(lease), true, true) = (
            s.token,
            self.lease,
            s.holding(),
            self.keys.get(&s.name) == Some(&lock),
        ) else {
            return self.on_release(now, lock);
        };
        let s = self.slot(lock);
        s.token = None;
        let wait = s.wait;
        s.start_attempt(wait, None);
        s.resigning = Some(Resigning {
            lease,
            token,
            until: now + grace,
        });
        self.resigns.insert(lock);
        self.transition(lock, State::Released, Reason::Release);
        // Released stops permits; the driver reports when the last one in
        // flight ends (at once if none is).
        let s = self.slot(lock);
        s.watching = true;
        s.quiet = false;
    }

    /// The wait of a resignation is over: its key goes (kept only while
    /// the lease it was held under is the session's: else the key went
    /// with that lease).
    pub(super) fn resigned(&mut self, lock: LockId) {
        let Some(r) = self.locks.get_mut(&lock).and_then(|s| s.resigning.take()) else {
            return;
        };
        self.resigns.remove(&lock);
        if self.lease == Some(r.lease) {
            self.unlock_key(lock, r.lease, Some(r.token));
        } else {
            let name = self.locks[&lock].name.clone();
            if self.keys.get(&name) == Some(&lock) {
                self.keys.remove(&name);
            }
        }
        self.answer_releases(lock);
        let name = self.locks[&lock].name.clone();
        let now = self.now;
        self.send_waiting(now, Some(&name));
    }

    /// A cancelled acquisition leaves nothing held (docs/design.md §19): an
    /// acquisition in progress is cut short as a release would (§23: the
    /// key its request may have put is deleted); one that succeeded is
    /// released only while its token still holds (a later acquisition of
    /// the handle is not this one's to give up). A reacquisition is the
    /// lock's own: a caller waiting on it leaves, the lock goes on.
    pub(super) fn on_cancel(&mut self, now: Instant, lock: LockId, token: Option<Token>) {
        let Some(s) = self.locks.get(&lock) else {
            return;
        };
        let go = match token {
            None => s.state == State::Acquiring,
            Some(t) => s.holding() && s.token == Some(t),
        };
        if go {
            self.on_release(now, lock);
        }
    }
}
