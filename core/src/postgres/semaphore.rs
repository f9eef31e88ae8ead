//! A semaphore's free slot on PostgreSQL (docs/design.md §26): one query
//! of the slots' lock rows on live leases; when every slot has one, a
//! wait for the lock rows' notifications, or for the soonest of those
//! leases to expire (nothing fires when a lease expires), then look
//! again. Only the head of the semaphore's queue waits here.

use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::types::Type;

use super::conn::Slot;
use crate::backend::BackendError;
use crate::semaphore::{first_free, slot_name, slot_of_key};

/// See [`crate::Backend::free_slot`].
pub(crate) async fn free_slot(
    ops: &Slot,
    wake: &Notify,
    name: &str,
    limit: u32,
    wait: bool,
    timeout: Duration,
) -> Result<Option<u32>, BackendError> {
    let names: Vec<String> = (0..limit).map(|i| slot_name(name, i)).collect();
    let names = &names;
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let rows = ops
            .run(timeout, |c| async move {
                c.client
                    .query_typed(
                        "SELECT k.name, \
                                min(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::float8 \
                         FROM dlock.locks k JOIN dlock.leases l ON l.id = k.lease \
                         WHERE k.name = ANY($1) AND l.expires_at > clock_timestamp() \
                         GROUP BY k.name",
                        &[(names, Type::TEXT_ARRAY)],
                    )
                    .await
            })
            .await?;
        let mut taken = Vec::with_capacity(rows.len());
        let mut soonest: Option<f64> = None;
        for r in &rows {
            let slot: &str = r.try_get(0).map_err(|e| bad_row(&e))?;
            let left: f64 = r.try_get(1).map_err(|e| bad_row(&e))?;
            // `<name>/slot/<i>` is a key of slot i without its lease part.
            taken.extend(slot_of_key(name, slot));
            soonest = Some(soonest.map_or(left, |s| s.min(left)));
        }
        let free = first_free(limit, taken);
        if free.is_some() || !wait {
            return Ok(free);
        }
        super::election::look_again(notified, soonest).await;
    }
}

fn bad_row(e: &tokio_postgres::Error) -> BackendError {
    BackendError::Unavailable(format!("reading a semaphore's slots: {e}"))
}
