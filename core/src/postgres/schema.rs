//! The versioned `dlock` schema: checked at connect, created or upgraded
//! when this role may, else a clear error naming the missing privilege.

use tokio_postgres::error::SqlState;

use super::SCHEMA_SQL;
use super::conn::{Conn, describe};
use crate::Error;

/// The schema version this library speaks.
pub(crate) const VERSION: i32 = 3;

/// Makes sure the schema is at [`VERSION`], running the schema file when it
/// is missing or older.
pub(crate) async fn ensure(conn: &Conn, target: &str) -> Result<(), Error> {
    let fail = |what: &str, e: &tokio_postgres::Error| {
        Error::Backend(format!("PostgreSQL at {target}: {what}: {}", describe(e)))
    };
    // The newest version and the oldest library it admits (a column since
    // version 2: read through to_jsonb, so a version-1 table reads too).
    let (found, oldest) = match conn
        .client
        .query_typed(
            "SELECT version, (to_jsonb(s) ->> 'oldest_library')::int \
             FROM dlock.schema_version s ORDER BY version DESC LIMIT 1",
            &[],
        )
        .await
    {
        Ok(rows) => match rows.first() {
            None => (None, None),
            Some(r) => (
                r.try_get::<_, Option<i32>>(0)
                    .map_err(|e| fail("reading the dlock schema version", &e))?,
                r.try_get::<_, Option<i32>>(1)
                    .map_err(|e| fail("reading the dlock schema version", &e))?,
            ),
        },
        Err(e)
            if matches!(
                e.code(),
                Some(c) if *c == SqlState::UNDEFINED_TABLE || *c == SqlState::INVALID_SCHEMA_NAME
            ) =>
        {
            (None, None)
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            return Err(privilege(
                target,
                &e,
                "USAGE on schema dlock and SELECT, INSERT, UPDATE, DELETE on its tables",
            ));
        }
        Err(e) => return Err(fail("reading the dlock schema version", &e)),
    };
    match found {
        Some(v) if v == VERSION => return Ok(()),
        // A newer schema that admits this library (it only added).
        Some(v) if v > VERSION && oldest.is_some_and(|o| o <= VERSION) => return Ok(()),
        Some(v) if v > VERSION => {
            return Err(Error::Backend(format!(
                "PostgreSQL at {target}: the dlock schema is version {v}, which needs a library of version {} or newer; this one speaks {VERSION}: upgrade dlock",
                oldest.map_or(v, |o| o.max(VERSION + 1))
            )));
        }
        _ => {}
    }
    match conn.client.batch_execute(SCHEMA_SQL).await {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            let _ = conn.client.batch_execute("ROLLBACK").await;
            Err(privilege(
                target,
                &e,
                "CREATE on the database (to create schema dlock), or a DBA runs core/sql/dlock.sql once",
            ))
        }
        Err(e) => {
            let _ = conn.client.batch_execute("ROLLBACK").await;
            Err(fail("creating the dlock schema", &e))
        }
    }
}

fn privilege(target: &str, e: &tokio_postgres::Error, needs: &str) -> Error {
    Error::Backend(format!(
        "PostgreSQL at {target}: permission denied for the dlock schema ({}); this role needs {needs}",
        describe(e)
    ))
}
