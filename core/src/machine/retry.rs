//! Requests tried until answered (docs/design.md §10, §11): key deletes
//! and lease revokes retried every retry interval, the `release()` and
//! `close()` calls that wait for their first try, and the revoke of a
//! fenced lease held until `on_fence` has returned and the last permit in
//! flight has ended (or the server's expiry has surely passed).

use super::Holder;
use super::messages::{Notice, Request};
use super::records::{CloseOn, Delete, Revoking, Try};
use super::types::{LeaseId, LockId, ReqId, Token};
use crate::clock::Instant;

impl Holder {
    /// Sends the delete of `lock`'s key under `lease` (with `token`, or
    /// whatever is there), tried until answered (§10: a key left behind
    /// would block every other holder while the session lives).
    pub(super) fn send_delete(
        &mut self,
        lock: LockId,
        lease: LeaseId,
        token: Option<Token>,
    ) -> ReqId {
        let req = self.req();
        self.deletes.push(Delete {
            req,
            lock,
            lease,
            token,
            tries: Try::sent(self.now, self.opts.keepalive_timeout),
        });
        self.request(Request::Unlock {
            req,
            lock,
            lease,
            token,
        });
        req
    }

    /// A try of the delete `req` failed: again after the retry interval.
    pub(super) fn delete_failed(&mut self, now: Instant, req: ReqId) {
        let retry = self.opts.retry_interval;
        let Some(d) = self
            .deletes
            .iter_mut()
            .find(|d| d.req == req && d.tries.until.is_some())
        else {
            return;
        };
        let lock = d.lock;
        if d.tries.failed(now, retry) {
            self.answer_releases(lock);
        }
    }

    /// The `release()` calls of `lock` are answered once no delete of its
    /// key is on its first try.
    pub(super) fn answer_releases(&mut self, lock: LockId) {
        if self.locks.get(&lock).is_some_and(|s| s.resigning.is_some()) {
            return;
        }
        if !self.deletes.iter().any(|d| d.lock == lock && d.tries.first) {
            self.notice(Notice::ReleaseDone { lock });
        }
    }

    /// Revokes `lease`, tried until answered (§10: a lease we know is
    /// ours and dead must never outlive an outage: etcd restores leases
    /// with a fresh TTL when it comes back). Closes waiting for a held
    /// revoke wait for this one's first try instead.
    pub(super) fn send_revoke(&mut self, lease: LeaseId) {
        if self.revokes.iter().any(|r| r.lease == lease) {
            return;
        }
        self.revokes.push(Revoking {
            lease,
            tries: Try::sent(self.now, self.opts.keepalive_timeout),
        });
        for (_, on) in &mut self.closes {
            if matches!(on, CloseOn::Held(_)) {
                *on = CloseOn::Revoke(lease);
            }
        }
        self.request(Request::Revoke { lease });
    }

    pub(super) fn revoke_failed(&mut self, now: Instant, lease: LeaseId) {
        let retry = self.opts.retry_interval;
        let Some(r) = self
            .revokes
            .iter_mut()
            .find(|r| r.lease == lease && r.tries.until.is_some())
        else {
            return;
        };
        if r.tries.failed(now, retry) {
            self.first_revoke_ended(lease);
        }
    }

    /// The first try of `lease`'s revoke ended: the closes waiting on it
    /// are answered (the revoke goes on if it failed).
    pub(super) fn first_revoke_ended(&mut self, lease: LeaseId) {
        let mut done = Vec::new();
        self.closes.retain(|(w, on)| {
            let go = *on == CloseOn::Revoke(lease);
            if go {
                done.push(*w);
            }
            !go
        });
        for waiter in done {
            self.notice(Notice::CloseDone { waiter });
        }
    }

    /// What the close call `waiter` waits for (§10): the revoke of the
    /// lease it closed; else a fenced lease's revoke still held back (its
    /// `on_fence` and work), at most a keepalive timeout; else the latest
    /// revoke still on its first try; else nothing. So a process that
    /// exits once closed does not cut a revoke off.
    pub(super) fn close_wait(&mut self, waiter: u64, revoked: Option<LeaseId>) {
        let on = if let Some(lease) = revoked {
            CloseOn::Revoke(lease)
        } else if !self.held.is_empty() {
            CloseOn::Held(self.now + self.opts.keepalive_timeout)
        } else if let Some(r) = self.revokes.iter().rev().find(|r| r.tries.first) {
            CloseOn::Revoke(r.lease)
        } else {
            self.notice(Notice::CloseDone { waiter });
            return;
        };
        self.closes.push((waiter, on));
    }

    /// The timers of the tries (deletes, revokes), the close waits and the
    /// TTL bound of calls.
    pub(super) fn poll_tries(&mut self, now: Instant) {
        let (timeout, retry) = (self.opts.keepalive_timeout, self.opts.retry_interval);
        let mut releases = Vec::new();
        let mut again = Vec::new();
        for d in &mut self.deletes {
            if d.tries.until.is_some_and(|t| now >= t) {
                if d.tries.failed(now, retry) {
                    releases.push(d.lock);
                }
            } else if d.tries.retry_at.is_some_and(|t| now >= t) {
                d.tries.retry_at = None;
                d.tries.until = Some(now + timeout);
                again.push(Request::Unlock {
                    req: d.req,
                    lock: d.lock,
                    lease: d.lease,
                    token: d.token,
                });
            }
        }
        let mut revoked = Vec::new();
        for r in &mut self.revokes {
            if r.tries.until.is_some_and(|t| now >= t) {
                if r.tries.failed(now, retry) {
                    revoked.push(r.lease);
                }
            } else if r.tries.retry_at.is_some_and(|t| now >= t) {
                r.tries.retry_at = None;
                r.tries.until = Some(now + timeout);
                again.push(Request::Revoke { lease: r.lease });
            }
        }
        for lock in releases {
            self.answer_releases(lock);
        }
        for lease in revoked {
            self.first_revoke_ended(lease);
        }
        for r in again {
            self.request(r);
        }
        let mut done = Vec::new();
        self.closes.retain(|(w, on)| {
            let go = matches!(on, CloseOn::Held(t) if now >= *t);
            if go {
                done.push(*w);
            }
            !go
        });
        for waiter in done {
            self.notice(Notice::CloseDone { waiter });
        }
        while let Some(&(t, req)) = self.bounded.front() {
            if now < t {
                break;
            }
            self.bounded.pop_front();
            self.request(Request::Abandon { req });
        }
    }

    /// No permit of `lock` is in flight: its drain under way is over, and so
    /// is the work of its fenced tokens.
    pub(super) fn on_permits_ended(&mut self, now: Instant, lock: LockId) {
        if let Some(s) = self.locks.get_mut(&lock)
            && s.watching
        {
            s.watching = false;
            s.quiet = true;
            self.notice(Notice::Drained { lock });
        }
        self.resigned(lock);
        for h in &mut self.held {
            for t in h.tokens.iter_mut().filter(|t| t.lock == lock) {
                t.ended = true;
            }
        }
        self.release_held(now);
    }

    /// Revokes a lease a stray reply names, unless it is the current one or
    /// a fenced one whose revoke is held back.
    pub(super) fn revoke_stray(&mut self, lease: LeaseId) {
        if self.lease != Some(lease) && !self.held.iter().any(|h| h.lease == lease) {
            self.send_revoke(lease);
        }
    }

    pub(super) fn release_held(&mut self, now: Instant) {
        let mut go = Vec::new();
        self.held.retain(|h| {
            let done = h.tokens.iter().all(|t| t.delivered && t.ended) || now >= h.expired_by;
            if done {
                go.push(h.lease);
            }
            !done
        });
        for lease in go {
            self.send_revoke(lease);
        }
    }
}
