//! The primary restarted (`scripts/pg-cluster.sh restart`, a fast shutdown
//! that cuts every connection; the rows stay) within a holder's TTL: the
//! holder drains on the failed keepalive and resumes with the same token
//! once a keepalive on a new connection is confirmed before its deadline;
//! it is never fenced, nobody else gets the lock meanwhile, and the key
//! watch works again afterwards (the listener reconnected: an operator's
//! delete fences at once). Run alone by `scripts/test-postgres.sh`.
//!
//! Settings: TTL 8 s, keepalive every 1 s, timeout 0.5 s, margin 1 s.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock::{Client, Error, State};
use dlock_testkit::pg;

const EVENT: Duration = Duration::from_secs(20);

fn client(url: &str) -> Client {
    pg::client(url, dlock_testkit::options(Duration::from_secs(8), false))
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_primary_restart_within_the_ttl_drains_and_resumes_without_a_fence() {
    let s = pg::servers();
    let holder = client(&s.url);
    let name = format!("pg/restart-{}", std::process::id());
    let lock = holder.lock(&name).unwrap();
    let (tx, rx) = mpsc::channel();
    lock.on_state_change(move |c| {
        let _ = tx.send((Instant::now(), c.to));
    });
    let (ftx, frx) = mpsc::channel();
    lock.on_fence(move |t, _| {
        let _ = ftx.send(t);
    });
    let token = lock.acquire(EVENT).unwrap();
    // The acquisition's own change comes from the callback thread, maybe
    // after acquire returned: wait for it, so it is not read as the
    // restart's.
    loop {
        match rx.recv_timeout(EVENT) {
            Ok((_, State::Holding)) => break,
            Ok(_) => {}
            Err(e) => panic!("no Holding change after the acquisition: {e}"),
        }
    }
    while rx.try_recv().is_ok() {}

    let script = std::env::var("DLOCK_TEST_PG_SCRIPT").expect("DLOCK_TEST_PG_SCRIPT");
    let restarted = Instant::now();
    let st = std::process::Command::new(script)
        .args(["restart", "primary"])
        .status()
        .unwrap();
    assert!(st.success(), "restart failed");
    let took = restarted.elapsed();

    // Drained on a failed keepalive, then holding again.
    let end = Instant::now() + EVENT;
    let (mut drained, mut resumed) = (None, None);
    while resumed.is_none() && Instant::now() < end {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((t, State::Draining)) => drained = Some(t),
            Ok((t, State::Holding)) if drained.is_some() => resumed = Some(t),
            Ok((_, other)) => panic!("state {other:?} after the restart"),
            Err(_) => {}
        }
    }
    let (drained, resumed) = (
        drained.expect("drained after the restart"),
        resumed.expect("holding again after the restart"),
    );
    assert!(
        frx.try_recv().is_err(),
        "fenced by a restart within the TTL"
    );
    assert_eq!(lock.token(), Some(token));
    assert_eq!(lock.state(), State::Holding);
    // Nobody else can take it: the server kept the lease.
    let other = client(&s.url);
    let l2 = other.lock(&name).unwrap();
    assert!(matches!(l2.try_acquire(), Err(Error::WouldBlock)));
    println!(
        "FAULT|pg primary restarted|1|-|-|-|restart took {} ms; drained {} ms after it began, holding again {} ms later; not fenced",
        took.as_millis(),
        (drained - restarted).as_millis(),
        (resumed - drained).as_millis()
    );

    // The key watch listens again: an operator's delete fences at once.
    let sql = pg::Sql::connect(&s.url);
    let deleted = Instant::now();
    sql.query("DELETE FROM dlock.locks WHERE name = $1", &[&name])
        .unwrap();
    let fenced = frx.recv_timeout(EVENT).expect("fenced by the delete");
    assert_eq!(fenced, token);
    let after = deleted.elapsed();
    assert!(
        after < Duration::from_secs(2),
        "the delete fenced {after:?} later: the listener did not come back"
    );
}
