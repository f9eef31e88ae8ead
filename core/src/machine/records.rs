//! The holder's own bookkeeping: one record per lock, per request tried
//! until answered, per fenced lease whose revoke is held. Private to the
//! machine; kept apart from [`super::Holder`] so that the files that
//! implement its steps read these records and the holder, and the holder
//! reads only these.

use std::time::Duration;

use super::types::{LeaseId, LockId, ReqId, State, Token};
use crate::clock::Instant;

/// One try of a request retried until answered (a key's delete, a
/// revoke): in flight until `until`, or waiting to be sent at `retry_at`.
#[derive(Copy, Clone, Debug)]
pub(super) struct Try {
    /// In flight: unanswered once this passes.
    pub(super) until: Option<Instant>,
    /// Waiting: sent again at this instant.
    pub(super) retry_at: Option<Instant>,
    /// The first try has not ended yet (the calls waiting on it).
    pub(super) first: bool,
}

impl Try {
    pub(super) fn sent(now: Instant, timeout: Duration) -> Try {
        Try {
            until: Some(now + timeout),
            retry_at: None,
            first: true,
        }
    }

    /// The try in flight failed or went unanswered: again after `retry`.
    /// Whether it was the first.
    pub(super) fn failed(&mut self, now: Instant, retry: Duration) -> bool {
        self.until = None;
        self.retry_at = Some(now + retry);
        std::mem::replace(&mut self.first, false)
    }

    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.until.or(self.retry_at)
    }
}

/// A key's delete under way, retried until answered.
#[derive(Copy, Clone, Debug)]
pub(super) struct Delete {
    pub(super) req: ReqId,
    pub(super) lock: LockId,
    pub(super) lease: LeaseId,
    pub(super) token: Option<Token>,
    pub(super) tries: Try,
}

/// A revoke under way, retried until answered.
#[derive(Copy, Clone, Debug)]
pub(super) struct Revoking {
    pub(super) lease: LeaseId,
    pub(super) tries: Try,
}

/// What a `Session::close` call waits for.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(super) enum CloseOn {
    /// The first try of this lease's revoke.
    Revoke(LeaseId),
    /// A fenced lease's held revoke, or this instant (a keepalive timeout).
    Held(Instant),
}

/// A fenced token whose lease's revoke waits for it (docs/design.md §11).
#[derive(Copy, Clone, Debug)]
pub(super) struct FencedToken {
    pub(super) lock: LockId,
    pub(super) token: Token,
    /// `on_fence` returned.
    pub(super) delivered: bool,
    /// No permit of the token is in flight.
    pub(super) ended: bool,
}

/// A fenced lease whose revoke waits until every token fenced with it is
/// delivered and ended, or its server-side expiry has surely passed.
#[derive(Clone, Debug)]
pub(super) struct HeldRevoke {
    pub(super) lease: LeaseId,
    pub(super) tokens: Vec<FencedToken>,
    pub(super) expired_by: Instant,
}

#[derive(Copy, Clone, Debug)]
pub(super) struct Pending {
    pub(super) req: ReqId,
    pub(super) sent_at: Instant,
}

/// One lock of the session.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) name: std::sync::Arc<str>,
    pub(super) state: State,
    pub(super) token: Option<Token>,
    pub(super) last_token: Option<Token>,
    pub(super) wait: bool,
    pub(super) give_up_at: Option<Instant>,
    /// Outstanding lock request, under the lease of the session.
    pub(super) lock_req: Option<ReqId>,
    /// Waiting for its turn (a lock request queued at the service, or
    /// behind another lock of this session with the same name).
    pub(super) queued: bool,
    pub(super) acquire_retry_at: Option<Instant>,
    /// Outstanding delete of this lock's key under the current lease.
    pub(super) unlocking: Option<ReqId>,
    /// Left `Holding`: waiting for the last permit in flight to end.
    pub(super) watching: bool,
    /// No permit in flight since the lock left `Holding`.
    pub(super) quiet: bool,
    /// Resigned with permits in flight: the key's delete waits for them.
    pub(super) resigning: Option<Resigning>,
}

/// A resignation waiting for the permits in flight (see [`Event::Resign`]).
#[derive(Copy, Clone, Debug)]
pub(super) struct Resigning {
    pub(super) lease: LeaseId,
    pub(super) token: Token,
    /// The grace ends: the key goes even with permits in flight.
    pub(super) until: Instant,
}

impl Slot {
    pub(super) fn acquiring(&self) -> bool {
        matches!(self.state, State::Acquiring | State::Reacquiring)
    }

    pub(super) fn holding(&self) -> bool {
        matches!(self.state, State::Holding | State::Draining)
    }

    /// Sets how the next acquisition waits and forgets the last one's
    /// timers and queue place.
    pub(super) fn start_attempt(&mut self, wait: bool, give_up_at: Option<Instant>) {
        self.wait = wait;
        self.give_up_at = give_up_at;
        self.queued = false;
        self.acquire_retry_at = None;
    }
}
