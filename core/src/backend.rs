//! What the driver needs from a lock service.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::machine::{LeaseId, Token};

/// A boxed, sendable future, as returned by [`Backend`] methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A failed backend call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The lock is held by someone else (only when not waiting).
    #[error("the lock is held by another holder")]
    Busy,
    /// The lease does not exist (expired or revoked): the session is lost.
    #[error("lease not found")]
    LeaseNotFound,
    /// Transport or server failure; worth retrying.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A guarded write was refused: the token no longer holds its lock.
    #[error("fenced: the token no longer holds the lock")]
    Fenced,
}

/// Why a held lock went away under its holder (see [`Backend::watch_lock`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LockGone {
    /// The lock key was deleted while its lease lived (an operator).
    KeyDeleted,
    /// The lease went, and the key with it (revoked or expired).
    LeaseLost,
}

/// A lease granted by the service.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The lease id.
    pub lease: LeaseId,
    /// The TTL the server granted.
    pub ttl: Duration,
}

/// A lock service. Implementations do I/O only: every decision about
/// deadlines, drains and fences stays in the core's state machine.
pub trait Backend: Send + Sync + 'static {
    /// Grants a lease of (about) `ttl`.
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, BackendError>>;

    /// Sends one keepalive; returns the granted TTL. A zero TTL or
    /// [`BackendError::LeaseNotFound`] means the lease is lost.
    fn keepalive(&self, lease: LeaseId) -> BoxFuture<'_, Result<Duration, BackendError>>;

    /// Acquires `name` under `lease` and returns its fencing token. With
    /// `wait`, queues behind the current holder; without, fails with
    /// [`BackendError::Busy`].
    fn lock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>>;

    /// Revokes a lease, releasing every lock held under it.
    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), BackendError>>;

    /// Resolves once the lock `name` acquired under `lease` with `token` is
    /// gone from the service while the holder may still think it holds it
    /// (an operator deleted the key or revoked the lease), saying which. The
    /// driver fences at once. The default never resolves: keepalives alone
    /// tell a lost lease.
    fn watch_lock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
    ) -> BoxFuture<'a, LockGone> {
        let _ = (name, lease, token);
        Box::pin(std::future::pending())
    }

    /// Writes `key` = `value` (`None`: deletes `key`) only while the lock
    /// key of `name` under `lease` still exists with `token` (its create
    /// revision), atomically on the service; else [`BackendError::Fenced`].
    /// The service decides: no backend keeps tokens of its own.
    fn guarded_write<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        key: &'a [u8],
        value: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (name, lease, token, key, value);
        Box::pin(async {
            Err(BackendError::Unavailable(
                "this backend has no guarded writes".into(),
            ))
        })
    }
}
