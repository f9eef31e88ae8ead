//! Read/write locks on PostgreSQL (docs/design.md §27): `dlock.acquire_rw`
//! queues the holder's row at once (its token drawn from the one sequence
//! under the name's row lock, the mode in `value`) and says whether it
//! holds; a waiter looks again when a row changes (NOTIFY: a delete, or a
//! downgrade's new value) or at the earliest expiry before it. Every look
//! reads the holder's own row and lease again.

use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::types::Type;

use super::conn::Slot;
use super::mutex::{lock_key, look_again};
use crate::backend::BackendError;
use crate::machine::{LeaseId, Token};
use crate::mode::Mode;

/// Acquires `name` under `lease` in `mode` (see [`crate::Backend::lock_rw`]).
pub(crate) async fn lock_rw(
    ops: &Slot,
    wake: &Notify,
    name: &str,
    lease: LeaseId,
    mode: Mode,
    wait: bool,
    timeout: Duration,
) -> Result<Token, BackendError> {
    let key = lock_key(name, lease);
    let read = mode == Mode::Read;
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (token, held, retry_ms): (Option<i64>, bool, Option<f64>) = ops
            .run(timeout, |c| {
                let key = key.clone();
                async move {
                    let row = c
                        .client
                        .query_typed_one(
                            "SELECT token, held, retry_ms FROM dlock.acquire_rw($1, $2, $3, $4, $5)",
                            &[
                                (&name, Type::TEXT),
                                (&key, Type::TEXT),
                                (&lease, Type::INT8),
                                (&read, Type::BOOL),
                                (&wait, Type::BOOL),
                            ],
                        )
                        .await?;
                    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
                }
            })
            .await?;
        if let (Some(t), true) = (token, held) {
            return Ok(Token(t as u64));
        }
        look_again(notified, retry_ms, wait).await?;
    }
}
