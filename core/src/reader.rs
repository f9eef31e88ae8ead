//! [`Reader`]: read-only looks at who holds what (`dlock show`, `dlock
//! list`), and the records every engine's reader returns ([`LockKey`],
//! [`LeaseTtl`]). The engine is chosen where every backend is chosen
//! (`Reader::connect`, in `connect.rs`); each engine's reader implements
//! [`Read`].

use std::sync::Arc;

use crate::Error;
use crate::identity::Identity;
use crate::machine::LeaseId;

/// One lock key: `{name}/{lease:x}` under its lease (see
/// [`crate::lock_key`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockKey {
    /// The lock's name (the key without its `/<lease hex>`).
    pub name: String,
    /// The whole key.
    pub key: String,
    /// The key's create revision: its holder's fencing token.
    pub create_revision: i64,
    /// The lease the key lives under.
    pub lease: LeaseId,
}

/// A lease's time to live, as the service reports it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseTtl {
    /// Seconds left, -1 if the lease is gone.
    pub left_s: i64,
    /// The TTL granted, in seconds.
    pub granted_s: i64,
}

/// What one engine's read-only connection answers (see [`Reader`]).
pub(crate) trait Read: Send + Sync {
    /// See [`Reader::lock_keys`].
    fn lock_keys(&self, prefix: &str) -> Result<Vec<LockKey>, Error>;
    /// See [`Reader::lease_ttl`].
    fn lease_ttl(&self, lease: LeaseId) -> Result<LeaseTtl, Error>;
    /// See [`Reader::lists_waiters`].
    fn lists_waiters(&self) -> bool;
    /// The value stored under `key` outside every lock (a semaphore's
    /// limit), if any.
    fn value(&self, key: &str) -> Result<Option<Vec<u8>>, Error>;
    /// See [`Reader::identity`].
    fn identity(&self, lease: LeaseId) -> Result<Option<Identity>, Error>;
}

/// A read-only connection to a lock service: holds no lease and writes
/// nothing. `Reader::connect` picks the backend as a client does.
#[derive(Clone)]
pub struct Reader(pub(crate) Arc<dyn Read>);

impl Reader {
    /// The lock keys whose key starts with `prefix`, lowest token first:
    /// the first key of each name holds it. On etcd the others wait in
    /// that order; on PostgreSQL waiters hold no keys
    /// ([`Reader::lists_waiters`]).
    pub fn lock_keys(&self, prefix: &str) -> Result<Vec<LockKey>, Error> {
        self.0.lock_keys(prefix)
    }

    /// The time to live of `lease` (-1 left when it is gone).
    pub fn lease_ttl(&self, lease: LeaseId) -> Result<LeaseTtl, Error> {
        self.0.lease_ttl(lease)
    }

    /// Whether waiters show as keys ([`Reader::lock_keys`]): on etcd they
    /// do; on PostgreSQL they wait on a notification and a timer, unseen.
    pub fn lists_waiters(&self) -> bool {
        self.0.lists_waiters()
    }

    /// The identity recorded beside `lease` (who holds its keys: host,
    /// pid, process start, face, description); `None` when none is (a
    /// holder that is not dlock, or the lease is gone).
    pub fn identity(&self, lease: LeaseId) -> Result<Option<Identity>, Error> {
        self.0.identity(lease)
    }

    /// The limit recorded for the semaphore `name` (under
    /// [`crate::semaphore::limit_key`]), `None` if none is.
    pub fn semaphore_limit(&self, name: &str) -> Result<Option<u32>, Error> {
        let key = crate::semaphore::limit_key(name);
        let Some(v) = self.0.value(&key)? else {
            return Ok(None);
        };
        crate::semaphore::parse_limit(&v).map(Some).ok_or_else(|| {
            Error::Backend(format!(
                "`{key}` holds no limit: {:?}",
                String::from_utf8_lossy(&v)
            ))
        })
    }
}
