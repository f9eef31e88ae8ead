//! The holder state machine (docs/design.md §2), sans-IO.
//!
//! [`Holder`] takes `(now, Event)` and queues [`Action`]s; it never reads a
//! clock, sleeps or talks to a server. The driver feeds it replies and timer
//! ticks, performs its actions, and sleeps until [`Holder::poll_timeout`].
//! Tests drive it with hand-made instants.
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
//!
//! Ordering rules (docs/design.md §11) live here, so the machine's tests
//! cover them: a fenced lease is revoked only once `on_fence` has returned
//! *and* the last permit in flight has ended, or once the server's expiry of
//! that lease has passed anyway; `drained` is reported once per drain or
//! fence, when no permit is in flight.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use crate::Options;
use crate::clock::Instant;

/// A lease id on the lock service.
pub type LeaseId = i64;

/// Identifies one request the machine asked the driver to send, so that a
/// reply is matched to its own request (and its own send time), never to a
/// newer one.
pub type ReqId = u64;

/// A fencing token: assigned by the lock service, strictly higher for every
/// later acquisition of the same lock name (etcd: the lock key's
/// `create_revision`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(pub u64);

impl Token {
    /// The token as a number, to send with every write to a fenced resource.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Token> for u64 {
    fn from(t: Token) -> u64 {
        t.0
    }
}

/// Where a holder stands.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum State {
    /// Not acquired yet, or the last acquisition failed.
    Idle = 0,
    /// Taking a lease and waiting for the lock.
    Acquiring = 1,
    /// Holding the lock; `permit()` grants until the deadline.
    Holding = 2,
    /// A keepalive failed: no new permits, in-flight work finishes, retrying.
    Draining = 3,
    /// The deadline passed or the lease was lost: the token is dead for good.
    Fenced = 4,
    /// After a fence: taking a new lease to acquire with a higher token.
    Reacquiring = 5,
    /// Released by the application.
    Released = 6,
}

impl State {
    /// The name used in traces and every binding.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Idle => "Idle",
            State::Acquiring => "Acquiring",
            State::Holding => "Holding",
            State::Draining => "Draining",
            State::Fenced => "Fenced",
            State::Reacquiring => "Reacquiring",
            State::Released => "Released",
        }
    }

    /// Every state, in C order (`State::ALL[i] as u8 == i`).
    pub const ALL: [State; 7] = [
        State::Idle,
        State::Acquiring,
        State::Holding,
        State::Draining,
        State::Fenced,
        State::Reacquiring,
        State::Released,
    ];

    /// The name as a static C string, for the C face.
    pub fn as_cstr(self) -> &'static std::ffi::CStr {
        const NAMES: [&std::ffi::CStr; 7] = [
            c"Idle",
            c"Acquiring",
            c"Holding",
            c"Draining",
            c"Fenced",
            c"Reacquiring",
            c"Released",
        ];
        NAMES[self as usize]
    }

    pub(crate) const fn from_u8(v: u8) -> State {
        match v {
            1 => State::Acquiring,
            2 => State::Holding,
            3 => State::Draining,
            4 => State::Fenced,
            5 => State::Reacquiring,
            6 => State::Released,
            _ => State::Idle,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a transition happened.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The application asked to acquire.
    Acquire,
    /// The lock service granted the lock.
    Acquired,
    /// A keepalive got no reply within `keepalive_timeout`.
    KeepaliveTimeout,
    /// A keepalive failed (transport error, stream closed).
    KeepaliveFailed,
    /// A keepalive was confirmed before the deadline.
    Resumed,
    /// The deadline passed with no confirmed keepalive.
    Deadline,
    /// The server said the lease no longer exists.
    LeaseLost,
    /// The lock key was deleted while the lease lived (an operator ran
    /// `etcdctl del`): someone else may take the lock at once.
    LockLost,
    /// Acquiring again after a fence.
    Reacquire,
    /// The lock service granted the lock again, with a higher token.
    Reacquired,
    /// The application released the lock.
    Release,
    /// Acquisition did not finish within its timeout.
    AcquireTimeout,
    /// `try_acquire` found the lock held by someone else.
    WouldBlock,
    /// `try_acquire` failed on a backend error.
    AcquireFailed,
}

impl Reason {
    /// Every reason, in C order (`LK_REASON_*` value = index).
    pub const ALL: [Reason; 14] = [
        Reason::Acquire,
        Reason::Acquired,
        Reason::KeepaliveTimeout,
        Reason::KeepaliveFailed,
        Reason::Resumed,
        Reason::Deadline,
        Reason::LeaseLost,
        Reason::Reacquire,
        Reason::Reacquired,
        Reason::Release,
        Reason::AcquireTimeout,
        Reason::WouldBlock,
        Reason::AcquireFailed,
        Reason::LockLost,
    ];

    /// The index in [`Reason::ALL`] (the C number).
    pub fn index(self) -> usize {
        Reason::ALL
            .iter()
            .position(|r| *r == self)
            .expect("every reason is in ALL")
    }

    /// The name as a static C string, for the C face.
    pub fn as_cstr(self) -> &'static std::ffi::CStr {
        const NAMES: [&std::ffi::CStr; 14] = [
            c"acquire",
            c"acquired",
            c"keepalive_timeout",
            c"keepalive_failed",
            c"resumed",
            c"deadline",
            c"lease_lost",
            c"reacquire",
            c"reacquired",
            c"release",
            c"acquire_timeout",
            c"would_block",
            c"acquire_failed",
            c"lock_lost",
        ];
        NAMES[self.index()]
    }

    /// The snake_case name used in traces and every binding.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Acquire => "acquire",
            Reason::Acquired => "acquired",
            Reason::KeepaliveTimeout => "keepalive_timeout",
            Reason::KeepaliveFailed => "keepalive_failed",
            Reason::Resumed => "resumed",
            Reason::Deadline => "deadline",
            Reason::LeaseLost => "lease_lost",
            Reason::LockLost => "lock_lost",
            Reason::Reacquire => "reacquire",
            Reason::Reacquired => "reacquired",
            Reason::Release => "release",
            Reason::AcquireTimeout => "acquire_timeout",
            Reason::WouldBlock => "would_block",
            Reason::AcquireFailed => "acquire_failed",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One transition, as passed to `on_state_change`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StateChange {
    /// The state left.
    pub from: State,
    /// The state entered.
    pub to: State,
    /// Why.
    pub reason: Reason,
}

impl fmt::Display for StateChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{} {}", self.from, self.to, self.reason)
    }
}

/// Why `permit()` refused to start a unit of work.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Refused {
    /// A keepalive failed; the holder waits for one to be confirmed.
    #[error("draining: a keepalive failed, no new work until one is confirmed")]
    Draining,
    /// The deadline passed or the lease was lost: the token is dead.
    #[error("fenced: the lock must be assumed lost")]
    Fenced,
    /// The lock was released.
    #[error("released")]
    Released,
    /// The lock is not held (not acquired yet).
    #[error("not held")]
    NotHeld,
}

impl Refused {
    /// The snake_case name shared by every binding.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refused::Draining => "draining",
            Refused::Fenced => "fenced",
            Refused::Released => "released",
            Refused::NotHeld => "not_held",
        }
    }

    /// The refusal's entry in the code table.
    pub const fn status(self) -> crate::codes::Code {
        use crate::codes::Code;
        match self {
            Refused::Draining => Code::Draining,
            Refused::Fenced => Code::Fenced,
            Refused::Released => Code::Released,
            Refused::NotHeld => Code::NotHeld,
        }
    }
}

/// The permit rule, shared by the machine and the published snapshot that
/// `permit()` reads: grant only while holding and before the deadline.
#[inline]
pub(crate) fn decide(state: State, deadline: Instant, now: Instant) -> Result<(), Refused> {
    match state {
        State::Holding if now < deadline => Ok(()),
        State::Draining if now < deadline => Err(Refused::Draining),
        State::Holding | State::Draining | State::Fenced | State::Reacquiring => {
            Err(Refused::Fenced)
        }
        State::Released => Err(Refused::Released),
        State::Idle | State::Acquiring => Err(Refused::NotHeld),
    }
}

/// Why an acquisition ended without the lock.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AcquireError {
    /// The wait for one's turn (a lock request queued at the service) ran
    /// out.
    Timeout,
    /// `try_acquire`: held by someone else.
    WouldBlock,
    /// Already holding it, or another acquire of this handle is in progress.
    AlreadyHeld,
    /// Released while acquiring.
    Released,
    /// The service failed or did not answer (`try_acquire`, or a timeout
    /// that ran out before any lock request was queued).
    Backend,
}

/// What the machine is told.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The application asks for the lock. `wait`: queue behind the current
    /// holder; `until`: give up at this instant (`None`: never).
    Acquire {
        /// Queue behind the holder instead of failing with `WouldBlock`.
        wait: bool,
        /// When to give up.
        until: Option<Instant>,
    },
    /// Reply to [`Action::Grant`].
    LeaseGranted {
        /// The request answered.
        req: ReqId,
        /// The new lease.
        lease: LeaseId,
        /// The TTL the server granted.
        ttl: Duration,
    },
    /// [`Action::Grant`] failed.
    GrantFailed {
        /// The request answered.
        req: ReqId,
    },
    /// Reply to [`Action::Lock`]: the lock is ours.
    Locked {
        /// The request answered.
        req: ReqId,
        /// The lease the lock is held under.
        lease: LeaseId,
        /// The fencing token.
        token: Token,
    },
    /// [`Action::Lock`] failed; `busy`: someone else holds it.
    LockFailed {
        /// The request answered.
        req: ReqId,
        /// Held by someone else (no-wait mode).
        busy: bool,
    },
    /// A keepalive reply granting `ttl` (zero means the lease is gone).
    KeepaliveConfirmed {
        /// The keepalive answered.
        req: ReqId,
        /// The TTL the server granted.
        ttl: Duration,
    },
    /// A keepalive failed (transport error, stream closed).
    KeepaliveFailed {
        /// The keepalive answered.
        req: ReqId,
    },
    /// The server says this lease (or the lock key under it) is gone.
    LeaseLost {
        /// The lease.
        lease: LeaseId,
    },
    /// The lock key held under `lease` is gone from the service although
    /// the lease may live: fence at once.
    LockLost {
        /// The lease the lock was held under.
        lease: LeaseId,
    },
    /// The application releases the lock.
    Release,
    /// `on_fence` of `token` has returned (the driver ran it).
    FenceDelivered {
        /// The fenced token.
        token: Token,
    },
    /// No permit is in flight any more, as asked by
    /// [`Holder::watching_permits`].
    PermitsEnded,
    /// The timer from [`Holder::poll_timeout`] fired (or any wake-up).
    Timer,
}

/// What the machine asks the driver to do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Ask for a lease. The machine took `now` as its send time: send at once.
    Grant {
        /// Matches the reply.
        req: ReqId,
        /// TTL to ask for.
        ttl: Duration,
    },
    /// Acquire the lock under `lease`.
    Lock {
        /// Matches the reply.
        req: ReqId,
        /// The lease to hold it under.
        lease: LeaseId,
        /// Queue behind the holder.
        wait: bool,
    },
    /// Send a keepalive. The machine took `now` as its send time: send at once.
    Keepalive {
        /// Matches the reply.
        req: ReqId,
        /// The lease.
        lease: LeaseId,
    },
    /// Revoke a lease where reachable (best effort; it expires anyway).
    Revoke {
        /// The lease.
        lease: LeaseId,
    },
    /// Publish the new state and call `on_state_change`.
    Transition(StateChange),
    /// Call `on_fence` for this token (once per token).
    Fence {
        /// The dead token.
        token: Token,
    },
    /// Call `on_acquired`, complete waiting acquirers.
    Acquired {
        /// The new token.
        token: Token,
    },
    /// Complete waiting acquirers with an error.
    AcquireFailed {
        /// Why.
        error: AcquireError,
    },
    /// Fail only the acquire call just made (the others go on).
    AcquireRefused {
        /// Why.
        error: AcquireError,
    },
    /// Call `on_drained`: the lock left `Holding` and no permit is in
    /// flight.
    Drained,
}

/// A fenced lease whose revoke waits (docs/design.md §11).
#[derive(Copy, Clone, Debug)]
struct HeldRevoke {
    lease: LeaseId,
    token: Token,
    /// `on_fence` returned.
    delivered: bool,
    /// No permit of the token is in flight.
    ended: bool,
    /// The server's expiry of the lease has surely passed by then.
    expired_by: Instant,
}

#[derive(Copy, Clone, Debug)]
struct Pending {
    req: ReqId,
    sent_at: Instant,
}

/// The sans-IO holder of one lock.
#[derive(Debug)]
pub struct Holder {
    opts: Options,
    state: State,
    next_req: ReqId,
    /// Lease of the current session, once granted.
    lease: Option<LeaseId>,
    /// Outstanding lease grant.
    grant: Option<Pending>,
    /// Outstanding lock request.
    lock_req: Option<(ReqId, LeaseId)>,
    /// Outstanding keepalives of this lease, oldest first.
    keepalives: VecDeque<Pending>,
    /// Local deadline of the lease (and of the lock while holding).
    deadline: Option<Instant>,
    next_keepalive: Option<Instant>,
    /// A keepalive failed and none was confirmed since: retrying.
    failing: bool,
    keepalive_retry_at: Option<Instant>,
    acquire_retry_at: Option<Instant>,
    token: Option<Token>,
    last_token: Option<Token>,
    wait: bool,
    give_up_at: Option<Instant>,
    /// Send time of the last request that may have renewed the lease.
    last_renewal: Option<Instant>,
    /// The TTL granted for the current lease.
    granted_ttl: Duration,
    /// Left `Holding`: waiting for the last permit in flight to end.
    watching: bool,
    /// No permit in flight since the lock left `Holding`.
    quiet: bool,
    held: Vec<HeldRevoke>,
    actions: VecDeque<Action>,
}

impl Holder {
    /// A holder in state `Idle`. `opts` should have passed
    /// [`Options::validate`].
    pub fn new(opts: Options) -> Holder {
        Holder {
            opts,
            state: State::Idle,
            next_req: 1,
            lease: None,
            grant: None,
            lock_req: None,
            keepalives: VecDeque::new(),
            deadline: None,
            next_keepalive: None,
            failing: false,
            keepalive_retry_at: None,
            acquire_retry_at: None,
            token: None,
            last_token: None,
            wait: false,
            give_up_at: None,
            last_renewal: None,
            granted_ttl: Duration::ZERO,
            watching: false,
            quiet: false,
            held: Vec::new(),
            actions: VecDeque::new(),
        }
    }

    /// Whether the driver must report [`Event::PermitsEnded`] once no
    /// permit is in flight (drain detection is the machine's).
    pub fn watching_permits(&self) -> bool {
        self.watching || self.held.iter().any(|h| !h.ended)
    }

    /// The lease a guarded write of `token` is made under, if `token` is the
    /// one held now and its deadline has not passed: a write with any other
    /// token (stale, or not this holder's) is refused before any request.
    pub fn write_lease(&self, now: Instant, token: Token) -> Option<LeaseId> {
        let holding = matches!(self.state, State::Holding | State::Draining);
        (holding && self.token == Some(token) && self.deadline.is_some_and(|d| now < d))
            .then_some(self.lease)
            .flatten()
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// The token held (while `Holding` or `Draining`).
    pub fn token(&self) -> Option<Token> {
        self.token
    }

    /// The local deadline of the current lease, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The current lease, if any.
    pub fn lease(&self) -> Option<LeaseId> {
        self.lease
    }

    /// The permit rule at `now`: the token and deadline, or why not.
    pub fn permit(&self, now: Instant) -> Result<(Token, Instant), Refused> {
        let deadline = self.deadline.unwrap_or(Instant::ZERO);
        decide(self.state, deadline, now)?;
        Ok((self.token.expect("holding without a token"), deadline))
    }

    /// The next action to perform, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When the driver must call `handle(now, Event::Timer)` next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timeout = self.opts.keepalive_timeout;
        let acquiring = self.state == State::Acquiring;
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
        if acquiring {
            consider(self.give_up_at);
        }
        for p in &self.keepalives {
            consider(Some(p.sent_at + timeout));
        }
        consider(self.grant.map(|p| p.sent_at + timeout));
        if self.failing {
            consider(self.keepalive_retry_at);
        } else {
            consider(self.next_keepalive);
        }
        consider(self.acquire_retry_at);
        for h in &self.held {
            consider(Some(h.expired_by));
        }
        at
    }

    /// Feeds one event at `now`. Timers due at `now` are handled first, so a
    /// reply that arrives after the deadline finds the token already fenced.
    pub fn handle(&mut self, now: Instant, event: Event) {
        if event == Event::PermitsEnded {
            // Observed before any timer due now: a fence those timers cause
            // may follow a permit granted after the observation.
            self.on_permits_ended(now);
            self.poll_timers(now);
            return;
        }
        self.poll_timers(now);
        match event {
            Event::Acquire { wait, until } => self.on_acquire(now, wait, until),
            Event::LeaseGranted { req, lease, ttl } => self.on_granted(now, req, lease, ttl),
            Event::GrantFailed { req } => {
                if self.grant.is_some_and(|p| p.req == req) {
                    self.grant = None;
                    self.acquire_attempt_failed(now);
                }
            }
            Event::Locked { req, lease, token } => self.on_locked(now, req, lease, token),
            Event::LockFailed { req, busy } => {
                if self.lock_req.is_some_and(|(r, _)| r == req) {
                    self.lock_req = None;
                    if busy && !self.wait {
                        self.fail_acquire(AcquireError::WouldBlock, Reason::WouldBlock);
                    } else {
                        self.acquire_attempt_failed(now);
                    }
                }
            }
            Event::KeepaliveConfirmed { req, ttl } => self.on_confirmed(now, req, ttl),
            Event::KeepaliveFailed { req } => {
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
            Event::LockLost { lease } => {
                let holding = matches!(self.state, State::Holding | State::Draining);
                if holding && self.lease == Some(lease) {
                    self.lease_gone(now, Reason::LockLost);
                }
            }
            Event::Release => self.on_release(),
            Event::FenceDelivered { token } => {
                for h in self.held.iter_mut().filter(|h| h.token == token) {
                    h.delivered = true;
                }
                self.release_held(now);
            }
            Event::PermitsEnded => unreachable!("handled first"),
            Event::Timer => {}
        }
        self.poll_timers(now);
    }

    fn req(&mut self) -> ReqId {
        let r = self.next_req;
        self.next_req += 1;
        r
    }

    fn transition(&mut self, to: State, reason: Reason) {
        let from = self.state;
        self.state = to;
        if from == State::Holding && matches!(to, State::Draining | State::Fenced) {
            // A drain or a fence: no new permits; wait for the last one.
            self.watching = true;
            self.quiet = false;
        }
        if to == State::Holding {
            // A drain begun goes on through a release: on_drained still
            // tells when the last permit ended.
            self.watching = false;
        }
        self.actions
            .push_back(Action::Transition(StateChange { from, to, reason }));
    }

    fn acquiring(&self) -> bool {
        matches!(self.state, State::Acquiring | State::Reacquiring)
    }

    /// Forgets the session (lease, requests, timers); revokes the lease.
    fn end_session(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.actions.push_back(Action::Revoke { lease });
        }
        self.forget_session();
    }

    /// A fenced token's lease: revoked once `on_fence` returned and no
    /// permit is in flight, or once the server's expiry has passed anyway.
    fn hold_revoke(&mut self, now: Instant, token: Token) {
        if let Some(lease) = self.lease.take() {
            let renewed = self.last_renewal.unwrap_or(now);
            self.held.push(HeldRevoke {
                lease,
                token,
                delivered: false,
                // `quiet` speaks of the drain now under way only.
                ended: self.state != State::Holding && self.quiet,
                expired_by: renewed + self.granted_ttl,
            });
        }
        self.forget_session();
    }

    /// No permit is in flight: the drain under way is over, and so is the
    /// work of every fenced token.
    fn on_permits_ended(&mut self, now: Instant) {
        if self.watching {
            self.watching = false;
            self.quiet = true;
            self.actions.push_back(Action::Drained);
        }
        for h in &mut self.held {
            h.ended = true;
        }
        self.release_held(now);
    }

    /// Revokes a lease a stray reply names, unless it is the current one or
    /// a fenced one whose revoke is held back.
    fn revoke_stray(&mut self, lease: LeaseId) {
        if self.lease != Some(lease) && !self.held.iter().any(|h| h.lease == lease) {
            self.actions.push_back(Action::Revoke { lease });
        }
    }

    fn release_held(&mut self, now: Instant) {
        let actions = &mut self.actions;
        self.held.retain(|h| {
            let go = (h.delivered && h.ended) || now >= h.expired_by;
            if go {
                actions.push_back(Action::Revoke { lease: h.lease });
            }
            !go
        });
    }

    fn forget_session(&mut self) {
        self.last_renewal = None;
        self.grant = None;
        self.lock_req = None;
        self.keepalives.clear();
        self.deadline = None;
        self.next_keepalive = None;
        self.failing = false;
        self.keepalive_retry_at = None;
        self.acquire_retry_at = None;
    }

    fn start_session(&mut self, now: Instant) {
        self.end_session();
        let req = self.req();
        self.grant = Some(Pending { req, sent_at: now });
        self.actions.push_back(Action::Grant {
            req,
            ttl: self.opts.ttl,
        });
    }

    fn on_acquire(&mut self, now: Instant, wait: bool, until: Option<Instant>) {
        match self.state {
            State::Idle | State::Released | State::Fenced => {
                self.wait = wait;
                self.give_up_at = until;
                self.transition(State::Acquiring, Reason::Acquire);
                self.start_session(now);
            }
            // One acquire at a time per handle: the one in progress goes on.
            State::Acquiring | State::Holding | State::Draining => {
                self.actions.push_back(Action::AcquireRefused {
                    error: AcquireError::AlreadyHeld,
                })
            }
            // The lock wants itself back anyway: wait for the reacquisition.
            State::Reacquiring => {}
        }
    }

    fn on_granted(&mut self, now: Instant, req: ReqId, lease: LeaseId, ttl: Duration) {
        let Some(p) = self.grant.filter(|p| p.req == req && self.acquiring()) else {
            // A grant we gave up on: its lease would only block us (a
            // duplicate reply for the current lease must not revoke it).
            self.revoke_stray(lease);
            return;
        };
        self.grant = None;
        if ttl.is_zero() {
            self.actions.push_back(Action::Revoke { lease });
            self.acquire_attempt_failed(now);
            return;
        }
        self.lease = Some(lease);
        self.granted_ttl = ttl;
        self.last_renewal = Some(p.sent_at);
        self.deadline = Some(p.sent_at + ttl - self.opts.margin);
        self.next_keepalive = Some(p.sent_at + self.opts.keepalive_interval);
        self.send_lock(lease);
    }

    fn send_lock(&mut self, lease: LeaseId) {
        let req = self.req();
        self.lock_req = Some((req, lease));
        self.actions.push_back(Action::Lock {
            req,
            lease,
            wait: self.wait,
        });
    }

    fn on_locked(&mut self, now: Instant, req: ReqId, lease: LeaseId, token: Token) {
        if self.lock_req.is_none_or(|(r, _)| r != req) || !self.acquiring() {
            self.revoke_stray(lease);
            return;
        }
        self.lock_req = None;
        if self.last_token.is_some_and(|last| token <= last) {
            tracing::error!(%token, last = ?self.last_token, "lock service returned a token that is not higher; acquiring again");
            self.start_session(now);
            return;
        }
        self.token = Some(token);
        self.last_token = Some(token);
        self.give_up_at = None;
        let reason = if self.state == State::Reacquiring {
            Reason::Reacquired
        } else {
            Reason::Acquired
        };
        self.transition(State::Holding, reason);
        self.actions.push_back(Action::Acquired { token });
        if self.failing {
            self.transition(State::Draining, Reason::KeepaliveFailed);
        }
    }

    fn acquire_attempt_failed(&mut self, now: Instant) {
        if !self.acquiring() {
            return;
        }
        if self.wait {
            self.acquire_retry_at = Some(now + self.opts.retry_interval);
        } else {
            self.fail_acquire(AcquireError::Backend, Reason::AcquireFailed);
        }
    }

    fn fail_acquire(&mut self, error: AcquireError, reason: Reason) {
        self.end_session();
        self.give_up_at = None;
        self.wait = false;
        self.transition(State::Idle, reason);
        self.actions.push_back(Action::AcquireFailed { error });
    }

    fn on_confirmed(&mut self, now: Instant, req: ReqId, ttl: Duration) {
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
        let d = p.sent_at + ttl - self.opts.margin;
        self.deadline = Some(self.deadline.map_or(d, |old| old.max(d)));
        self.next_keepalive = Some(p.sent_at + self.opts.keepalive_interval);
        self.failing = false;
        self.keepalive_retry_at = None;
        if self.state == State::Draining {
            self.transition(State::Holding, Reason::Resumed);
        }
    }

    fn keepalive_failed(&mut self, now: Instant, reason: Reason) {
        if self.failing || self.lease.is_none() {
            return;
        }
        self.failing = true;
        self.keepalive_retry_at = Some(now + self.opts.retry_interval);
        if self.state == State::Holding {
            self.transition(State::Draining, reason);
        }
    }

    /// The lease is gone (deadline passed, or the server said so).
    fn lease_gone(&mut self, now: Instant, reason: Reason) {
        match self.state {
            State::Holding | State::Draining => {
                let token = self.token.take().expect("holding without a token");
                self.hold_revoke(now, token);
                self.transition(State::Fenced, reason);
                self.actions.push_back(Action::Fence { token });
                if self.opts.reacquire {
                    self.wait = true;
                    self.give_up_at = None;
                    self.transition(State::Reacquiring, Reason::Reacquire);
                    self.start_session(now);
                }
            }
            // No token to fence: start over with a fresh lease.
            State::Acquiring | State::Reacquiring => self.start_session(now),
            State::Idle | State::Fenced | State::Released => self.end_session(),
        }
    }

    fn on_release(&mut self) {
        if self.state == State::Released {
            return;
        }
        let was_acquiring = self.acquiring();
        self.end_session();
        self.token = None;
        self.give_up_at = None;
        self.transition(State::Released, Reason::Release);
        if was_acquiring {
            self.actions.push_back(Action::AcquireFailed {
                error: AcquireError::Released,
            });
        }
    }

    fn send_keepalive(&mut self, now: Instant) {
        let Some(lease) = self.lease else { return };
        let req = self.req();
        self.last_renewal = Some(now);
        self.keepalives.push_back(Pending { req, sent_at: now });
        self.actions.push_back(Action::Keepalive { req, lease });
    }

    fn poll_timers(&mut self, now: Instant) {
        if self.deadline.is_some_and(|d| now >= d) {
            self.lease_gone(now, Reason::Deadline);
        }
        if self.state == State::Acquiring && self.give_up_at.is_some_and(|t| now >= t) {
            // `timeout` only for a wait in the queue; a service that never
            // let the request be queued is a backend failure.
            let error = if self.lock_req.is_some() {
                AcquireError::Timeout
            } else {
                AcquireError::Backend
            };
            self.fail_acquire(error, Reason::AcquireTimeout);
        }
        let timeout = self.opts.keepalive_timeout;
        let before = self.keepalives.len();
        self.keepalives.retain(|p| now < p.sent_at + timeout);
        if self.keepalives.len() < before {
            self.keepalive_failed(now, Reason::KeepaliveTimeout);
        }
        if self.grant.is_some_and(|p| now >= p.sent_at + timeout) {
            self.grant = None;
            self.acquire_attempt_failed(now);
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
        if self.acquire_retry_at.is_some_and(|t| now >= t) {
            self.acquire_retry_at = None;
            match self.lease {
                Some(lease) if self.lock_req.is_none() => self.send_lock(lease),
                Some(_) => {}
                None => self.start_session(now),
            }
        }
        // Last: a fence above (late, after a starved driver) may hold a
        // lease that has run out already.
        if self.held.iter().any(|h| now >= h.expired_by) {
            self.release_held(now);
        }
    }
}

#[cfg(test)]
mod tests;
