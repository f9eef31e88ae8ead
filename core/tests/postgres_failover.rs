//! A promotion on the PostgreSQL test servers: it kills the primary, so
//! `scripts/test-postgres.sh` runs this binary alone, after the others.
//!
//! The synchronous standby is promoted; the first dlock connection to the
//! new primary sees the new timeline and extends every lease to at least
//! now + TTL on the new primary's clock; a lock held before the failover is
//! still held there, and a later acquisition draws a higher token.

use dlock_testkit::pg;

use std::time::Duration;

use dlock::Client;

fn connect(url: &str) -> Client {
    pg::client(url, dlock_testkit::options(Duration::from_secs(4), false))
}

#[test]
#[ignore = "needs PostgreSQL and kills its primary: scripts/test-postgres.sh"]
fn promotion_extends_leases_and_tokens_only_rise() {
    let s = pg::servers();
    let holder = connect(&s.url);
    let name = format!("pg/failover-{}", std::process::id());
    let lock = holder.lock(&name).unwrap();
    let t1 = lock.acquire(Duration::from_secs(5)).unwrap();
    let old = pg::Sql::connect(&s.url);
    let (lease, before): (i64, f64) = {
        let r = old
            .query(
                "SELECT l.id, extract(epoch FROM l.expires_at)::float8 FROM dlock.locks k \
                 JOIN dlock.leases l ON l.id = k.lease WHERE k.name = $1",
                &[&name],
            )
            .unwrap();
        (r[0].get(0), r[0].get(1))
    };
    drop(old);
    let script = std::env::var("DLOCK_TEST_PG_SCRIPT").expect("DLOCK_TEST_PG_SCRIPT");
    let st = std::process::Command::new(script)
        .arg("promote")
        .status()
        .unwrap();
    assert!(st.success(), "promote failed");
    // The promoted server has no standby of its own: a declared single node.
    let url = format!("{}?dlock_single_node=true", s.standby_url);
    let sql = pg::Sql::connect(&s.standby_url);
    // The new primary's clock before dlock first connects to it.
    let floor: f64 = sql
        .query(
            "SELECT extract(epoch FROM clock_timestamp() + interval '4 seconds')::float8",
            &[],
        )
        .unwrap()[0]
        .get(0);
    let contender = connect(&url);
    let r = sql
        .query(
            "SELECT extract(epoch FROM expires_at)::float8 FROM dlock.leases WHERE id = $1",
            &[&lease],
        )
        .unwrap();
    assert_eq!(r.len(), 1, "the lease survived the promotion");
    let after: f64 = r[0].get(0);
    assert!(
        after >= floor && after >= before,
        "lease expiry {after} (was {before}, floor {floor})"
    );
    let l2 = contender.lock(&name).unwrap();
    assert_eq!(
        l2.try_acquire().unwrap_err(),
        dlock::Error::WouldBlock,
        "the lock held before the failover"
    );
    let other = contender.lock(&format!("{name}-other")).unwrap();
    let t2 = other.acquire(Duration::from_secs(5)).unwrap();
    assert!(t2 > t1, "token {t2} after {t1}");
    other.release().unwrap();
}
