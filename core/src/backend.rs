//! What the driver needs from a lock service: the [`Backend`] trait and
//! the types its calls carry. A backend keeps no settings of the session:
//! each call that is timed carries its [`Bounds`], stamped by the machine.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::identity::{Identity, LockHolder};
pub use crate::machine::Bounds;
use crate::machine::{LeaseId, Token};

/// The lock key of `name` under `lease`: `{name}/{lease:x}`, the key etcd's
/// lock protocol (`client/v3/concurrency.Mutex`, `etcdctl lock`) writes. The
/// one definition: every backend, `dlock run` (`ETCD_LOCK_KEY`) and
/// `dlock show` use it, so they and `etcdctl lock` exclude each other.
pub fn lock_key(name: &str, lease: LeaseId) -> String {
    format!("{name}/{lease:x}")
}

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
    /// The service refused the request as too large (etcd: "request is
    /// too large", a cluster with a smaller `--max-request-bytes`): final,
    /// the same request can never succeed, so it is not tried again.
    #[error("refused as too large: {0}")]
    TooLarge(String),
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

/// A lease granted by the service.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The lease id.
    pub lease: LeaseId,
    /// The TTL the server granted.
    pub ttl: Duration,
}

/// An election's leader as the service sees it: the candidate key with
/// the lowest create revision under `<name>/` (etcd's `concurrency.Election`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's key, `<name>/<lease hex>`.
    pub key: String,
    /// The value the leader proclaims.
    pub value: Vec<u8>,
    /// The key's create revision: the leader's fencing token (unchanged by
    /// a proclaim).
    pub token: Token,
    /// The lease the key is held under.
    pub lease: LeaseId,
}

/// A lock service. Implementations do I/O only: every decision about
/// deadlines, drains and fences stays in the core's state machine, and
/// every bound on a session's calls comes with the call ([`Bounds`]).
/// `Any`, so the one place that needs a backend's own methods (the
/// embedded backend's fault switches, `Client::link`) downcasts to it.
pub trait Backend: std::any::Any + Send + Sync + 'static {
    /// Grants a lease of (about) `ttl`, giving up after `bounds.timeout`,
    /// and records `identity` (if any) beside it, once per lease (never per
    /// acquire), so that [`Backend::holder`] can name the lease's session.
    /// A failed record leaves the lease without an identity (logged), not
    /// the grant failed: identity is for people, locks do not need it.
    fn grant<'a>(
        &'a self,
        ttl: Duration,
        bounds: Bounds,
        identity: Option<&'a Identity>,
    ) -> BoxFuture<'a, Result<Grant, BackendError>>;

    /// The holder of `name` now: the key with the lowest token under
    /// `<name>/` (the one every later key waits for), its lease, and the
    /// identity recorded for that lease (`None` when there is none: an
    /// `etcdctl lock` holder). `Ok(None)` when nothing holds it.
    fn holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockHolder>, BackendError>> {
        let _ = name;
        Box::pin(async {
            Err(BackendError::Unavailable(
                "this backend records no holders".into(),
            ))
        })
    }

    /// Sends one keepalive; returns the granted TTL. A zero TTL or
    /// [`BackendError::LeaseNotFound`] means the lease is lost. Gives up
    /// (unavailable) after `bounds.timeout`, as the machine counts it
    /// failed then.
    fn keepalive(
        &self,
        lease: LeaseId,
        bounds: Bounds,
    ) -> BoxFuture<'_, Result<Duration, BackendError>>;

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
    /// watch. `bounds` are the session's: a lookup is bounded by
    /// `bounds.timeout`, a failed stream opened again after `bounds.retry`.
    fn watch_keys(
        &self,
        lease: LeaseId,
        bounds: Bounds,
        gone: tokio::sync::mpsc::UnboundedSender<KeyGone>,
    ) -> Box<dyn KeyWatch>;

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
    ) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Puts `key` = `value` in the service's key-value store only if `key`
    /// is absent (etcd: one transaction comparing its create revision with
    /// 0; the others: the store guarded writes use) and returns the value
    /// stored now: `value` if it was put, else the one found. A
    /// semaphore's limit is recorded this way, once, by its first handle
    /// ([`crate::Semaphore`]); the core compares, the service only stores.
    fn put_if_absent<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, BackendError>> {
        let _ = (key, value);
        Box::pin(async {
            Err(BackendError::Unavailable(
                "this backend has no key-value store".into(),
            ))
        })
    }

    /// A slot of the semaphore `name` (of `limit` slots) with no key under
    /// it (docs/design.md §26): `Some(i)` at once when one is free; when
    /// none is, with `wait`, once a key under `<name>/slot/` goes (a
    /// release, an expiry, a revoke) and one is free, else `None`. Read,
    /// not taken: the caller tries slot `i` as a lock's `try_acquire`, and
    /// asks again if someone took it first. Only the head of the
    /// semaphore's one queue waits here, so a release wakes one waiter, not
    /// every waiter of every slot. The caller bounds the wait.
    fn free_slot<'a>(
        &'a self,
        name: &'a str,
        limit: u32,
        wait: bool,
    ) -> BoxFuture<'a, Result<Option<u32>, BackendError>> {
        let _ = (name, limit, wait);
        Box::pin(async {
            Err(BackendError::Unavailable(
                "this backend has no semaphores".into(),
            ))
        })
    }

    /// [`Backend::lock`] for a read/write lock's holder (docs/design.md
    /// §27): the key `<name>/<lease>` is put holding `mode`'s value
    /// ([`crate::mode::READ_MARKER`] for a reader, empty for a writer, as
    /// `etcdctl lock` puts), in the one queue of the name. A writer holds
    /// when no earlier key is left; a reader when no earlier key is a
    /// writer (any key without the marker, so `etcdctl lock`'s and Go's
    /// keys count as writers). Every wake re-reads the holder's own key.
    /// The default knows writers only.
    fn lock_rw<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        mode: crate::mode::Mode,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        match mode {
            crate::mode::Mode::Write => self.lock(name, lease, wait),
            crate::mode::Mode::Read => Box::pin(async {
                Err(BackendError::Unavailable(
                    "this backend has no read/write locks".into(),
                ))
            }),
        }
    }

    /// [`Backend::lock`] for an election's candidate: the key is created
    /// holding `value` (an existing key gets `value`), as etcd's
    /// `Election.Campaign`.
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        value: &'a [u8],
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>>;

    /// Puts `value` in the candidate key of `name` under `lease` (keeping
    /// the lease) only while that key's create revision is `token`; else
    /// [`BackendError::Fenced`] (etcd's `Election.Proclaim`).
    fn proclaim<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Follows the leader of `name`: `each` gets the state now, then the
    /// state after every change under the prefix (read after the change,
    /// so a leader whose key is gone is never given; a change may repeat
    /// the state). Returns only when following failed (the error); the
    /// caller opens it again. The default asks [`Backend::next_leader`]
    /// over and over; etcd keeps one watch open across changes.
    fn observe_leaders<'a>(
        &'a self,
        name: &'a str,
        each: &'a mut (dyn FnMut(Option<Leader>) + Send),
    ) -> BoxFuture<'a, BackendError> {
        Box::pin(async move {
            let mut last: Option<Option<Leader>> = None;
            loop {
                match self.next_leader(name, last.as_ref()).await {
                    Ok(now) => {
                        each(now.clone());
                        last = Some(now);
                    }
                    Err(e) => return e,
                }
            }
        })
    }

    /// The leader of `name` once it differs from `last` (at once when
    /// `last` is `None`): `Some(None)` means no candidate holds. Read
    /// after the change, so a leader whose key is gone is never returned.
    fn next_leader<'a>(
        &'a self,
        name: &'a str,
        last: Option<&'a Option<Leader>>,
    ) -> BoxFuture<'a, Result<Option<Leader>, BackendError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_etcd_mutex_keys() {
        // concurrency.Mutex: pfx + "/" + fmt.Sprintf("%x", leaseID)
        assert_eq!(
            lock_key("jobs", 0x694d7f0c2b0c7e0a),
            "jobs/694d7f0c2b0c7e0a"
        );
        assert_eq!(lock_key("a/b", 255), "a/b/ff");
    }
}
