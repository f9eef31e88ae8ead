//! README.md's `## PostgreSQL` block as written (issue 28): it lives here,
//! between the `README` markers, and core/tests/readme.rs holds it equal to
//! the README's. Here it runs on the PostgreSQL test servers
//! (`scripts/test-postgres.sh` runs it with `--ignored`), with
//! `DLOCK_ENDPOINTS` set to the primary's URL, and the test checks what
//! its comments say: the URL selects PostgreSQL, the guarded transaction
//! commits while the token holds, and once it no longer holds the guard
//! refuses with SQLSTATE DL001 and nothing of that transaction commits.

use std::time::Duration;

use dlock::{Client, ClientConfig, GUARD_SQLSTATE, Lock, Token};
use dlock_testkit::pg;

type Outcome = Result<(Client, Lock, Token), Box<dyn std::error::Error>>;

// As README.md has it, so rustfmt leaves it alone.
#[rustfmt::skip]
async fn readme_postgres(db: &mut tokio_postgres::Client, order: i64) -> Outcome {
    // README: begin (README.md, `## PostgreSQL`, the first ```rust block)
    // DLOCK_ENDPOINTS=postgresql://app@db.internal:5432/app selects PostgreSQL
    let client = dlock::Client::connect_async(dlock::ClientConfig::from_env()).await?;
    let lock = client.lock("orders")?;
    let token = lock.acquire_async(Some(Duration::from_secs(10))).await?;

    let tx = db.transaction().await?; // your own transaction on your own tables, the guard first
    tx.execute("SELECT dlock.guard($1, $2)", &[&"orders", &(token.get() as i64)]).await?;
    tx.execute("UPDATE orders SET state = 'shipped' WHERE id = $1", &[&order]).await?;
    tx.commit().await?; // once `token` no longer holds: SQLSTATE DL001, nothing committed
    // README: end
    Ok((client, lock, token))
}

async fn state(db: &tokio_postgres::Client, order: i64) -> String {
    db.query_one("SELECT state FROM orders WHERE id = $1", &[&order])
        .await
        .unwrap()
        .get(0)
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn the_readme_postgres_block_commits_under_the_guard_and_a_stale_token_commits_nothing() {
    let s = pg::servers();
    // SAFETY: this test binary reads DLOCK_ENDPOINTS nowhere else, and
    // sets it before any thread of its own starts.
    unsafe { std::env::set_var("DLOCK_ENDPOINTS", &s.url) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut db, connection) = tokio_postgres::connect(&s.url, tokio_postgres::NoTls)
            .await
            .expect("the application's connection");
        tokio::spawn(connection);
        db.batch_execute(
            "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, state text NOT NULL)",
        )
        .await
        .unwrap();
        let order: i64 = db
            .query_one(
                "INSERT INTO orders (id, state) VALUES \
                 ((SELECT coalesce(max(id), 0) + 1 FROM orders), 'new') RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .get(0);

        let (client, lock, token) = readme_postgres(&mut db, order)
            .await
            .expect("the README's block runs on PostgreSQL");
        assert_eq!(state(&db, order).await, "shipped");
        // The URL selected PostgreSQL: the lock's row there holds the token.
        let row = db
            .query_one("SELECT token FROM dlock.locks WHERE name = 'orders'", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0) as u64, token.get());

        // The lock moves on: the same transaction with the old token
        // commits nothing.
        lock.release_async().await.unwrap();
        let next = Client::connect_async(ClientConfig::from_env())
            .await
            .unwrap();
        let next_lock = next.lock("orders").unwrap();
        let next_token = next_lock
            .acquire_async(Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert!(next_token > token);
        let tx = db.transaction().await.unwrap();
        let refused = tx
            .execute(
                "SELECT dlock.guard($1, $2)",
                &[&"orders", &(token.get() as i64)],
            )
            .await
            .expect_err("a stale token passed the guard");
        assert_eq!(
            refused.code().map(|c| c.code()),
            Some(GUARD_SQLSTATE),
            "{refused}"
        );
        drop(tx);
        assert_eq!(state(&db, order).await, "shipped");
        next_lock.release_async().await.unwrap();
        drop(client);
    });
}
