//! What crosses the machine's edge (quinn-proto's shape): the [`Event`]s
//! fed in, the [`Request`]s to the lock service and the [`Notice`]s to the
//! application that come out, and [`Action`], both outputs in one order for
//! tests. Plain data, apart from the holder, so the driver and the tests
//! name them without the state machine's internals.

use std::time::Duration;

use super::types::{AcquireError, LeaseId, LockId, ReqId, StateChange, Token};
use crate::clock::Instant;

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
    /// [`Holder::watching_permits`](super::Holder::watching_permits).
    PermitsEnded {
        /// The lock.
        lock: LockId,
    },
    /// The timer from [`Holder::poll_timeout`](super::Holder::poll_timeout) fired (or any wake-up).
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
