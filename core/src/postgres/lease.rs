//! Leases: rows whose expiry the server's clock decides at each statement.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_postgres::types::Type;

use super::conn::Slot;
use crate::backend::{BackendError, Grant};
use crate::identity::{Identity, LockHolder};
use crate::machine::{LeaseId, Token};

/// Inserts a lease expiring `ttl` from now on the server's clock, with
/// its holder's identity in the same row (no statement of its own).
pub(crate) async fn grant(
    slot: &Slot,
    ttl: Duration,
    identity: Option<&Identity>,
    timeout: Duration,
) -> Result<Grant, BackendError> {
    let secs = ttl.as_secs_f64();
    let holder = identity.map(Identity::to_json);
    let holder = &holder;
    let lease: i64 = slot
        .run(timeout, |c| async move {
            let row = c
                .client
                .query_typed_one(
                    "INSERT INTO dlock.leases (ttl, expires_at, holder) \
                     VALUES (make_interval(secs => $1), clock_timestamp() + make_interval(secs => $1), $2::jsonb) \
                     RETURNING id",
                    &[(&secs, Type::FLOAT8), (holder, Type::TEXT)],
                )
                .await?;
            row.try_get(0)
        })
        .await?;
    Ok(Grant { lease, ttl })
}

/// Extends `lease` by its TTL only while it has not expired: a late
/// keepalive never revives a lease (no row: [`BackendError::LeaseNotFound`]).
/// A reply that came with a WARNING of a cancelled wait for synchronous
/// replication is not confirmed on the standby: `Unavailable`. The whole
/// call, opening a connection included, takes at most `timeout`.
pub(crate) async fn keepalive(
    slot: &Slot,
    lease: LeaseId,
    timeout: Duration,
) -> Result<Duration, BackendError> {
    tokio::time::timeout(timeout, keepalive_once(slot, lease, timeout))
        .await
        .unwrap_or_else(|_| {
            Err(BackendError::Unavailable(format!(
                "no keepalive reply within {} ms",
                timeout.as_millis()
            )))
        })
}

async fn keepalive_once(
    slot: &Slot,
    lease: LeaseId,
    timeout: Duration,
) -> Result<Duration, BackendError> {
    slot.run(timeout, |c| async move {
        let before = c.sync_cancels.load(Ordering::SeqCst);
        let rows = c
            .client
            .query_typed(
                "UPDATE dlock.leases SET expires_at = clock_timestamp() + ttl \
                 WHERE id = $1 AND expires_at > clock_timestamp() \
                 RETURNING extract(epoch FROM ttl)::float8",
                &[(&lease, Type::INT8)],
            )
            .await?;
        let cancelled = c.sync_cancels.load(Ordering::SeqCst) != before;
        let ttl = match rows.first() {
            Some(r) => Some(r.try_get::<_, f64>(0)?),
            None => None,
        };
        Ok((ttl, cancelled))
    })
    .await
    .and_then(|(ttl, cancelled)| match (ttl, cancelled) {
        (_, true) => Err(BackendError::Unavailable(
            "the keepalive's wait for synchronous replication was cancelled: not confirmed".into(),
        )),
        (None, false) => Err(BackendError::LeaseNotFound),
        (Some(secs), false) => Ok(Duration::from_secs_f64(secs.max(0.0))),
    })
}

/// Deletes `lease` and, by cascade, its locks (their watchers hear it).
pub(crate) async fn revoke(
    slot: &Slot,
    lease: LeaseId,
    timeout: Duration,
) -> Result<(), BackendError> {
    let rows = slot
        .run(timeout, |c| async move {
            c.client
                .query_typed(
                    "DELETE FROM dlock.leases WHERE id = $1 RETURNING id",
                    &[(&lease, Type::INT8)],
                )
                .await
        })
        .await?;
    if rows.is_empty() {
        Err(BackendError::LeaseNotFound)
    } else {
        Ok(())
    }
}

/// See [`crate::Backend::holder`]: the lowest token under `<name>/` on a
/// live lease, with the identity its lease row records.
pub(crate) async fn holder(
    ops: &Slot,
    name: &str,
    timeout: Duration,
) -> Result<Option<LockHolder>, BackendError> {
    let rows = ops
        .run(timeout, |c| async move {
            c.client
                .query_typed(
                    "SELECT k.key, k.token, k.lease, l.holder::text \
                     FROM dlock.locks k JOIN dlock.leases l ON l.id = k.lease \
                     WHERE k.key >= $1 || '/' AND k.key < $1 || '0' \
                       AND l.expires_at > clock_timestamp() \
                     ORDER BY k.token LIMIT 1",
                    &[(&name, Type::TEXT)],
                )
                .await
        })
        .await?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let token: i64 = r.try_get(1).map_err(|e| bad_holder(&e))?;
    let identity: Option<String> = r.try_get(3).map_err(|e| bad_holder(&e))?;
    Ok(Some(LockHolder {
        key: r.try_get(0).map_err(|e| bad_holder(&e))?,
        token: Token(token as u64),
        lease: r.try_get(2).map_err(|e| bad_holder(&e))?,
        identity: identity
            .and_then(|j| Identity::from_json(j.as_bytes()))
            .map(Arc::new),
    }))
}

fn bad_holder(e: &tokio_postgres::Error) -> BackendError {
    BackendError::Unavailable(format!("reading the holder: {e}"))
}
