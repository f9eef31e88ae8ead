//! The holder state machine (docs/design.md §2), sans-IO.
//!
//! [`Holder`] takes `(now, Event)` and queues its output in two queues, as
//! quinn-proto's `Connection` does: [`Request`]s to the lock service
//! ([`Holder::poll_request`]) and [`Notice`]s to the application
//! ([`Holder::poll_notice`]); [`Holder::poll_action`] merges them in order
//! for tests. It never reads a clock, sleeps or talks to a server. The
//! driver feeds it replies and timer ticks, sends its requests, publishes
//! its notices, and sleeps until [`Holder::poll_timeout`]. Tests drive it
//! with hand-made instants.
//!
//! | docs/design.md word | here |
//! | --- | --- |
//! | keepalive sent | [`Action::Keepalive`]: the machine stamps `now` as the send time when it asks; the driver sends at once, so the stamp is never later than the real send |
//! | confirmed (granted TTL) | [`Event::KeepaliveConfirmed`] (a zero TTL means lost) |
//! | failed (reason) | [`Event::KeepaliveFailed`]; a timeout is the machine's own timer |
//! | lease lost | [`Event::LeaseLost`] |
//! | lock key deleted (watch) | [`Event::LockLost`] |
//! | acquired (token) | [`Event::Locked`] in, [`Action::Acquired`] out |
//! | release / timer fired | [`Event::Release`] / [`Event::Timer`] |
//! | arm the timer | [`Holder::poll_timeout`] |
//! | call on_fence / revoke | [`Action::Fence`] / [`Action::Revoke`] |
//! | on_fence returned | [`Event::FenceDelivered`] |
//! | the last permit in flight ended | [`Event::PermitsEnded`], asked for by [`Holder::watching_permits`] |
//! | call on_drained | [`Action::Drained`] |
//! | reacquire | [`Action::Transition`] to `Reacquiring`, then [`Action::Grant`] |
//! | delete / revoke retried until answered | [`Request::Unlock`] / [`Request::Revoke`] again a retry interval after a failure ([`Event::UnlockFailed`], [`Event::RevokeFailed`]) or a try unanswered for a keepalive timeout |
//! | release() / close() returns | [`Notice::ReleaseDone`] / [`Notice::CloseDone`] |
//! | a call bounded by the TTL | [`Request::Abandon`] |
//!
//! Ordering and timing rules (docs/design.md §10, §11) live here, so the
//! machine's tests cover them: a fenced lease is revoked only once
//! `on_fence` has returned *and* the last permit in flight has ended, or
//! once the server's expiry of that lease has passed anyway; `drained` is
//! reported once per drain or fence, when no permit is in flight; a delete
//! or revoke is tried until answered; a close waits for its revoke's first
//! try, or for a held revoke at most a keepalive timeout; a grant or
//! keepalive unanswered for a TTL is abandoned.
//!
//! Layout: [`Holder`] and its event dispatch stand here; its steps are
//! split by what they are about (`lease`, `lock`, `retry`, `timers`), over
//! the public words (`types`), the edge's messages (`messages`) and its
//! private records (`records`). Imports run one way: the step files read
//! this file and the leaves, this file reads only the leaves.

mod lease;
mod lock;
mod messages;
mod records;
mod retry;
mod timers;
mod types;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

pub use messages::{Action, Bounds, Event, Notice, Request};
use records::{CloseOn, Delete, HeldRevoke, Pending, Revoking, Slot};
pub(crate) use types::decide;
pub use types::{AcquireError, LeaseId, LockId, Reason, Refused, ReqId, State, StateChange, Token};

use crate::Options;
use crate::clock::Instant;

/// The sans-IO holder of one session: one lease, one keepalive loop, one
/// local deadline, and any number of locks held under that lease.
#[derive(Debug)]
pub struct Holder {
    opts: Options,
    next_req: ReqId,
    /// Lease of the session, once granted.
    lease: Option<LeaseId>,
    /// Outstanding lease grant.
    grant: Option<Pending>,
    grant_retry_at: Option<Instant>,
    /// Outstanding keepalives of this lease, oldest first.
    keepalives: VecDeque<Pending>,
    /// Local deadline of the lease (and of every lock held under it).
    deadline: Option<Instant>,
    next_keepalive: Option<Instant>,
    /// A keepalive failed and none was confirmed since: retrying.
    failing: bool,
    keepalive_retry_at: Option<Instant>,
    /// Send time of the last request that may have renewed the lease.
    last_renewal: Option<Instant>,
    /// The longest TTL granted for the current lease (by its grant or a
    /// keepalive).
    granted_ttl: Duration,
    /// Closed: no acquisition any more.
    closed: bool,
    /// Boxed: a B-tree filled in id order keeps its nodes about half full,
    /// and a half-empty node of 150-byte slots cost 100 B a lock more than
    /// one of pointers (10,000 locks on one session: issue 28's 1 KiB).
    locks: BTreeMap<LockId, Box<Slot>>,
    /// The locks acquiring (the only ones with timers of their own).
    pending: BTreeSet<LockId>,
    /// Per name, the lock of this session whose key under the current
    /// lease may exist: another lock of the same name waits for it to go.
    keys: HashMap<std::sync::Arc<str>, LockId>,
    held: Vec<HeldRevoke>,
    /// Key deletes under way, tried until answered.
    deletes: Vec<Delete>,
    /// The locks resigning (their key's delete waits for their permits).
    resigns: BTreeSet<LockId>,
    /// Revokes under way, tried until answered.
    revokes: Vec<Revoking>,
    /// `Session::close` calls waiting, with what each waits for.
    closes: Vec<(u64, CloseOn)>,
    /// Calls the TTL bounds (grants, keepalives), in send order: abandoned
    /// once it passed, when no reply could matter any more.
    bounded: VecDeque<(Instant, ReqId)>,
    /// The service's last error text while acquiring.
    last_error: Option<String>,
    /// The instant of the event being handled.
    now: Instant,
    /// Output order across the two queues.
    seq: u64,
    requests: VecDeque<(u64, Request)>,
    notices: VecDeque<(u64, Notice)>,
}
impl Holder {
    /// A session with no lease and no lock yet. `opts` should have passed
    /// [`Options::validate`].
    pub fn new(opts: Options) -> Holder {
        Holder {
            opts,
            next_req: 1,
            lease: None,
            grant: None,
            grant_retry_at: None,
            keepalives: VecDeque::new(),
            deadline: None,
            next_keepalive: None,
            failing: false,
            keepalive_retry_at: None,
            last_renewal: None,
            granted_ttl: Duration::ZERO,
            closed: false,
            locks: BTreeMap::new(),
            pending: BTreeSet::new(),
            keys: HashMap::new(),
            held: Vec::new(),
            deletes: Vec::new(),
            resigns: BTreeSet::new(),
            revokes: Vec::new(),
            closes: Vec::new(),
            bounded: VecDeque::new(),
            last_error: None,
            now: Instant::ZERO,
            seq: 0,
            requests: VecDeque::new(),
            notices: VecDeque::new(),
        }
    }

    /// Adds the lock `id` called `name` (in state `Idle`); `id` is the
    /// caller's and must be new.
    pub fn add_lock(&mut self, id: LockId, name: impl Into<std::sync::Arc<str>>) {
        self.locks.insert(
            id,
            Box::new(Slot {
                name: name.into(),
                state: State::Idle,
                token: None,
                last_token: None,
                wait: false,
                give_up_at: None,
                lock_req: None,
                queued: false,
                acquire_retry_at: None,
                unlocking: None,
                watching: false,
                quiet: false,
                resigning: None,
            }),
        );
    }

    /// Whether `lock` has nothing left to do: released, every delete of its
    /// keys answered, no permit awaited and no fenced token of it waiting. The driver then
    /// removes a lock whose handle is gone.
    pub fn finished(&self, lock: LockId) -> bool {
        self.locks.get(&lock).is_none_or(|s| {
            s.state == State::Released
                && s.unlocking.is_none()
                && s.resigning.is_none()
                && !self.deletes.iter().any(|d| d.lock == lock)
                && !self.watching_permits(lock)
                && self.keys.get(&s.name) != Some(&lock)
        })
    }

    /// Forgets a [`Holder::finished`] lock.
    pub fn remove_lock(&mut self, lock: LockId) {
        debug_assert!(self.finished(lock));
        self.locks.remove(&lock);
        self.pending.remove(&lock);
    }

    /// The bounds of this session's backend calls (its own settings),
    /// also for the calls the driver makes without a request (the key
    /// watch).
    pub fn bounds(&self) -> Bounds {
        Bounds {
            timeout: self.opts.keepalive_timeout,
            retry: self.opts.retry_interval,
        }
    }

    /// Whether the session has nothing left to do once closed: no lock, no
    /// held revoke, no delete or revoke still to be answered, no close
    /// waiting.
    pub fn idle(&self) -> bool {
        self.locks.is_empty()
            && self.held.is_empty()
            && self.deletes.is_empty()
            && self.revokes.is_empty()
            && self.closes.is_empty()
    }

    /// Whether the driver must report [`Event::PermitsEnded`] for `lock`
    /// once none of its permits is in flight (drain detection is the
    /// machine's).
    pub fn watching_permits(&self, lock: LockId) -> bool {
        self.locks.get(&lock).is_some_and(|s| s.watching)
            || self
                .held
                .iter()
                .any(|h| h.tokens.iter().any(|t| t.lock == lock && !t.ended))
    }

    /// The lease a guarded write of `token` by `lock` is made under, if
    /// `token` is the one it holds now and the deadline has not passed.
    pub fn write_lease(&self, now: Instant, lock: LockId, token: Token) -> Option<LeaseId> {
        let s = self.locks.get(&lock)?;
        (s.holding() && s.token == Some(token) && self.deadline.is_some_and(|d| now < d))
            .then_some(self.lease)
            .flatten()
    }

    /// The name of `lock`.
    pub fn name(&self, lock: LockId) -> Option<std::sync::Arc<str>> {
        self.locks.get(&lock).map(|s| s.name.clone())
    }

    /// The state of `lock` (`Released` once removed).
    pub fn state(&self, lock: LockId) -> State {
        self.locks.get(&lock).map_or(State::Released, |s| s.state)
    }

    /// The token `lock` holds (while `Holding` or `Draining`).
    pub fn token(&self, lock: LockId) -> Option<Token> {
        self.locks.get(&lock).and_then(|s| s.token)
    }

    /// The local deadline of the session's lease, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The session's lease, if any.
    pub fn lease(&self) -> Option<LeaseId> {
        self.lease
    }

    /// Fenced leases whose revoke is held until their tokens' `on_fence`
    /// returned and work ended (§11 a).
    pub fn held_revokes(&self) -> usize {
        self.held.len()
    }

    /// The locks of the session, in the order they were added.
    pub fn locks(&self) -> impl Iterator<Item = LockId> + '_ {
        self.locks.keys().copied()
    }

    /// The permit rule for `lock` at `now`: the token and deadline, or why
    /// not.
    pub fn permit(&self, lock: LockId, now: Instant) -> Result<(Token, Instant), Refused> {
        let deadline = self.deadline.unwrap_or(Instant::ZERO);
        decide(self.state(lock), deadline, now)?;
        Ok((self.token(lock).expect("holding without a token"), deadline))
    }

    /// The next request to send to the lock service, in order.
    pub fn poll_request(&mut self) -> Option<Request> {
        self.requests.pop_front().map(|(_, r)| r)
    }

    /// The next notice for the application, in order.
    pub fn poll_notice(&mut self) -> Option<Notice> {
        self.notices.pop_front().map(|(_, n)| n)
    }

    /// The next output of either queue, in the order the machine produced
    /// them (tests; the driver polls the queues apart).
    pub fn poll_action(&mut self) -> Option<Action> {
        let request_first = match (self.requests.front(), self.notices.front()) {
            (Some((r, _)), Some((n, _))) => r < n,
            (r, _) => r.is_some(),
        };
        if request_first {
            self.poll_request().map(Action::from)
        } else {
            self.poll_notice().map(Action::from)
        }
    }

    fn request(&mut self, r: Request) {
        self.seq += 1;
        self.requests.push_back((self.seq, r));
    }

    fn notice(&mut self, n: Notice) {
        self.seq += 1;
        self.notices.push_back((self.seq, n));
    }

    /// Feeds one event at `now`. Timers due at `now` are handled first, so a
    /// reply that arrives after the deadline finds the token already fenced.
    pub fn handle(&mut self, now: Instant, event: Event) {
        self.now = now;
        if let Event::PermitsEnded { lock } = event {
            // Observed before any timer due now: a fence those timers cause
            // may follow a permit granted after the observation.
            self.on_permits_ended(now, lock);
            self.poll_timers(now);
            return;
        }
        self.poll_timers(now);
        match event {
            Event::Acquire { lock, wait, until } => self.on_acquire(now, lock, wait, until),
            Event::LeaseGranted { req, lease, ttl } => self.on_granted(now, req, lease, ttl),
            Event::GrantFailed { req, error } => {
                self.answered(req);
                self.last_error = Some(error);
                if self.grant.is_some_and(|p| p.req == req) {
                    self.grant = None;
                    self.grant_failed(now);
                }
            }
            Event::Locked {
                req,
                lock,
                lease,
                token,
            } => self.on_locked(now, req, lock, lease, token),
            Event::LockFailed {
                req,
                lock,
                busy,
                error,
            } => {
                self.last_error = Some(error);
                self.on_lock_failed(now, req, lock, busy);
            }
            Event::LockRefused { req, lock, error } => {
                self.last_error = Some(error.clone());
                self.on_lock_refused(now, req, lock, error);
            }
            Event::UnlockFailed { req } => self.delete_failed(now, req),
            Event::Revoked { lease } => {
                if let Some(i) = self.revokes.iter().position(|r| r.lease == lease) {
                    let r = self.revokes.remove(i);
                    if r.tries.first {
                        self.first_revoke_ended(lease);
                    }
                }
            }
            Event::RevokeFailed { lease } => self.revoke_failed(now, lease),
            Event::Unlocked { req, lock } => {
                if let Some(i) = self.deletes.iter().position(|d| d.req == req) {
                    let d = self.deletes.remove(i);
                    if d.tries.first {
                        self.answer_releases(lock);
                    }
                }
                if let Some(s) = self.locks.get_mut(&lock)
                    && s.unlocking == Some(req)
                {
                    s.unlocking = None;
                    let name = s.name.clone();
                    if self.keys.get(&name) == Some(&lock) {
                        self.keys.remove(&name);
                    }
                    self.send_waiting(now, Some(&name));
                }
            }
            Event::KeepaliveConfirmed { req, ttl } => self.on_confirmed(now, req, ttl),
            Event::KeepaliveFailed { req } => {
                self.answered(req);
                if let Some(i) = self.keepalives.iter().position(|p| p.req == req) {
                    self.keepalives.remove(i);
                    self.keepalive_failed(now, Reason::KeepaliveFailed);
                }
            }
            Event::LeaseLost { lease } => {
                if self.lease == Some(lease) {
                    self.lease_gone(now, Reason::LeaseLost);
                }
            }
            Event::LockLost { lock, token } => self.on_lock_lost(now, lock, token),
            Event::Release { lock } => self.on_release(now, lock),
            Event::Resign { lock, grace } => self.on_resign(now, lock, grace),
            Event::Close { waiter } => {
                let revoked = self.on_close(now);
                if let Some(waiter) = waiter {
                    self.close_wait(waiter, revoked);
                }
            }
            Event::Cancel { lock, token } => self.on_cancel(now, lock, token),
            Event::FenceDelivered { lock, token } => {
                for h in &mut self.held {
                    for t in h
                        .tokens
                        .iter_mut()
                        .filter(|t| t.lock == lock && t.token == token)
                    {
                        t.delivered = true;
                    }
                }
                self.release_held(now);
            }
            Event::PermitsEnded { .. } => unreachable!("handled first"),
            Event::Timer => {}
        }
        self.poll_timers(now);
    }

    fn req(&mut self) -> ReqId {
        let r = self.next_req;
        self.next_req += 1;
        r
    }

    fn slot(&mut self, lock: LockId) -> &mut Slot {
        self.locks.get_mut(&lock).expect("a lock of this session")
    }

    fn transition(&mut self, lock: LockId, to: State, reason: Reason) {
        let s = self.locks.get_mut(&lock).expect("a lock of this session");
        let from = s.state;
        s.state = to;
        if from == State::Holding && matches!(to, State::Draining | State::Fenced) {
            // A drain or a fence: no new permits; wait for the last one.
            s.watching = true;
            s.quiet = false;
        }
        if to == State::Holding {
            // A drain begun goes on through a release: on_drained still
            // tells when the last permit ended.
            s.watching = false;
        }
        if matches!(to, State::Acquiring | State::Reacquiring) {
            self.pending.insert(lock);
        } else {
            self.pending.remove(&lock);
        }
        self.notice(Notice::Transition {
            lock,
            change: StateChange { from, to, reason },
        });
    }
}

#[cfg(test)]
mod tests;
