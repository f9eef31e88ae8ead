//! Read-only looks at the lock rows (`dlock show`, `dlock list`) and the
//! schema's creation on its own (`dlock postgres migrate`), through the
//! same connection checks as a client (TLS, replication, timeline).

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::PostgresConfig;
use super::conn::{Conn, Connector, describe};
use super::schema;
use crate::Error;
use crate::identity::Identity;
use crate::machine::LeaseId;
use crate::reader::{LeaseTtl, LockKey, Read};

/// A read-only connection to PostgreSQL: holds no lease, writes nothing.
#[derive(Clone)]
pub(crate) struct PostgresReader {
    conn: Arc<Conn>,
    target: Arc<str>,
    timeout: Duration,
}

/// Connects and checks the server, as a client does, then creates or
/// upgrades the `dlock` schema (what `dlock postgres migrate` runs): the
/// schema version afterwards.
pub(crate) fn migrate(config: &PostgresConfig) -> Result<i32, Error> {
    config.validate()?;
    let connector = Connector::new(config)?;
    crate::driver::block_on(async move {
        let conn = connector.open(None).await?;
        schema::ensure(&conn, &connector.target).await?;
        Ok(schema::VERSION)
    })?
}

impl PostgresReader {
    /// Blocks while it connects.
    pub fn connect(config: &PostgresConfig) -> Result<PostgresReader, Error> {
        config.validate()?;
        let connector = Connector::new(config)?;
        let timeout = config.request_timeout;
        let limit = config.connect_timeout + timeout;
        crate::driver::block_on(async move {
            let conn = tokio::time::timeout(limit, connector.open(None))
                .await
                .map_err(|_| {
                    Error::Backend(format!(
                        "PostgreSQL at {}: connect timed out",
                        connector.target
                    ))
                })??;
            Ok(PostgresReader {
                conn: Arc::new(conn),
                target: connector.target.clone().into(),
                timeout,
            })
        })?
    }

    /// Runs one read on the driver, bounded by the request timeout; a
    /// missing schema reads as no rows (nothing was ever locked here).
    fn read(
        &self,
        what: &'static str,
        sql: &'static str,
        arg: String,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let r = self.clone();
        crate::driver::block_on(async move {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&arg];
            match tokio::time::timeout(r.timeout, r.conn.client.query(sql, &params)).await {
                Err(_) => Err(Error::Backend(format!(
                    "PostgreSQL at {}: {what}: timed out",
                    r.target
                ))),
                Ok(Ok(rows)) => Ok(rows),
                Ok(Err(e))
                    if matches!(
                        e.code(),
                        Some(c) if *c == SqlState::UNDEFINED_TABLE || *c == SqlState::INVALID_SCHEMA_NAME
                    ) =>
                {
                    Ok(Vec::new())
                }
                Ok(Err(e)) => Err(Error::Backend(format!(
                    "PostgreSQL at {}: {what}: {}",
                    r.target,
                    describe(&e)
                ))),
            }
        })?
    }

    /// The lock rows whose key starts with `prefix`, lowest token first.
    /// Waiters hold no rows on PostgreSQL (they wait on LISTEN and a
    /// timer), so every row is a holder's.
    pub fn lock_keys(&self, prefix: &str) -> Result<Vec<LockKey>, Error> {
        let rows = self.read(
            "reading dlock.locks",
            "SELECT key, name, token, lease FROM dlock.locks \
             WHERE starts_with(key, $1) ORDER BY token",
            prefix.to_owned(),
        )?;
        Ok(rows
            .iter()
            .map(|r| LockKey {
                key: r.get(0),
                name: r.get(1),
                create_revision: r.get(2),
                lease: r.get(3),
            })
            .collect())
    }

    /// `lease`'s time to live on the server's clock; -1 left when it is
    /// gone or expired.
    pub fn lease_ttl(&self, lease: LeaseId) -> Result<LeaseTtl, Error> {
        let rows = self.read(
            "reading dlock.leases",
            "SELECT floor(extract(epoch FROM expires_at - clock_timestamp()))::bigint, \
                    extract(epoch FROM ttl)::bigint \
             FROM dlock.leases WHERE id = $1::text::bigint",
            lease.to_string(),
        )?;
        Ok(match rows.first() {
            Some(r) => LeaseTtl {
                left_s: r.get::<_, i64>(0).max(-1),
                granted_s: r.get(1),
            },
            None => LeaseTtl {
                left_s: -1,
                granted_s: 0,
            },
        })
    }
}

impl Read for PostgresReader {
    fn lock_keys(&self, prefix: &str) -> Result<Vec<LockKey>, Error> {
        PostgresReader::lock_keys(self, prefix)
    }

    fn lease_ttl(&self, lease: LeaseId) -> Result<LeaseTtl, Error> {
        PostgresReader::lease_ttl(self, lease)
    }

    /// Waiters hold no rows: they wait on a notification and a timer.
    fn lists_waiters(&self) -> bool {
        false
    }

    fn value(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        let rows = self.read(
            "reading dlock.kv",
            "SELECT value FROM dlock.kv WHERE key = convert_to($1, 'UTF8')",
            key.to_owned(),
        )?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    fn identity(&self, lease: LeaseId) -> Result<Option<Identity>, Error> {
        // Through to_jsonb, so a version-2 table (no column) reads as none.
        let rows = self.read(
            "reading dlock.leases",
            "SELECT to_jsonb(l) ->> 'holder' FROM dlock.leases l WHERE id = $1::text::bigint",
            lease.to_string(),
        )?;
        Ok(rows
            .first()
            .and_then(|r| r.get::<_, Option<String>>(0))
            .and_then(|j| Identity::from_json(j.as_bytes())))
    }
}
