//! The machine's public words: tokens, states, reasons, refusals and the
//! permit rule. A leaf: everything else in the machine (and the code table
//! in `codes.rs`, the gate, the faces) reads these, and they read nothing
//! of the machine back.

use std::fmt;

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
/// Its entry in the code table, [`Refused::status`], is written in
/// `codes.rs`, which reads the machine (never the other way round).
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

/// Names one lock of a session's machine (given to [`Holder::add_lock`](super::Holder::add_lock),
/// never reused).
pub type LockId = u64;
