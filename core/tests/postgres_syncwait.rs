//! A cancelled wait for synchronous replication: PostgreSQL then returns
//! success with only a WARNING, and the commit is on the primary alone. Such
//! a keepalive reply must not count as confirmed. It makes every commit on
//! the primary wait, so `scripts/test-postgres.sh` runs this binary alone.
//!
//! The primary is told to wait for a standby that does not exist; the
//! holder's next keepalive blocks in the wait; an operator cancels it
//! (`pg_cancel_backend`). The holder must drain at once (the reply is not
//! a confirmation), not a keepalive timeout later.

use dlock_testkit::pg;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, Options, PostgresConfig, State};

#[test]
#[ignore = "needs PostgreSQL and stalls its commits: scripts/test-postgres.sh"]
fn a_cancelled_sync_wait_is_not_a_confirmed_keepalive() {
    let s = pg::servers();
    let superuser = Sql::superuser(&s.url);
    let options = Options {
        ttl: Duration::from_secs(12),
        keepalive_interval: Duration::from_secs(2),
        keepalive_timeout: Duration::from_millis(1900),
        retry_interval: Duration::from_millis(250),
        margin: Duration::from_secs(1),
        reacquire: false,
    };
    let c = Client::connect(
        ClientConfig::postgres(PostgresConfig::parse(&s.url).unwrap()).with_options(options),
    )
    .unwrap();
    let lock = c
        .lock(&format!("pg/syncwait-{}", std::process::id()))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    lock.on_state_change(move |ch| {
        let _ = tx.send((Instant::now(), ch.to));
    });
    lock.acquire(Duration::from_secs(5)).unwrap();

    superuser.stall_commits(true);
    // The holder's next keepalive waits for the missing standby.
    let end = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        let rows = superuser
            .0
            .query(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' \
                 AND query LIKE 'UPDATE dlock.leases SET expires_at%'",
                &[],
            )
            .unwrap();
        if let Some(r) = rows.first() {
            break r.get::<_, i32>(0);
        }
        assert!(Instant::now() < end, "no keepalive waited for the standby");
        std::thread::sleep(Duration::from_millis(20));
    };
    let cancelled = Instant::now();
    superuser
        .0
        .query("SELECT pg_cancel_backend($1)", &[&pid])
        .unwrap();
    let drained = rx
        .iter()
        .find(|(_, st)| *st == State::Draining)
        .map(|(t, _)| t);
    superuser.stall_commits(false);
    let drained = drained.expect("drained");
    let after = drained.saturating_duration_since(cancelled);
    assert!(
        after < Duration::from_millis(500),
        "drained {after:?} after the cancelled wait: its reply was taken as confirmed"
    );
    // Replication back: the next keepalive confirms and the lock holds again.
    let end = Instant::now() + Duration::from_secs(10);
    while lock.state() != State::Holding {
        assert!(Instant::now() < end, "not held again: {:?}", lock.state());
        std::thread::sleep(Duration::from_millis(20));
    }
    lock.release().unwrap();
}

/// The superuser on the primary (trusted on loopback by the test servers).
struct Sql(pg::Sql);

impl Sql {
    fn superuser(url: &str) -> Sql {
        Sql(pg::Sql::connect(&format!(
            "postgresql://postgres@{}/postgres",
            pg::addr(url)
        )))
    }

    /// Makes every commit wait for a standby that does not exist (or back).
    fn stall_commits(&self, on: bool) {
        let names = if on { "nobody" } else { "standby1" };
        self.0
            .batch(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
            ))
            .unwrap();
        self.0.batch("SELECT pg_reload_conf()").unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
}
