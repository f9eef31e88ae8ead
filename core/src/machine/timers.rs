//! The holder's clock side: [`Holder::poll_timeout`] names the next
//! instant anything is due, and `poll_timers` does what is due at `now`
//! (deadline, keepalive timeouts and sends, acquire give-ups and retries,
//! resignations' grace, held revokes, tries). One place per timer, so that
//! each has a timeout and a handler that the fake-clock tests reach.

use super::Holder;
use super::records::CloseOn;
use super::types::{AcquireError, LockId, Reason, State};
use crate::clock::Instant;

impl Holder {
    /// When the driver must call `handle(now, Event::Timer)` next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timeout = self.opts.keepalive_timeout;
        let mut at: Option<Instant> = None;
        // Each candidate is looked at only when present: comparing whole
        // `Option`s let optimised code read a `None`'s unset payload, which
        // valgrind reports in the C tests.
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                at = Some(match at {
                    Some(a) if a <= t => a,
                    _ => t,
                });
            }
        };
        consider(self.deadline);
        for p in &self.keepalives {
            consider(Some(p.sent_at + timeout));
        }
        consider(self.grant.map(|p| p.sent_at + timeout));
        consider(self.grant_retry_at);
        if self.failing {
            consider(self.keepalive_retry_at);
        } else {
            consider(self.next_keepalive);
        }
        for id in &self.pending {
            let s = &self.locks[id];
            if s.state == State::Acquiring {
                consider(s.give_up_at);
            }
            consider(s.acquire_retry_at);
        }
        for h in &self.held {
            consider(Some(h.expired_by));
        }
        for d in &self.deletes {
            consider(d.tries.next_timer());
        }
        for id in &self.resigns {
            consider(self.locks[id].resigning.map(|r| r.until));
        }
        for r in &self.revokes {
            consider(r.tries.next_timer());
        }
        for (_, on) in &self.closes {
            if let CloseOn::Held(t) = on {
                consider(Some(*t));
            }
        }
        consider(self.bounded.front().map(|(t, _)| *t));
        at
    }

    pub(super) fn poll_timers(&mut self, now: Instant) {
        if self.deadline.is_some_and(|d| now >= d) {
            self.lease_gone(now, Reason::Deadline);
        }
        let due: Vec<LockId> = self
            .pending
            .iter()
            .copied()
            .filter(|id| {
                let s = &self.locks[id];
                s.state == State::Acquiring && s.give_up_at.is_some_and(|t| now >= t)
            })
            .collect();
        for id in due {
            // `timeout` only for a wait in the queue; a service that never
            // let the request be queued is a backend failure.
            let s = &self.locks[&id];
            let error = if s.lock_req.is_some() || s.queued {
                AcquireError::Timeout
            } else {
                AcquireError::Backend(self.last_error.clone())
            };
            self.fail_acquire(id, error, Reason::AcquireTimeout);
        }
        let timeout = self.opts.keepalive_timeout;
        let before = self.keepalives.len();
        self.keepalives.retain(|p| now < p.sent_at + timeout);
        if self.keepalives.len() < before {
            self.keepalive_failed(now, Reason::KeepaliveTimeout);
        }
        if self.grant.is_some_and(|p| now >= p.sent_at + timeout) {
            self.grant = None;
            self.grant_failed(now);
        }
        if self.grant_retry_at.is_some_and(|t| now >= t) {
            self.grant_retry_at = None;
            self.ensure_lease(now);
        }
        if self.failing {
            if self.keepalive_retry_at.is_some_and(|t| now >= t) {
                self.keepalive_retry_at = Some(now + self.opts.retry_interval);
                self.send_keepalive(now);
            }
        } else if self.next_keepalive.is_some_and(|t| now >= t) {
            self.next_keepalive = Some(now + self.opts.keepalive_interval);
            self.send_keepalive(now);
        }
        let retry: Vec<LockId> = self
            .pending
            .iter()
            .copied()
            .filter(|id| self.locks[id].acquire_retry_at.is_some_and(|t| now >= t))
            .collect();
        for id in retry {
            self.slot(id).acquire_retry_at = None;
            self.try_lock(now, id);
        }
        let graced: Vec<LockId> = self
            .resigns
            .iter()
            .copied()
            .filter(|id| self.locks[id].resigning.is_some_and(|r| now >= r.until))
            .collect();
        for id in graced {
            self.resigned(id);
        }
        // Last: a fence above (late, after a starved driver) may hold a
        // lease that has run out already.
        if self.held.iter().any(|h| now >= h.expired_by) {
            self.release_held(now);
        }
        self.poll_tries(now);
    }
}
