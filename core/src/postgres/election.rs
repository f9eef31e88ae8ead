//! Elections on PostgreSQL (docs/elections.md): a candidate is a lock row
//! carrying its value (`dlock.campaign`, in [`super::mutex`]); the leader
//! of a name is its row with the lowest token on a live lease; a proclaim
//! changes the value while the token holds. Observers wake on the lock
//! rows' notifications (a proclaim is `<token> V`) and at the leader's
//! remaining TTL, since nothing fires when a lease expires.

use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::types::Type;

use super::conn::Slot;
use crate::backend::{BackendError, Leader, lock_key};
use crate::machine::{LeaseId, Token};

/// The longest an observer sleeps between looks (notifications lost while
/// the listener reconnects are caught up by then).
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Puts `value` on the candidate row of `name` under `lease` only while it
/// holds `token` on a live lease; else [`BackendError::Fenced`].
pub(crate) async fn proclaim(
    ops: &Slot,
    name: &str,
    lease: LeaseId,
    token: Token,
    value: &[u8],
    timeout: Duration,
) -> Result<(), BackendError> {
    let key = lock_key(name, lease);
    let token = token.0 as i64;
    let rows = ops
        .run(timeout, |c| async move {
            c.client
                .query_typed(
                    "UPDATE dlock.locks k SET value = $4 FROM dlock.leases l \
                     WHERE k.key = $1 AND k.token = $2 AND k.lease = $3 \
                       AND l.id = k.lease AND l.expires_at > clock_timestamp() \
                     RETURNING k.token",
                    &[
                        (&key, Type::TEXT),
                        (&token, Type::INT8),
                        (&lease, Type::INT8),
                        (&value, Type::BYTEA),
                    ],
                )
                .await
        })
        .await?;
    match rows.is_empty() {
        true => Err(BackendError::Fenced),
        false => Ok(()),
    }
}

/// The leader of `name` once it differs from `last` (at once when `last`
/// is `None`), read after the change: a leader whose lease has expired is
/// never returned.
pub(crate) async fn next_leader(
    ops: &Slot,
    wake: &Notify,
    name: &str,
    last: Option<&Option<Leader>>,
    timeout: Duration,
) -> Result<Option<Leader>, BackendError> {
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let row = ops
            .run(timeout, |c| async move {
                c.client
                    .query_typed(
                        "SELECT k.key, k.token, k.lease, coalesce(k.value, '\\x'::bytea), \
                                (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::float8 \
                         FROM dlock.locks k JOIN dlock.leases l ON l.id = k.lease \
                         WHERE k.name = $1 AND l.expires_at > clock_timestamp() \
                         ORDER BY k.token LIMIT 1",
                        &[(&name, Type::TEXT)],
                    )
                    .await
            })
            .await?;
        let (now, left_ms) = match row.first() {
            None => (None, None),
            Some(r) => {
                let token: i64 = r.try_get(1).map_err(|e| bad_row(&e))?;
                let left: f64 = r.try_get(4).map_err(|e| bad_row(&e))?;
                let leader = Leader {
                    key: r.try_get(0).map_err(|e| bad_row(&e))?,
                    token: Token(token as u64),
                    lease: r.try_get(2).map_err(|e| bad_row(&e))?,
                    value: r.try_get(3).map_err(|e| bad_row(&e))?,
                };
                (Some(leader), Some(left))
            }
        };
        if last.is_none_or(|l| *l != now) {
            return Ok(now);
        }
        look_again(notified, left_ms).await;
    }
}

/// Waits for a lock row's notification (`notified`, enabled before the
/// look), or for the soonest lease of the rows looked at to run out
/// (`soonest_ms` from now: nothing fires when a lease expires), at most
/// [`MAX_PAUSE`]: the one pause of the reads that look again after a
/// change (the next leader, a free slot).
pub(super) async fn look_again(
    notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    soonest_ms: Option<f64>,
) {
    let pause = soonest_ms
        .map_or(MAX_PAUSE, |ms| {
            Duration::from_secs_f64(ms.max(1.0) / 1000.0)
        })
        .min(MAX_PAUSE);
    tokio::select! {
        _ = notified => {}
        _ = tokio::time::sleep(pause) => {}
    }
}

fn bad_row(e: &tokio_postgres::Error) -> BackendError {
    BackendError::Unavailable(format!("reading the leader: {e}"))
}
