//! The PostgreSQL backend (docs/postgres.md): leases are rows whose expiry
//! the server's clock decides, tokens come from one sequence drawn under
//! the name's row lock, and `dlock.guard(name, token)` lets the
//! application's own transaction refuse a stale holder.
//!
//! One concern a file: [`config`] (the URL and its rules), [`conn`]
//! (connections, TLS, notices), [`schema`] (the versioned schema),
//! [`lease`], [`mutex`] (the lock protocol), [`watch`] (LISTEN/NOTIFY),
//! [`guarded`] (guarded writes); [`backend`] ties them to the
//! [`crate::Backend`] trait. Every deadline, drain and fence stays in the
//! core's state machine.

mod backend;
mod config;
mod conn;
mod election;
mod guarded;
mod lease;
mod mutex;
mod reader;
mod rwlock;
mod schema;
mod semaphore;
mod watch;

pub(crate) use backend::PostgresBackend;
pub use config::PostgresConfig;
pub(crate) use config::is_postgres_url;
pub(crate) use reader::{PostgresReader, migrate};

use crate::Error;

/// The SQLSTATE `dlock.guard` raises when the token no longer holds its
/// lock: the application's transaction must not commit.
pub const GUARD_SQLSTATE: &str = "DL001";

/// The version of the `dlock` schema this library speaks (2: elections;
/// 3: read/write locks);
/// an older one is upgraded on connect, a newer one refused.
pub const SCHEMA_VERSION: i32 = schema::VERSION;

/// The schema file, as a DBA runs it (`core/sql/dlock.sql`).
pub const SCHEMA_SQL: &str = include_str!("../../sql/dlock.sql");

/// Connects a PostgreSQL backend on the driver (its connections belong to
/// the driver's runtime): everything is checked before anything is held.
pub(crate) async fn connect(config: PostgresConfig) -> Result<PostgresBackend, Error> {
    config.validate()?;
    crate::driver::on_driver(PostgresBackend::connect(config))
        .await
        .map_err(|_| Error::Shutdown)?
}
