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
mod guarded;
mod lease;
mod mutex;
mod schema;
mod watch;

pub(crate) use backend::PostgresBackend;
pub use config::PostgresConfig;

use crate::{Client, Error, Options};

/// The SQLSTATE `dlock.guard` raises when the token no longer holds its
/// lock: the application's transaction must not commit.
pub const GUARD_SQLSTATE: &str = "DL001";

/// The schema file, as a DBA runs it (`core/sql/dlock-v1.sql`).
pub const SCHEMA_SQL: &str = include_str!("../../sql/dlock-v1.sql");

impl Client {
    /// A client of the PostgreSQL server in `config`. Blocks while it
    /// connects, checks replication and the schema; see [`Client::connect`].
    pub fn postgres(config: PostgresConfig, options: Options) -> Result<Client, Error> {
        Client::connect(crate::ClientConfig::postgres(config).with_options(options))
    }
}

/// Connects a PostgreSQL backend on the driver (its connections belong to
/// the driver's runtime): everything is checked before anything is held.
pub(crate) async fn connect(config: PostgresConfig) -> Result<PostgresBackend, Error> {
    config.validate()?;
    crate::driver::on_driver(PostgresBackend::connect(config))
        .await
        .map_err(|_| Error::Shutdown)?
}

/// The PostgreSQL configuration of the environment: `Some` when
/// `DLOCK_ENDPOINTS` is a `postgres://` or `postgresql://` URL (with
/// `DLOCK_CA_FILE`, `DLOCK_CONNECT_TIMEOUT_MS`, `DLOCK_REQUEST_TIMEOUT_MS`).
pub(crate) fn from_env() -> Result<Option<PostgresConfig>, Error> {
    let var = |name: &str| -> Result<Option<String>, Error> {
        match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(v)),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(Error::InvalidArgument(format!("{name} is not valid UTF-8")))
            }
        }
    };
    let Some(url) = var("DLOCK_ENDPOINTS")?.filter(|u| config::is_postgres_url(u)) else {
        return Ok(None);
    };
    let mut c = PostgresConfig::parse(&url)
        .map_err(|e| Error::InvalidArgument(format!("DLOCK_ENDPOINTS: {e}")))?;
    if let Some(ca) = var("DLOCK_CA_FILE")? {
        c.ca_file.get_or_insert(ca.into());
    }
    for (name, field) in [
        ("DLOCK_CONNECT_TIMEOUT_MS", &mut c.connect_timeout),
        ("DLOCK_REQUEST_TIMEOUT_MS", &mut c.request_timeout),
    ] {
        if let Some(v) = var(name)? {
            *field = match v.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => std::time::Duration::from_millis(ms),
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "{name} must be a whole number of milliseconds above zero, got `{v}`"
                    )));
                }
            };
        }
    }
    c.validate()?;
    Ok(Some(c))
}
