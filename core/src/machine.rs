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
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// that ran out before any lock request was queued): the service's last
    /// error text of this session, `None` if it only did not answer.
    Backend(Option<String>),
    /// The service refused the request for good (too large): trying again
    /// cannot succeed. The service's text.
    Refused(String),
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
        /// The service's error text.
        error: String,
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
        /// The service's error text.
        error: String,
    },
    /// [`Action::Lock`] was refused for good: the service can never take
    /// the request (etcd: "request is too large"). An acquisition fails at
    /// once ([`AcquireError::Refused`]) instead of trying until its timeout.
    LockRefused {
        /// The request answered.
        req: ReqId,
        /// The lock.
        lock: LockId,
        /// The service's error text.
        error: String,
    },
    /// [`Action::Unlock`] is done: the key is deleted (or was absent).
    Unlocked {
        /// The request answered.
        req: ReqId,
        /// The lock.
        lock: LockId,
    },
    /// [`Action::Unlock`] failed: it is sent again after the retry
    /// interval.
    UnlockFailed {
        /// The request answered.
        req: ReqId,
    },
    /// [`Action::Revoke`] is done: the lease is gone (or was already).
    Revoked {
        /// The lease.
        lease: LeaseId,
    },
    /// [`Action::Revoke`] failed: it is sent again after the retry
    /// interval.
    RevokeFailed {
        /// The lease.
        lease: LeaseId,
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
    /// The application resigns `lock` (an election's leader steps down):
    /// no new permit from now on; the key is deleted once the permits in
    /// flight end, or at `grace` from now, whichever is first, so the next
    /// leader never starts while this one's work may still run.
    Resign {
        /// The lock.
        lock: LockId,
        /// The longest wait for the permits in flight.
        grace: Duration,
    },
    /// The session is closed: every lock is released and the lease revoked.
    /// `waiter`: a `Session::close` call, answered by
    /// [`Action::CloseDone`] (the handles' drop waits for nothing).
    Close {
        /// The close call to answer.
        waiter: Option<u64>,
    },
    /// One acquisition of `lock` is cancelled (`Acquisition::cancel`, a
    /// dropped future): it must leave nothing held. `None`: the acquisition
    /// in progress is cut short (its key, if put, is deleted); `Some`: it
    /// succeeded with this token, released only if `lock` still holds it.
    Cancel {
        /// The lock.
        lock: LockId,
        /// The token the cancelled acquisition won, if it did.
        token: Option<Token>,
    },
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

/// What the machine asks of the lock service (quinn-proto's transmits):
/// the driver sends each at once, as its own task, and feeds the reply
/// back as an [`Event`].
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// Ask for a lease. The machine took `now` as its send time: send at once.
    Grant {
        /// Matches the reply.
        req: ReqId,
        /// TTL to ask for.
        ttl: Duration,
        /// The session's bounds on the call.
        bounds: Bounds,
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
    /// token held, or `None` for an acquisition cut short. Sent again (same
    /// `req`) every retry interval until answered; a new try replaces the
    /// one before it.
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
        /// The session's bounds on the call.
        bounds: Bounds,
    },
    /// Revoke a lease. Sent again every retry interval until answered (a
    /// lease we know is ours and dead must not outlive an outage); a new
    /// try replaces the one before it.
    Revoke {
        /// The lease.
        lease: LeaseId,
    },
    /// Stop waiting for request `req` (drop the call in flight): no reply
    /// to it can matter any more.
    Abandon {
        /// The request.
        req: ReqId,
    },
}

/// The bounds of one backend call, stamped on the request by the machine
/// from its own session's settings: backends keep no settings of their own,
/// so a session with settings of its own is timed by them on every engine.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The longest the call may take: the session's `keepalive_timeout`,
    /// after which the machine counts a grant or keepalive failed (the
    /// backend gives up then too, and leaves an endpoint that did not
    /// answer).
    pub timeout: Duration,
    /// The pause before trying again after a failure (a stream opened
    /// again): the session's `retry_interval`.
    pub retry: Duration,
}

/// What the machine tells the application (quinn-proto's events): the
/// driver publishes states and runs callbacks and answers calls.
#[derive(Clone, Debug, PartialEq)]
pub enum Notice {
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
    /// Answer the `release()` calls of `lock`: its key's delete had its
    /// first try (or there was none to make).
    ReleaseDone {
        /// The lock.
        lock: LockId,
    },
    /// Answer the `Session::close` call `waiter`: the lease's revoke had
    /// its first try, or a fenced lease's held revoke did, or a keepalive
    /// timeout passed.
    CloseDone {
        /// The call.
        waiter: u64,
    },
}

/// Either output of the machine, in the order it was produced (for tests
/// and tools; the driver polls the two queues apart).
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Action {
    Grant {
        req: ReqId,
        ttl: Duration,
    },
    Lock {
        req: ReqId,
        lock: LockId,
        lease: LeaseId,
        wait: bool,
    },
    Unlock {
        req: ReqId,
        lock: LockId,
        lease: LeaseId,
        token: Option<Token>,
    },
    Keepalive {
        req: ReqId,
        lease: LeaseId,
    },
    Revoke {
        lease: LeaseId,
    },
    Abandon {
        req: ReqId,
    },
    Transition {
        lock: LockId,
        change: StateChange,
    },
    Deadline,
    Fence {
        lock: LockId,
        token: Token,
    },
    Acquired {
        lock: LockId,
        token: Token,
    },
    AcquireFailed {
        lock: LockId,
        error: AcquireError,
    },
    AcquireRefused {
        lock: LockId,
        error: AcquireError,
    },
    Drained {
        lock: LockId,
    },
    ReleaseDone {
        lock: LockId,
    },
    CloseDone {
        waiter: u64,
    },
}

impl From<Request> for Action {
    fn from(r: Request) -> Action {
        match r {
            Request::Grant { req, ttl, .. } => Action::Grant { req, ttl },
            Request::Lock {
                req,
                lock,
                lease,
                wait,
            } => Action::Lock {
                req,
                lock,
                lease,
                wait,
            },
            Request::Unlock {
                req,
                lock,
                lease,
                token,
            } => Action::Unlock {
                req,
                lock,
                lease,
                token,
            },
            Request::Keepalive { req, lease, .. } => Action::Keepalive { req, lease },
            Request::Revoke { lease } => Action::Revoke { lease },
            Request::Abandon { req } => Action::Abandon { req },
        }
    }
}

impl From<Notice> for Action {
    fn from(n: Notice) -> Action {
        match n {
            Notice::Transition { lock, change } => Action::Transition { lock, change },
            Notice::Deadline => Action::Deadline,
            Notice::Fence { lock, token } => Action::Fence { lock, token },
            Notice::Acquired { lock, token } => Action::Acquired { lock, token },
            Notice::AcquireFailed { lock, error } => Action::AcquireFailed { lock, error },
            Notice::AcquireRefused { lock, error } => Action::AcquireRefused { lock, error },
            Notice::Drained { lock } => Action::Drained { lock },
            Notice::ReleaseDone { lock } => Action::ReleaseDone { lock },
            Notice::CloseDone { waiter } => Action::CloseDone { waiter },
        }
    }
}

/// One try of a request retried until answered (a key's delete, a
/// revoke): in flight until `until`, or waiting to be sent at `retry_at`.
#[derive(Copy, Clone, Debug)]
struct Try {
    /// In flight: unanswered once this passes.
    until: Option<Instant>,
    /// Waiting: sent again at this instant.
    retry_at: Option<Instant>,
    /// The first try has not ended yet (the calls waiting on it).
    first: bool,
}

impl Try {
    fn sent(now: Instant, timeout: Duration) -> Try {
        Try {
            until: Some(now + timeout),
            retry_at: None,
            first: true,
        }
    }

    /// The try in flight failed or went unanswered: again after `retry`.
    /// Whether it was the first.
    fn failed(&mut self, now: Instant, retry: Duration) -> bool {
        self.until = None;
        self.retry_at = Some(now + retry);
        std::mem::replace(&mut self.first, false)
    }

    fn next_timer(&self) -> Option<Instant> {
        self.until.or(self.retry_at)
    }
}

/// A key's delete under way, retried until answered.
#[derive(Copy, Clone, Debug)]
struct Delete {
    req: ReqId,
    lock: LockId,
    lease: LeaseId,
    token: Option<Token>,
    tries: Try,
}

/// A revoke under way, retried until answered.
#[derive(Copy, Clone, Debug)]
struct Revoking {
    lease: LeaseId,
    tries: Try,
}

/// What a `Session::close` call waits for.
#[derive(Copy, Clone, Debug, PartialEq)]
enum CloseOn {
    /// The first try of this lease's revoke.
    Revoke(LeaseId),
    /// A fenced lease's held revoke, or this instant (a keepalive timeout).
    Held(Instant),
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
    /// Resigned with permits in flight: the key's delete waits for them.
    resigning: Option<Resigning>,
}

/// A resignation waiting for the permits in flight (see [`Event::Resign`]).
#[derive(Copy, Clone, Debug)]
struct Resigning {
    lease: LeaseId,
    token: Token,
    /// The grace ends: the key goes even with permits in flight.
    until: Instant,
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
                resigning: None,
            },
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

    /// The bounds of this session's backend calls (its own settings),
    /// also for the calls the driver makes without a request (the key
    /// watch).
    pub fn bounds(&self) -> Bounds {
        Bounds {
            timeout: self.opts.keepalive_timeout,
            retry: self.opts.retry_interval,
        }
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

    /// A reply to `req` came: the TTL no longer bounds it.
    fn answered(&mut self, req: ReqId) {
        if let Some(i) = self.bounded.iter().position(|(_, r)| *r == req) {
            self.bounded.remove(i);
        }
    }

    /// Sends the delete of `lock`'s key under `lease` (with `token`, or
    /// whatever is there), tried until answered (§10: a key left behind
    /// would block every other holder while the session lives).
    fn send_delete(&mut self, lock: LockId, lease: LeaseId, token: Option<Token>) -> ReqId {
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
    fn delete_failed(&mut self, now: Instant, req: ReqId) {
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
    fn answer_releases(&mut self, lock: LockId) {
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
    fn send_revoke(&mut self, lease: LeaseId) {
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

    fn revoke_failed(&mut self, now: Instant, lease: LeaseId) {
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
    fn first_revoke_ended(&mut self, lease: LeaseId) {
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
    fn close_wait(&mut self, waiter: u64, revoked: Option<LeaseId>) {
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
    fn poll_tries(&mut self, now: Instant) {
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
    fn forget_lease(&mut self) {
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

    /// No permit of `lock` is in flight: its drain under way is over, and so
    /// is the work of its fenced tokens.
    fn on_permits_ended(&mut self, now: Instant, lock: LockId) {
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
    fn revoke_stray(&mut self, lease: LeaseId) {
        if self.lease != Some(lease) && !self.held.iter().any(|h| h.lease == lease) {
            self.send_revoke(lease);
        }
    }

    fn release_held(&mut self, now: Instant) {
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

    fn on_acquire(&mut self, now: Instant, lock: LockId, wait: bool, until: Option<Instant>) {
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
        self.request(Request::Lock {
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
    fn on_lock_refused(&mut self, now: Instant, req: ReqId, lock: LockId, error: String) {
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
        if let Some(cut) = self.slot(lock).lock_req.take() {
            // Cut short: the request in flight is abandoned (the service
            // orders the delete after its put).
            self.request(Request::Abandon { req: cut });
        }
        let req = self.send_delete(lock, lease, token);
        self.slot(lock).unlocking = Some(req);
    }

    fn fail_acquire(&mut self, lock: LockId, error: AcquireError, reason: Reason) {
        self.drop_key(lock);
        self.slot(lock).start_attempt(false, None);
        self.transition(lock, State::Idle, reason);
        self.notice(Notice::AcquireFailed { lock, error });
    }

    fn on_confirmed(&mut self, now: Instant, req: ReqId, ttl: Duration) {
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
        self.notice(Notice::Fence { lock, token });
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
    fn on_resign(&mut self, now: Instant, lock: LockId, grace: Duration) {
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
    fn resigned(&mut self, lock: LockId) {
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
    fn on_cancel(&mut self, now: Instant, lock: LockId, token: Option<Token>) {
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

    /// Closes the session: every lock is released and the lease revoked
    /// (one request deletes every key).
    fn on_close(&mut self, now: Instant) -> Option<LeaseId> {
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

    fn send_keepalive(&mut self, now: Instant) {
        let Some(lease) = self.lease else { return };
        let req = self.req();
        self.last_renewal = Some(now);
        self.keepalives.push_back(Pending { req, sent_at: now });
        self.bounded.push_back((now + self.opts.ttl, req));
        let bounds = self.bounds();
        self.request(Request::Keepalive { req, lease, bounds });
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

#[cfg(test)]
mod tests;
