//! The session's lease (docs/design.md §4, §6, §7): grant, keepalives and
//! the deadline rule, the drain on a failed keepalive, the fence of every
//! lock when the lease is gone, and the close that revokes it.

use std::time::Duration;

use super::Holder;
use super::messages::{Notice, Request};
use super::records::{FencedToken, HeldRevoke, Pending};
use super::types::{AcquireError, LeaseId, LockId, Reason, ReqId, State};
use crate::clock::Instant;

impl Holder {
    /// A reply to `req` came: the TTL no longer bounds it.
    pub(super) fn answered(&mut self, req: ReqId) {
        if let Some(i) = self.bounded.iter().position(|(_, r)| *r == req) {
            self.bounded.remove(i);
        }
    }

    /// Whether any lock waits for a lease.
    pub(super) fn wants_lease(&self) -> bool {
        !self.closed && !self.pending.is_empty()
    }

    /// Asks for a lease if a lock waits for one and none is coming.
    pub(super) fn ensure_lease(&mut self, now: Instant) {
        if self.lease.is_none()
            && self.grant.is_none()
            && self.grant_retry_at.is_none()
            && self.wants_lease()
        {
            let req = self.req();
            self.grant = Some(Pending { req, sent_at: now });
            self.bounded.push_back((now + self.opts.ttl, req));
            self.request(Request::Grant {
                req,
                ttl: self.opts.ttl,
                bounds: self.bounds(),
            });
        }
    }

    /// Forgets the lease and everything tied to it (requests, timers, key
    /// records); the caller revokes it or holds its revoke.
    pub(super) fn forget_lease(&mut self) {
        self.lease = None;
        self.last_renewal = None;
        self.keepalives.clear();
        self.deadline = None;
        self.next_keepalive = None;
        self.failing = false;
        self.keepalive_retry_at = None;
        self.keys.clear();
        let mut cut = Vec::new();
        for s in self.locks.values_mut() {
            // Requests under the old lease are abandoned; its keys go with
            // it (the deletes under way go on until answered).
            cut.extend(s.lock_req.take());
            s.unlocking = None;
        }
        for req in cut {
            self.request(Request::Abandon { req });
        }
        self.notice(Notice::Deadline);
    }

    pub(super) fn on_granted(&mut self, now: Instant, req: ReqId, lease: LeaseId, ttl: Duration) {
        self.answered(req);
        let Some(p) = self.grant.filter(|p| p.req == req) else {
            // A grant we gave up on: its lease would only block us (a
            // duplicate reply for the current lease must not revoke it).
            self.revoke_stray(lease);
            return;
        };
        self.grant = None;
        if ttl.is_zero() || self.closed {
            self.send_revoke(lease);
            self.grant_failed(now);
            return;
        }
        self.lease = Some(lease);
        self.granted_ttl = ttl;
        self.last_renewal = Some(p.sent_at);
        self.deadline = Some(p.sent_at + ttl - self.opts.margin);
        self.next_keepalive = Some(p.sent_at + self.opts.keepalive_interval);
        self.notice(Notice::Deadline);
        self.send_waiting(now, None);
    }

    /// No lease this time: a `try_acquire` fails, waiting locks try again
    /// after the retry interval.
    pub(super) fn grant_failed(&mut self, now: Instant) {
        let once: Vec<LockId> = self
            .pending
            .iter()
            .copied()
            .filter(|id| {
                let s = &self.locks[id];
                !s.wait && s.state == State::Acquiring
            })
            .collect();
        for id in once {
            self.fail_acquire(
                id,
                AcquireError::Backend(self.last_error.clone()),
                Reason::AcquireFailed,
            );
        }
        if self.wants_lease() {
            self.grant_retry_at = Some(now + self.opts.retry_interval);
        }
    }

    pub(super) fn on_confirmed(&mut self, now: Instant, req: ReqId, ttl: Duration) {
        self.answered(req);
        let Some(i) = self.keepalives.iter().position(|p| p.req == req) else {
            tracing::debug!(req, "keepalive reply after its timeout or lease: ignored");
            return;
        };
        let p = self.keepalives.remove(i).expect("position is in range");
        // Older keepalives are superseded: their replies could only give an
        // earlier deadline, and their timeouts must not drain again.
        self.keepalives.retain(|q| q.req > p.req);
        if ttl.is_zero() {
            self.lease_gone(now, Reason::LeaseLost);
            return;
        }
        // A held revoke's fallback (last renewal + TTL) must not come
        // before the expiry of a renewal this TTL was granted for.
        self.granted_ttl = self.granted_ttl.max(ttl);
        let d = p.sent_at + ttl - self.opts.margin;
        let deadline = self.deadline.map_or(d, |old| old.max(d));
        if self.deadline != Some(deadline) {
            self.deadline = Some(deadline);
            self.notice(Notice::Deadline);
        }
        self.next_keepalive = Some(p.sent_at + self.opts.keepalive_interval);
        self.failing = false;
        self.keepalive_retry_at = None;
        let draining: Vec<LockId> = self
            .locks
            .iter()
            .filter(|(_, s)| s.state == State::Draining)
            .map(|(id, _)| *id)
            .collect();
        for id in draining {
            self.transition(id, State::Holding, Reason::Resumed);
        }
    }

    pub(super) fn keepalive_failed(&mut self, now: Instant, reason: Reason) {
        if self.failing || self.lease.is_none() {
            return;
        }
        self.failing = true;
        self.keepalive_retry_at = Some(now + self.opts.retry_interval);
        let holding: Vec<LockId> = self
            .locks
            .iter()
            .filter(|(_, s)| s.state == State::Holding)
            .map(|(id, _)| *id)
            .collect();
        for id in holding {
            self.transition(id, State::Draining, reason);
        }
    }

    /// The lease is gone (deadline passed, or the server said so): every
    /// lock held under it fences, and the session takes a new lease for the
    /// locks that acquire again.
    pub(super) fn lease_gone(&mut self, now: Instant, reason: Reason) {
        let Some(lease) = self.lease else { return };
        let expired_by = self.last_renewal.unwrap_or(now) + self.granted_ttl;
        let ids: Vec<LockId> = self.locks.keys().copied().collect();
        let mut tokens = Vec::new();
        for id in ids {
            let quiet = {
                let s = &self.locks[&id];
                s.state != State::Holding && s.quiet
            };
            if let Some(token) = self.fence(id, reason) {
                tokens.push(FencedToken {
                    lock: id,
                    token,
                    delivered: false,
                    // `quiet` speaks of the drain now under way only.
                    ended: quiet,
                });
            }
        }
        self.forget_lease();
        if tokens.is_empty() {
            self.send_revoke(lease);
        } else {
            self.held.push(HeldRevoke {
                lease,
                tokens,
                expired_by,
            });
        }
        self.ensure_lease(now);
    }

    /// Closes the session: every lock is released and the lease revoked
    /// (one request deletes every key).
    pub(super) fn on_close(&mut self, now: Instant) -> Option<LeaseId> {
        if self.closed {
            return None;
        }
        self.closed = true;
        let ids: Vec<LockId> = self.locks.keys().copied().collect();
        // The revoke deletes the keys of resignations too.
        for id in std::mem::take(&mut self.resigns) {
            self.slot(id).resigning = None;
        }
        let lease = self.lease;
        // The revoke deletes every key: no delete of its own per lock.
        self.forget_lease();
        for id in ids {
            self.on_release(now, id);
        }
        self.grant = None;
        self.grant_retry_at = None;
        if let Some(lease) = lease {
            self.send_revoke(lease);
        }
        lease
    }

    pub(super) fn send_keepalive(&mut self, now: Instant) {
        let Some(lease) = self.lease else { return };
        let req = self.req();
        self.last_renewal = Some(now);
        self.keepalives.push_back(Pending { req, sent_at: now });
        self.bounded.push_back((now + self.opts.ttl, req));
        let bounds = self.bounds();
        self.request(Request::Keepalive { req, lease, bounds });
    }
}
