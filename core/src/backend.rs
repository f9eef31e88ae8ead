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

/// Why a held lock went away under its holder (see [`Backend::watch_keys`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LockGone {
    /// The lock key was deleted while its lease lived (an operator).
    KeyDeleted,
    /// The lease went, and the key with it (revoked or expired).
    LeaseLost,
}

/// One watched lock key gone from the service (see [`Backend::watch_keys`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct KeyGone {
    /// The token the key was held with (its create revision): names the
    /// acquisition, never a later one.
    pub token: Token,
    /// Deleted alone, or with its lease.
    pub why: LockGone,
}

/// The key watches of one lease (see [`Backend::watch_keys`]). Cheap per
/// key: no task or stream of its own. Dropping it ends every watch.
pub trait KeyWatch: Send + Sync {
    /// Watches the key of `name` under this watch's lease, held with `token`.
    fn add(&self, name: &str, token: Token);
    /// Stops watching the key held with `token` (released); unknown tokens
    /// are ignored.
    fn remove(&self, token: Token);
}

/// The watch of a backend that has none.
struct NoWatch;

impl KeyWatch for NoWatch {
    fn add(&self, _: &str, _: Token) {}
    fn remove(&self, _: Token) {}
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

    /// Deletes the lock key of `name` under `lease` (a release on a live
    /// session: the lease lives on for the session's other locks). With
    /// `Some(token)`, only while the key's create revision is `token`, so a
    /// late delete never removes a later acquisition's key; `None` (a
    /// release while the acquisition was in flight, token unknown) deletes
    /// whatever key is there, ordered after any lock request of this key
    /// still in flight, so that request cannot put the key back after the
    /// delete. `Ok` also when the key is absent.
    fn unlock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Option<Token>,
    ) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Watches the lock keys held under `lease`, all on one stream (etcd:
    /// one Watch stream, one watcher per key), reporting on `gone` each key
    /// that vanishes while its holder may think it holds it (an operator
    /// deleted it, or the lease went). Dropping the [`KeyWatch`] ends every
    /// watch. The default watches nothing: keepalives alone tell a lost
    /// lease.
    fn watch_keys(
        &self,
        lease: LeaseId,
        gone: tokio::sync::mpsc::UnboundedSender<KeyGone>,
    ) -> Box<dyn KeyWatch> {
        let _ = (lease, gone);
        Box::new(NoWatch)
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
