//! Writes to your own PostgreSQL table only while your dlock token still
//! holds: `SELECT dlock.guard(name, token)` first in every transaction
//! (docs/postgres.md), with tokio-postgres.
//!
//! Why: a holder paused past its TTL (a GC pause, swap, a frozen VM)
//! resumes not knowing that the lock moved on; any check it made before the
//! pause (a permit, the fence) is stale by then. `dlock.guard` checks inside
//! the write's own transaction: it holds the lock's row until COMMIT, so a
//! takeover waits for this transaction, and it raises SQLSTATE DL001
//! ([`dlock::GUARD_SQLSTATE`]) when the token no longer holds, so the stale
//! transaction rolls back instead of landing after the new holder's writes.
//!
//! Run: `DLOCK_ENDPOINTS=postgresql://app:secret@db.internal:5432/app
//! cargo run --example pg_guard -- [WHO] [UNITS]`.
//!
//! `DATABASE_URL` is the application's own connection (default
//! `DLOCK_ENDPOINTS`; set it when that URL carries dlock's own parameters,
//! such as `dlock_single_node`). It must be the database holding the dlock
//! schema: the guard runs there, in your transaction. `PG_GUARD_PAUSE_AT=N`
//! stops this process (SIGSTOP) before unit N, the pause the guard is for;
//! resume it with `kill -CONT`. `core/tests/postgres_guard_process.rs` does.

use std::time::Duration;

use dlock::{Client, ClientConfig, GUARD_SQLSTATE, Options};

const NAME: &str = "examples/pg-guard";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let who = args
        .next()
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let units: i32 = args.next().map_or(Ok(5), |u| u.parse())?;
    let pause_at: Option<i32> = match std::env::var("PG_GUARD_PAUSE_AT") {
        Ok(v) => Some(v.parse()?),
        Err(_) => None,
    };
    let db_url = std::env::var("DATABASE_URL").or_else(|_| std::env::var("DLOCK_ENDPOINTS"))?;

    // `from_env` reads DLOCK_ENDPOINTS: a postgres:// URL selects
    // PostgreSQL. No reacquire: once this worker loses the lock it stops.
    let options = Options {
        ttl: Duration::from_secs(3),
        keepalive_interval: Duration::from_secs(1),
        keepalive_timeout: Duration::from_millis(500),
        retry_interval: Duration::from_millis(250),
        margin: Duration::from_secs(1),
        reacquire: false,
    };
    let client = Client::connect_async(ClientConfig::from_env().with_options(options)).await?;
    let lock = client.lock(NAME)?;
    let token = lock.acquire_async(Some(Duration::from_secs(30))).await?;
    println!("{who}: holds {NAME}, token {token}");
    // The guard's parameter is a bigint.
    let token = i64::try_from(token.get())?;

    let (mut db, connection) = tokio_postgres::connect(&db_url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS pg_guard_units \
         (id bigserial PRIMARY KEY, who text NOT NULL, unit int NOT NULL, token bigint NOT NULL)",
    )
    .await?;

    let mut outcome = Ok(());
    for unit in 0..units {
        if pause_at == Some(unit) {
            println!("{who}: pausing before unit {unit}");
            // SAFETY: raise(3) has no memory-safety preconditions.
            unsafe { libc::raise(libc::SIGSTOP) };
            println!("{who}: resumed");
        }
        match write_unit(&mut db, &who, unit, token).await {
            Ok(()) => println!("{who}: unit {unit} committed with token {token}"),
            Err(e) if e.code().map(|c| c.code()) == Some(GUARD_SQLSTATE) => {
                // Rolled back: nothing of this transaction landed.
                println!(
                    "{who}: refused by the database (SQLSTATE {GUARD_SQLSTATE}): token {token} no longer holds {NAME}; stopping"
                );
                break;
            }
            Err(e) => {
                outcome = Err(e.into());
                break;
            }
        }
        if unit + 1 == units {
            println!("{who}: {units} units done with token {token}");
        }
    }
    lock.release_async().await?;
    outcome
}

/// One unit of work in one transaction, the guard first. An error drops
/// `tx`, which rolls the transaction back.
async fn write_unit(
    db: &mut tokio_postgres::Client,
    who: &str,
    unit: i32,
    token: i64,
) -> Result<(), tokio_postgres::Error> {
    let tx = db.transaction().await?;
    // From here to COMMIT no one else can take the lock, or DL001.
    tx.execute("SELECT dlock.guard($1, $2)", &[&NAME, &token])
        .await?;
    tx.execute(
        "INSERT INTO pg_guard_units (who, unit, token) VALUES ($1, $2, $3)",
        &[&who, &unit, &token],
    )
    .await?;
    tx.commit().await
}
