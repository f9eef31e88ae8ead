//! [`Reader`]: read-only looks at who holds what (`dlock show`, `dlock
//! list`) on whichever backend the endpoints name.

use crate::client::BackendConfig;
use crate::etcd::{EtcdReader, LeaseTtl, LockKey};
use crate::machine::LeaseId;
use crate::postgres::PostgresReader;
use crate::{Endpoints, Error};

/// A read-only connection to a lock service: holds no lease and writes
/// nothing. [`Reader::connect`] picks the backend as a client does.
#[derive(Clone)]
pub struct Reader(Inner);

#[derive(Clone)]
enum Inner {
    Etcd(EtcdReader),
    Postgres(PostgresReader),
}

impl Reader {
    /// Connects to what `endpoints` name (blocks); the embedded service
    /// has nothing to read from outside its process.
    pub fn connect(endpoints: Endpoints) -> Result<Reader, Error> {
        Ok(Reader(match endpoints.backend()? {
            BackendConfig::Postgres(c) => Inner::Postgres(PostgresReader::connect(&c)?),
            BackendConfig::Etcd(c) => Inner::Etcd(c.connect_reader()?),
            _ => {
                return Err(Error::InvalidArgument(
                    "a reader needs etcd endpoints or a PostgreSQL URL".into(),
                ));
            }
        }))
    }

    /// The lock keys whose key starts with `prefix`, lowest token first:
    /// the first key of each name holds it. On etcd the others wait in
    /// that order; on PostgreSQL waiters hold no keys
    /// ([`Reader::lists_waiters`]).
    pub fn lock_keys(&self, prefix: &str) -> Result<Vec<LockKey>, Error> {
        match &self.0 {
            Inner::Etcd(r) => r.lock_keys(prefix),
            Inner::Postgres(r) => r.lock_keys(prefix),
        }
    }

    /// The time to live of `lease` (-1 left when it is gone).
    pub fn lease_ttl(&self, lease: LeaseId) -> Result<LeaseTtl, Error> {
        match &self.0 {
            Inner::Etcd(r) => r.lease_ttl(lease),
            Inner::Postgres(r) => r.lease_ttl(lease),
        }
    }

    /// Whether waiters show as keys ([`Reader::lock_keys`]): on etcd they
    /// do; on PostgreSQL they wait on a notification and a timer, unseen.
    pub fn lists_waiters(&self) -> bool {
        matches!(self.0, Inner::Etcd(_))
    }
}

/// Creates or upgrades the `dlock` schema at the PostgreSQL URL that
/// `endpoints` name, as a client would on connect (`dlock postgres
/// migrate`, for a deploy step or a role that may create it); the schema
/// version afterwards. DBAs may run [`crate::SCHEMA_SQL`] instead.
pub fn migrate(endpoints: Endpoints) -> Result<i32, Error> {
    match endpoints.backend()? {
        BackendConfig::Postgres(c) => crate::postgres::migrate(&c),
        _ => Err(Error::InvalidArgument(
            "migrate needs a PostgreSQL URL (postgres:// or postgresql://); etcd has no schema"
                .into(),
        )),
    }
}
