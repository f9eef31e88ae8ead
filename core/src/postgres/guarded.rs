//! Guarded writes to the dlock.kv table: `dlock.guarded_write` commits only
//! while the lock row holds the token on a live lease (and holds the
//! name's row meanwhile, so a takeover waits for it); and the one
//! unguarded write to dlock.kv, a put if absent (a semaphore's limit).

use std::time::Duration;

use tokio_postgres::types::Type;

use super::conn::Slot;
use super::mutex::lock_key;
use crate::backend::BackendError;
use crate::machine::{LeaseId, Token};

/// Writes `key` = `value` (`None`: deletes) under `token` (see
/// [`crate::Backend::guarded_write`]).
pub(crate) async fn write(
    ops: &Slot,
    name: &str,
    lease: LeaseId,
    token: Token,
    key: &[u8],
    value: Option<&[u8]>,
    timeout: Duration,
) -> Result<(), BackendError> {
    let lock = lock_key(name, lease);
    let token = token.0 as i64;
    let done: bool = ops
        .run(timeout, |c| async move {
            let row = c
                .client
                .query_typed_one(
                    "SELECT dlock.guarded_write($1, $2, $3, $4, $5)",
                    &[
                        (&name, Type::TEXT),
                        (&lock, Type::TEXT),
                        (&token, Type::INT8),
                        (&key, Type::BYTEA),
                        (&value, Type::BYTEA),
                    ],
                )
                .await?;
            row.try_get(0)
        })
        .await?;
    if done {
        Ok(())
    } else {
        Err(BackendError::Fenced)
    }
}

/// Puts `key` = `value` in dlock.kv unless `key` is there; returns the
/// value stored now (see [`crate::Backend::put_if_absent`]). One statement:
/// the no-op update of a conflicting row returns that row, and waits for a
/// concurrent insert of the same key to commit, so two first holders agree.
pub(crate) async fn put_if_absent(
    ops: &Slot,
    key: &[u8],
    value: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, BackendError> {
    ops.run(timeout, |c| async move {
        let row = c
            .client
            .query_typed_one(
                "INSERT INTO dlock.kv AS kv (key, value) VALUES ($1, $2) \
                 ON CONFLICT (key) DO UPDATE SET value = kv.value RETURNING value",
                &[(&key, Type::BYTEA), (&value, Type::BYTEA)],
            )
            .await?;
        row.try_get(0)
    })
    .await
}
