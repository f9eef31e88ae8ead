//! [`Permit`] and [`OwnedPermit`]: permission for one unit of work, its
//! token and deadline, counted in flight on its lock's gate until ended
//! (docs/design.md §8). Made by `Lock::permit`.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::time::Duration;

use crate::clock::Instant;
use crate::gate::Gate;
use crate::machine::Token;

/// Permission for one unit of work, borrowed from its [`crate::Lock`]. Dropping it
/// ends the unit of work.
#[must_use = "the permit ends when dropped"]
pub struct Permit<'a> {
    owned: OwnedPermit,
    /// Borrows the lock it came from (`Lock::permit(&self)`).
    _lock: PhantomData<&'a ()>,
}

impl Permit<'_> {
    /// Borrows `owned` for the life of the lock's borrow.
    #[inline(always)]
    pub(crate) fn new(owned: OwnedPermit) -> Self {
        Permit {
            owned,
            _lock: PhantomData,
        }
    }

    /// The token to send with every write this unit of work makes.
    pub fn token(&self) -> Token {
        self.owned.token
    }

    /// The deadline when the permit was granted (keepalives may extend the
    /// lock's; [`Self::valid`] reads the current one).
    pub fn deadline(&self) -> Instant {
        self.owned.deadline
    }

    /// Whether the work may still commit: the lock still holds this token
    /// and its deadline has not passed (read from the clock).
    pub fn valid(&self) -> bool {
        self.owned.valid()
    }

    /// Ends the unit of work (same as dropping it).
    pub fn end(self) {}
}

impl std::fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("token", &self.owned.token)
            .field("deadline", &self.owned.deadline)
            .finish()
    }
}

/// A [`Permit`] without a borrow: safe to keep past its lock's close or
/// drop (it then reports `valid() == false`). The lock's state lives until
/// the last permit in flight ends.
#[must_use = "the permit ends when dropped"]
pub struct OwnedPermit {
    /// Kept alive by the in-flight count (see `Gate::orphan`).
    gate: NonNull<Gate>,
    token: Token,
    deadline: Instant,
}

// SAFETY: the gate is all atomics and mutexes (Sync), and it lives while
// this permit is counted in flight, whichever thread ends it.
unsafe impl Send for OwnedPermit {}
// SAFETY: as above; every method takes `&self` on atomics.
unsafe impl Sync for OwnedPermit {}

impl OwnedPermit {
    /// A permit of `token` until `deadline`, counted in flight on `gate`
    /// (which `Gate::enter` just did).
    #[inline(always)]
    pub(crate) fn new(gate: &Gate, token: Token, deadline: Instant) -> OwnedPermit {
        OwnedPermit {
            gate: NonNull::from(gate),
            token,
            deadline,
        }
    }

    fn gate(&self) -> &Gate {
        // SAFETY: counted in flight until dropped, which keeps the gate.
        unsafe { self.gate.as_ref() }
    }

    /// The token to send with every write this unit of work makes.
    pub fn token(&self) -> Token {
        self.token
    }

    /// The deadline when the permit was granted.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the work may still commit (see [`Permit::valid`]).
    pub fn valid(&self) -> bool {
        self.gate().valid(self.token)
    }

    /// Time left before the lock's current deadline while this token still
    /// holds; zero once it does not.
    pub fn remaining(&self) -> Duration {
        if self.valid() {
            self.gate().time_left().unwrap_or_default()
        } else {
            Duration::ZERO
        }
    }

    /// Ends the unit of work (same as dropping it).
    pub fn end(self) {}
}

impl std::fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("token", &self.token)
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl Drop for OwnedPermit {
    #[inline]
    fn drop(&mut self) {
        self.gate().exit();
    }
}
