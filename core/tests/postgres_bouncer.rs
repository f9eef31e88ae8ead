//! dlock through PgBouncer in transaction pool mode (the test servers'
//! `scripts/pg-cluster.sh` starts one in front of the primary): every
//! statement goes through the pooler, the listener to the server itself
//! (`dlock_listen=HOST:PORT`); without that setting the connect is refused
//! with an error that names it.
//!
//! Two fault proxies count the connections: one in front of PgBouncer, one
//! in front of the primary for the listener.
//!
//! Settings: TTL 4 s, keepalive every 1 s, timeout 0.5 s, retry every
//! 0.25 s, margin 1 s.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, Error, PostgresConfig, State, Token};

use dlock_testkit::proxy::Proxy;
use dlock_testkit::{fresh, pg};

/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(15);

fn connect(url: &str) -> Result<Client, Error> {
    let mut config = PostgresConfig::parse(url)?;
    config.request_timeout = Duration::from_secs(1);
    Client::connect(ClientConfig::postgres(config).with_options(dlock_testkit::backend_options()))
}

/// The PgBouncer URL with the listener sent to `direct` (`host:port`).
fn pooled(bouncer: &str, direct: &str) -> String {
    format!("{bouncer}?dlock_listen={direct}")
}

/// The lock row's lease expiry on the server's clock (seconds), if held.
fn expiry(sql: &pg::Sql, name: &str) -> Option<f64> {
    sql.query(
        "SELECT extract(epoch FROM l.expires_at)::float8 FROM dlock.locks k \
         JOIN dlock.leases l ON l.id = k.lease WHERE k.name = $1",
        &[&name],
    )
    .unwrap()
    .first()
    .map(|r| r.get(0))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + EVENT;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {EVENT:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Without `dlock_listen` the listener would LISTEN on a pooled server
/// connection and never hear a thing: refused at connect, naming the fix.
#[test]
#[ignore = "needs PostgreSQL and PgBouncer: scripts/test-postgres.sh"]
fn pgbouncer_without_a_listen_address_is_refused_clearly() {
    let bouncer = pg::bouncer_url();
    let started = Instant::now();
    match connect(&bouncer) {
        Err(Error::Backend(m)) => assert!(
            m.contains("dlock_listen=HOST:PORT") && m.contains("PgBouncer"),
            "{m}"
        ),
        other => panic!(
            "connected through PgBouncer with LISTEN on the pooler: {:?}",
            other.map(|_| ())
        ),
    }
    // Refused after the probe's wait (the request timeout), not hung.
    assert!(started.elapsed() < Duration::from_secs(5));
    // Bad values are refused before connecting.
    for bad in [
        "dlock_listen=",
        "dlock_listen=h%2Fx",
        "dlock_listen=u%40h:1",
    ] {
        match connect(&format!("{bouncer}?{bad}")) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("dlock_listen"), "{bad}: {m}"),
            other => panic!("{bad} accepted: {:?}", other.map(|_| ())),
        }
    }
}

/// Acquire, contention (a waiter woken by NOTIFY through the direct
/// listener), keepalives extending the lease, release, tokens rising,
/// guarded writes, `dlock.guard` in an application's transaction through
/// the pooler, and the key watch: all with the statements on PgBouncer.
#[test]
#[ignore = "needs PostgreSQL and PgBouncer: scripts/test-postgres.sh"]
fn through_pgbouncer_in_transaction_mode_with_a_direct_listener() {
    let s = pg::servers();
    let bouncer = pg::bouncer_url();
    let sql = pg::Sql::connect(&s.url);
    let pooler = Proxy::start(pg::addr(&bouncer));
    let direct = Proxy::start(pg::addr(&s.url));
    let url = pooled(
        &pg::via(&bouncer, pooler.addr()),
        &direct.addr().to_string(),
    );
    let a = connect(&url).unwrap();
    // Statements and keepalives through PgBouncer, the listener direct.
    assert_eq!(pooler.open(), 2, "statement and keepalive connections");
    assert_eq!(direct.open(), 1, "the listener's connection");
    let b = connect(&url).unwrap();

    let name = fresh("pg/bouncer-order");
    let la = a.lock(&name).unwrap();
    let lb = b.lock(&name).unwrap();
    let t1 = la.acquire(EVENT).unwrap();
    assert_eq!(lb.try_acquire().unwrap_err(), Error::WouldBlock);

    // Keepalives through the pooler extend the lease on the server.
    let first = expiry(&sql, &name).expect("held");
    wait_until("two keepalives extend the lease", || {
        expiry(&sql, &name).is_some_and(|e| e > first + 1.5)
    });
    assert_eq!(la.state(), State::Holding);

    // Guarded writes through the pooler.
    la.guarded_put(t1, b"bouncer-key", b"v1").unwrap();

    // A waiter, woken by the NOTIFY of the release.
    let (lb, t2, took) = pg::woken_by_notify(&la, t1, lb, EVENT);
    let woke_ms = took.as_secs_f64() * 1e3;
    // The old token's guarded write is refused, the new one's lands.
    assert!(la.guarded_put(t1, b"bouncer-key", b"stale").is_err());
    lb.guarded_put(t2, b"bouncer-key", b"v2").unwrap();
    let v = sql
        .query(
            "SELECT value FROM dlock.kv WHERE key = $1",
            &[&&b"bouncer-key"[..]],
        )
        .unwrap();
    assert_eq!(v[0].get::<_, Vec<u8>>(0), b"v2");

    // An application's own transaction through PgBouncer (transaction mode
    // keeps one server connection for the whole transaction).
    let app = pg::Sql::connect(&bouncer);
    let guarded = |token: Token| {
        app.batch(&format!(
            "BEGIN; SELECT dlock.guard('{name}', {}); \
             INSERT INTO dlock.kv VALUES ('\\x01', '\\x{:02x}') \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value; COMMIT",
            token.get(),
            token.get() % 256
        ))
    };
    guarded(t2).unwrap();
    let e = guarded(t1).expect_err("a stale token's transaction committed");
    assert_eq!(
        e.code().map(|c| c.code()),
        Some(dlock::GUARD_SQLSTATE),
        "{e:?}"
    );
    app.batch("ROLLBACK").ok();

    // The key watch (on the direct listener): an operator's delete fences.
    let (ftx, frx) = mpsc::channel();
    lb.on_fence(move |t, _| {
        let _ = ftx.send((Instant::now(), t));
    });
    let took = pg::operator_delete_fences(&sql, &name, &frx, t2, EVENT);
    println!(
        "FAULT|pg PgBouncer transaction mode|1|-|-|n/a|release->waiter {woke_ms:.0}, delete->fence {:.0}",
        took.as_secs_f64() * 1e3
    );
    // Reacquired (reacquire: true), higher, through the pooler.
    wait_until("reacquired above the deleted token", || {
        lb.token().is_some_and(|t| t > t2)
    });
    lb.release().unwrap();
    let t3 = la.acquire(EVENT).unwrap();
    assert!(t3 > t2);
    la.release().unwrap();
    drop((a, b));
}

/// Several clients through the pooler on one name: every statement is its
/// own transaction on whichever server connection PgBouncer picks, so
/// nothing may rely on a session. Mutual exclusion holds (a counter in
/// dlock.kv, read and written under the lock by guarded writes) and the
/// tokens handed out only rise.
#[test]
#[ignore = "needs PostgreSQL and PgBouncer: scripts/test-postgres.sh"]
fn several_clients_through_pgbouncer_exclude_each_other() {
    let s = pg::servers();
    let url = pooled(&pg::bouncer_url(), &pg::addr(&s.url).to_string());
    let name = fresh("pg/bouncer-many");
    let key = name.clone().into_bytes();
    let clients = 4;
    let rounds = 8;
    let (tx, rx) = mpsc::channel();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (url, name, key, tx) = (url.clone(), name.clone(), key.clone(), tx.clone());
            thread::spawn(move || {
                let c = connect(&url).unwrap();
                let l = c.lock(&name).unwrap();
                let sql = pg::Sql::connect(&pg::servers().url);
                for _ in 0..rounds {
                    let t = l.acquire(EVENT).unwrap();
                    let n: i64 = sql
                        .query("SELECT value FROM dlock.kv WHERE key = $1", &[&key])
                        .unwrap()
                        .first()
                        .map_or(0, |r| String::from_utf8(r.get(0)).unwrap().parse().unwrap());
                    l.guarded_put(t, &key, (n + 1).to_string().as_bytes())
                        .unwrap();
                    tx.send((Instant::now(), t)).unwrap();
                    l.release().unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    for w in workers {
        w.join().unwrap();
    }
    let mut got: Vec<(Instant, Token)> = rx.iter().collect();
    got.sort();
    assert_eq!(got.len(), clients * rounds);
    for w in got.windows(2) {
        assert!(w[1].1 > w[0].1, "token {} after {}", w[1].1, w[0].1);
    }
    let sql = pg::Sql::connect(&s.url);
    let n: String = String::from_utf8(
        sql.query("SELECT value FROM dlock.kv WHERE key = $1", &[&key])
            .unwrap()[0]
            .get(0),
    )
    .unwrap();
    assert_eq!(n, (clients * rounds).to_string(), "a lost update");
}
