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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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

/// Names one lock of a session's machine (given to [`Holder::add_lock`],
/// never reused).
pub type LockId = u64;

/// What the machine is told.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The application asks for lock `lock`. `wait`: queue behind the
    /// current holder; `until`: give up at this instant (`None`: never).
    Acquire {
        /// The lock.
        lock: LockId,
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
        /// The lock.
        lock: LockId,
        /// The lease the lock is held under.
        lease: LeaseId,
        /// The fencing token.
        token: Token,
    },
    /// [`Action::Lock`] failed; `busy`: someone else holds it.
    LockFailed {
        /// The request answered.
        req: ReqId,
        /// The lock.
        lock: LockId,
        /// Held by someone else (no-wait mode).
        busy: bool,
    },
    /// [`Action::Unlock`] is done: the key is deleted (or was absent).
    Unlocked {
        /// The request answered.
        req: ReqId,
        /// The lock.
        lock: LockId,
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
    /// The server says this lease is gone: every lock held under it fences.
    LeaseLost {
        /// The lease.
        lease: LeaseId,
    },
    /// The key of `lock` held with `token` is gone from the service while
    /// the lease lives (an operator deleted it): that lock alone fences.
    LockLost {
        /// The lock.
        lock: LockId,
        /// The acquisition whose key went.
        token: Token,
    },
    /// The application releases `lock`.
    Release {
        /// The lock.
        lock: LockId,
    },
    /// The session is closed: every lock is released and the lease revoked.
    Close,
    /// `on_fence` of `token` has returned (the driver ran it).
    FenceDelivered {
        /// The lock.
        lock: LockId,
        /// The fenced token.
        token: Token,
    },
    /// No permit of `lock` is in flight any more, as asked by
    /// [`Holder::watching_permits`].
    PermitsEnded {
        /// The lock.
        lock: LockId,
    },
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
    /// Acquire lock `lock` under `lease` (put its key, wait for its turn).
    Lock {
        /// Matches the reply.
        req: ReqId,
        /// The lock.
        lock: LockId,
        /// The lease to hold it under.
        lease: LeaseId,
        /// Queue behind the holder.
        wait: bool,
    },
    /// Delete the key of `lock` under `lease` (the lease lives on): with the
    /// token held, or `None` for an acquisition cut short, whose request in
    /// flight is to be abandoned first. Retried until done.
    Unlock {
        /// Matches the reply.
        req: ReqId,
        /// The lock.
        lock: LockId,
        /// The lease the key is under.
        lease: LeaseId,
        /// The acquisition to delete, if known.
        token: Option<Token>,
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
    /// Publish the new state of `lock` and call its `on_state_change`.
    Transition {
        /// The lock.
        lock: LockId,
        /// The change.
        change: StateChange,
    },
    /// The session's deadline moved: publish it to every held lock.
    Deadline,
    /// Call `on_fence` of `lock` for this token (once per token).
    Fence {
        /// The lock.
        lock: LockId,
        /// The dead token.
        token: Token,
    },
    /// Call `on_acquired` of `lock`, complete its waiting acquirers, watch
    /// its key.
    Acquired {
        /// The lock.
        lock: LockId,
        /// The new token.
        token: Token,
    },
    /// Complete the waiting acquirers of `lock` with an error.
    AcquireFailed {
        /// The lock.
        lock: LockId,
        /// Why.
        error: AcquireError,
    },
    /// Fail only the acquire call of `lock` just made (the others go on).
    AcquireRefused {
        /// The lock.
        lock: LockId,
        /// Why.
        error: AcquireError,
    },
    /// Call `on_drained` of `lock`: it left `Holding` and no permit is in
    /// flight.
    Drained {
        /// The lock.
        lock: LockId,
    },
}

/// A fenced token whose lease's revoke waits for it (docs/design.md §11).
#[derive(Copy, Clone, Debug)]
struct FencedToken {
    lock: LockId,
    token: Token,
    /// `on_fence` returned.
    delivered: bool,
    /// No permit of the token is in flight.
    ended: bool,
}

/// A fenced lease whose revoke waits until every token fenced with it is
/// delivered and ended, or its server-side expiry has surely passed.
#[derive(Clone, Debug)]
struct HeldRevoke {
    lease: LeaseId,
    tokens: Vec<FencedToken>,
    expired_by: Instant,
}

#[derive(Copy, Clone, Debug)]
struct Pending {
    req: ReqId,
    sent_at: Instant,
}

/// One lock of the session.
#[derive(Debug)]
struct Slot {
    name: std::sync::Arc<str>,
    state: State,
    token: Option<Token>,
    last_token: Option<Token>,
    wait: bool,
    give_up_at: Option<Instant>,
    /// Outstanding lock request, under the lease of the session.
    lock_req: Option<ReqId>,
    /// Waiting for its turn (a lock request queued at the service, or
    /// behind another lock of this session with the same name).
    queued: bool,
    acquire_retry_at: Option<Instant>,
    /// Outstanding delete of this lock's key under the current lease.
    unlocking: Option<ReqId>,
    /// Left `Holding`: waiting for the last permit in flight to end.
    watching: bool,
    /// No permit in flight since the lock left `Holding`.
    quiet: bool,
}

impl Slot {
    fn acquiring(&self) -> bool {
        matches!(self.state, State::Acquiring | State::Reacquiring)
    }

    fn holding(&self) -> bool {
        matches!(self.state, State::Holding | State::Draining)
    }

    /// Sets how the next acquisition waits and forgets the last one's
    /// timers and queue place.
    fn start_attempt(&mut self, wait: bool, give_up_at: Option<Instant>) {
        self.wait = wait;
        self.give_up_at = give_up_at;
        self.queued = false;
        self.acquire_retry_at = None;
    }
}

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
    locks: BTreeMap<LockId, Slot>,
    /// The locks acquiring (the only ones with timers of their own).
    pending: BTreeSet<LockId>,
    /// Per name, the lock of this session whose key under the current
    /// lease may exist: another lock of the same name waits for it to go.
    keys: HashMap<std::sync::Arc<str>, LockId>,
    held: Vec<HeldRevoke>,
    actions: VecDeque<Action>,
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
            actions: VecDeque::new(),
        }
    }

    /// Adds the lock `id` called `name` (in state `Idle`); `id` is the
    /// caller's and must be new.
    pub fn add_lock(&mut self, id: LockId, name: impl Into<std::sync::Arc<str>>) {
        self.locks.insert(
            id,
            Slot {
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
            },
        );
    }

    /// Whether `lock` has nothing left to do: released, its key deleted, no
    /// permit awaited and no fenced token of it waiting. The driver then
    /// removes a lock whose handle is gone.
    pub fn finished(&self, lock: LockId) -> bool {
        self.locks.get(&lock).is_none_or(|s| {
            s.state == State::Released
                && s.unlocking.is_none()
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

    /// Whether the session has nothing left to do once closed: no lock, no
    /// held revoke.
    pub fn idle(&self) -> bool {
        self.locks.is_empty() && self.held.is_empty()
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

    /// The next action to perform, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

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
        at
    }

    /// Feeds one event at `now`. Timers due at `now` are handled first, so a
    /// reply that arrives after the deadline finds the token already fenced.
    pub fn handle(&mut self, now: Instant, event: Event) {
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
            Event::GrantFailed { req } => {
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
            Event::LockFailed { req, lock, busy } => self.on_lock_failed(now, req, lock, busy),
            Event::Unlocked { req, lock } => {
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
            Event::Close => self.on_close(now),
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
        self.actions.push_back(Action::Transition {
            lock,
            change: StateChange { from, to, reason },
        });
    }

    /// Whether any lock waits for a lease.
    fn wants_lease(&self) -> bool {
        !self.closed && !self.pending.is_empty()
    }

    /// Asks for a lease if a lock waits for one and none is coming.
    fn ensure_lease(&mut self, now: Instant) {
        if self.lease.is_none()
            && self.grant.is_none()
            && self.grant_retry_at.is_none()
            && self.wants_lease()
        {
            let req = self.req();
            self.grant = Some(Pending { req, sent_at: now });
            self.actions.push_back(Action::Grant {
                req,
                ttl: self.opts.ttl,
            });
        }
    }

    /// Forgets the lease and everything tied to it (requests, timers, key
    /// records); the caller revokes it or holds its revoke.
    fn forget_lease(&mut self) {
        self.lease = None;
        self.last_renewal = None;
        self.keepalives.clear();
        self.deadline = None;
        self.next_keepalive = None;
        self.failing = false;
        self.keepalive_retry_at = None;
        self.keys.clear();
        for s in self.locks.values_mut() {
            // Requests under the old lease are abandoned (the driver aborts
            // them with the lease); its keys went with it.
            s.lock_req = None;
            s.unlocking = None;
        }
        self.actions.push_back(Action::Deadline);
    }

    /// No permit of `lock` is in flight: its drain under way is over, and so
    /// is the work of its fenced tokens.
    fn on_permits_ended(&mut self, now: Instant, lock: LockId) {
        if let Some(s) = self.locks.get_mut(&lock)
            && s.watching
        {
            s.watching = false;
            s.quiet = true;
            self.actions.push_back(Action::Drained { lock });
        }
        for h in &mut self.held {
            for t in h.tokens.iter_mut().filter(|t| t.lock == lock) {
                t.ended = true;
            }
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
            let go = h.tokens.iter().all(|t| t.delivered && t.ended) || now >= h.expired_by;
            if go {
                actions.push_back(Action::Revoke { lease: h.lease });
            }
            !go
        });
    }

    fn on_acquire(&mut self, now: Instant, lock: LockId, wait: bool, until: Option<Instant>) {
        if self.closed {
            self.actions.push_back(Action::AcquireRefused {
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
                self.actions.push_back(Action::AcquireRefused {
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
    fn try_lock(&mut self, now: Instant, lock: LockId) {
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
        self.actions.push_back(Action::Lock {
            req,
            lock,
            lease,
            wait,
        });
    }

    /// Sends the lock requests that can go now: of the locks called `name`
    /// (a key just freed), or of every acquiring lock (a new lease).
    fn send_waiting(&mut self, now: Instant, name: Option<&std::sync::Arc<str>>) {
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

    fn on_granted(&mut self, now: Instant, req: ReqId, lease: LeaseId, ttl: Duration) {
        let Some(p) = self.grant.filter(|p| p.req == req) else {
            // A grant we gave up on: its lease would only block us (a
            // duplicate reply for the current lease must not revoke it).
            self.revoke_stray(lease);
            return;
        };
        self.grant = None;
        if ttl.is_zero() || self.closed {
            self.actions.push_back(Action::Revoke { lease });
            self.grant_failed(now);
            return;
        }
        self.lease = Some(lease);
        self.granted_ttl = ttl;
        self.last_renewal = Some(p.sent_at);
        self.deadline = Some(p.sent_at + ttl - self.opts.margin);
        self.next_keepalive = Some(p.sent_at + self.opts.keepalive_interval);
        self.actions.push_back(Action::Deadline);
        self.send_waiting(now, None);
    }

    /// No lease this time: a `try_acquire` fails, waiting locks try again
    /// after the retry interval.
    fn grant_failed(&mut self, now: Instant) {
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
            self.fail_acquire(id, AcquireError::Backend, Reason::AcquireFailed);
        }
        if self.wants_lease() {
            self.grant_retry_at = Some(now + self.opts.retry_interval);
        }
    }

    fn on_locked(&mut self, now: Instant, req: ReqId, lock: LockId, lease: LeaseId, token: Token) {
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
                let req = self.req();
                self.actions.push_back(Action::Unlock {
                    req,
                    lock,
                    lease,
                    token: Some(token),
                });
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
        self.actions.push_back(Action::Acquired { lock, token });
        if self.failing {
            self.transition(lock, State::Draining, Reason::KeepaliveFailed);
        }
        let _ = now;
    }

    fn on_lock_failed(&mut self, now: Instant, req: ReqId, lock: LockId, busy: bool) {
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
            self.fail_acquire(lock, AcquireError::Backend, Reason::AcquireFailed);
        } else {
            // The request may have put the key: trying again finds it.
            s.acquire_retry_at = Some(now + self.opts.retry_interval);
        }
    }

    /// Deletes the key an acquisition of `lock` may have put under the
    /// current lease (a request cut short): the lock waits for the delete
    /// before asking again.
    fn drop_key(&mut self, lock: LockId) {
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
    fn unlock_key(&mut self, lock: LockId, lease: LeaseId, token: Option<Token>) {
        let req = self.req();
        let s = self.slot(lock);
        s.lock_req = None;
        s.unlocking = Some(req);
        self.actions.push_back(Action::Unlock {
            req,
            lock,
            lease,
            token,
        });
    }

    fn fail_acquire(&mut self, lock: LockId, error: AcquireError, reason: Reason) {
        self.drop_key(lock);
        self.slot(lock).start_attempt(false, None);
        self.transition(lock, State::Idle, reason);
        self.actions
            .push_back(Action::AcquireFailed { lock, error });
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
        // A held revoke's fallback (last renewal + TTL) must not come
        // before the expiry of a renewal this TTL was granted for.
        self.granted_ttl = self.granted_ttl.max(ttl);
        let d = p.sent_at + ttl - self.opts.margin;
        let deadline = self.deadline.map_or(d, |old| old.max(d));
        if self.deadline != Some(deadline) {
            self.deadline = Some(deadline);
            self.actions.push_back(Action::Deadline);
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

    fn keepalive_failed(&mut self, now: Instant, reason: Reason) {
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

    /// Fences the token `lock` holds; it acquires again if the options say
    /// so. The caller deals with the lease.
    fn fence(&mut self, lock: LockId, reason: Reason) -> Option<Token> {
        let s = self.slot(lock);
        if !s.holding() {
            return None;
        }
        let token = s.token.take().expect("holding without a token");
        self.transition(lock, State::Fenced, reason);
        self.actions.push_back(Action::Fence { lock, token });
        if self.opts.reacquire && !self.closed {
            // A reacquisition always waits its turn, with no deadline.
            self.slot(lock).start_attempt(true, None);
            self.transition(lock, State::Reacquiring, Reason::Reacquire);
        }
        Some(token)
    }

    /// The lease is gone (deadline passed, or the server said so): every
    /// lock held under it fences, and the session takes a new lease for the
    /// locks that acquire again.
    fn lease_gone(&mut self, now: Instant, reason: Reason) {
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
            self.actions.push_back(Action::Revoke { lease });
        } else {
            self.held.push(HeldRevoke {
                lease,
                tokens,
                expired_by,
            });
        }
        self.ensure_lease(now);
    }

    /// The key of `lock` was deleted under a live lease: that lock alone
    /// fences and, if it acquires again, does so under the same lease.
    fn on_lock_lost(&mut self, now: Instant, lock: LockId, token: Token) {
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

    fn on_release(&mut self, now: Instant, lock: LockId) {
        let Some(s) = self.locks.get(&lock) else {
            return;
        };
        if s.state == State::Released {
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
            self.actions.push_back(Action::AcquireFailed {
                lock,
                error: AcquireError::Released,
            });
        }
        self.send_waiting(now, Some(&name));
    }

    /// Closes the session: every lock is released and the lease revoked
    /// (one request deletes every key).
    fn on_close(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        self.closed = true;
        let ids: Vec<LockId> = self.locks.keys().copied().collect();
        let lease = self.lease;
        // The revoke deletes every key: no delete of its own per lock.
        self.forget_lease();
        for id in ids {
            self.on_release(now, id);
        }
        self.grant = None;
        self.grant_retry_at = None;
        if let Some(lease) = lease {
            self.actions.push_back(Action::Revoke { lease });
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
                AcquireError::Backend
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
        // Last: a fence above (late, after a starved driver) may hold a
        // lease that has run out already.
        if self.held.iter().any(|h| now >= h.expired_by) {
            self.release_held(now);
        }
    }
}

#[cfg(test)]
mod tests;
