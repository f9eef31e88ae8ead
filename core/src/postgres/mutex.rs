//! The lock protocol: `dlock.acquire` locks the name's row, reads the
//! holders' leases (waiting for an in-flight keepalive), sweeps expired
//! ones, and only then draws a token; a waiter looks again when a lock row
//! goes (NOTIFY) or at the holder's remaining TTL (nothing fires at expiry).

use std::pin::Pin;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio_postgres::types::Type;

use super::conn::Slot;
use crate::backend::BackendError;
use crate::machine::{LeaseId, Token};

/// The longest a waiter sleeps between looks (notifications lost while the
/// listener reconnects are caught up by then).
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The lock key of `name` under `lease`: the one format of every backend.
pub(crate) use crate::backend::lock_key;

/// Acquires `name` under `lease` (see [`crate::Backend::lock`]); with a
/// value, as an election's candidate carrying it (`dlock.campaign`, see
/// [`crate::Backend::campaign`]).
pub(crate) async fn lock(
    ops: &Slot,
    wake: &Notify,
    name: &str,
    lease: LeaseId,
    value: Option<&[u8]>,
    wait: bool,
    timeout: Duration,
) -> Result<Token, BackendError> {
    let key = lock_key(name, lease);
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (token, retry_ms): (Option<i64>, Option<f64>) = ops
            .run(timeout, |c| {
                let key = key.clone();
                async move {
                    let row = match value {
                        None => {
                            c.client
                                .query_typed_one(
                                    "SELECT token, retry_ms FROM dlock.acquire($1, $2, $3)",
                                    &[
                                        (&name, Type::TEXT),
                                        (&key, Type::TEXT),
                                        (&lease, Type::INT8),
                                    ],
                                )
                                .await?
                        }
                        Some(v) => {
                            c.client
                                .query_typed_one(
                                    "SELECT token, retry_ms FROM dlock.campaign($1, $2, $3, $4)",
                                    &[
                                        (&name, Type::TEXT),
                                        (&key, Type::TEXT),
                                        (&lease, Type::INT8),
                                        (&v, Type::BYTEA),
                                    ],
                                )
                                .await?
                        }
                    };
                    Ok((row.try_get(0)?, row.try_get(1)?))
                }
            })
            .await?;
        if let Some(t) = token {
            return Ok(Token(t as u64));
        }
        look_again(notified, retry_ms, wait).await?;
    }
}

/// Between two looks of a lock request the service did not grant: `Busy`
/// if it may not wait, else a wait for a row change (`notified`) or the
/// service's `retry_ms`, at most [`MAX_PAUSE`]. Mutexes, candidates and
/// read/write locks wait alike.
pub(super) async fn look_again(
    notified: Pin<&mut Notified<'_>>,
    retry_ms: Option<f64>,
    wait: bool,
) -> Result<(), BackendError> {
    if !wait {
        return Err(BackendError::Busy);
    }
    let pause = Duration::from_secs_f64(retry_ms.unwrap_or(20.0).max(1.0) / 1000.0).min(MAX_PAUSE);
    tokio::select! {
        _ = notified => {}
        _ = tokio::time::sleep(pause) => {}
    }
    Ok(())
}

/// Deletes the lock row of `name` under `lease` (with `token`: only that
/// acquisition's). Statements on one connection run in order, so a delete
/// without a token runs after a lock request of this key sent before it.
pub(crate) async fn unlock(
    ops: &Slot,
    name: &str,
    lease: LeaseId,
    token: Option<Token>,
    timeout: Duration,
) -> Result<(), BackendError> {
    let key = lock_key(name, lease);
    let token = token.map(|t| t.0 as i64);
    ops.run(timeout, |c| async move {
        c.client
            .query_typed(
                "DELETE FROM dlock.locks WHERE key = $1 AND lease = $2 \
                 AND ($3::int8 IS NULL OR token = $3) RETURNING token",
                &[
                    (&key, Type::TEXT),
                    (&lease, Type::INT8),
                    (&token, Type::INT8),
                ],
            )
            .await
    })
    .await
    .map(|_| ())
}
