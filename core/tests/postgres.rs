//! The PostgreSQL backend on real servers (`scripts/test-postgres.sh`
//! starts them and runs these with `--ignored`): the lock protocol, the
//! server's clock deciding expiry, the key watch, `dlock.guard` in an
//! application's own transaction, a blackhole through the fault proxy, the
//! replication rule and bad input.
//!
//! Settings: TTL 4 s, keepalive every 1 s, timeout 0.5 s, retry every
//! 0.25 s, margin 1 s.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, Error, Options, State, Token};

use dlock_testkit::{INTERVAL, MARGIN, TIMEOUT, faults, fresh, pg, watch};
// Only the blackhole of the fault proxy is used here.
#[allow(dead_code)]
use dlock_testkit::proxy;

use pg::Sql;
use proxy::{Mode, Proxy};

/// Scheduling slack of a timing bound on a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(300);
/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(15);

fn client(url: &str) -> Client {
    pg::client(url, dlock_testkit::backend_options())
}

/// The lease of the row holding `name`.
fn lease_of(sql: &Sql, name: &str) -> i64 {
    let rows = sql
        .query("SELECT lease FROM dlock.locks WHERE name = $1", &[&name])
        .unwrap();
    assert_eq!(rows.len(), 1, "one row holds {name}");
    rows[0].get(0)
}

/// The server's clock runs past `lease`'s expiry (as if its holder had
/// paused past its TTL), without waiting for it.
fn expire(sql: &Sql, lease: i64) {
    sql.query(
        "UPDATE dlock.leases SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1",
        &[&lease],
    )
    .unwrap();
}

fn fences(lock: &dlock::Lock) -> mpsc::Receiver<(Instant, Token)> {
    let (tx, rx) = mpsc::channel();
    lock.on_fence(move |t, _| {
        let _ = tx.send((Instant::now(), t));
    });
    rx
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn acquire_release_contention_and_token_order() {
    let s = pg::servers();
    let (a, b) = (client(&s.url), client(&s.url));
    let name = fresh("pg/order");
    let la = a.lock(&name).unwrap();
    let lb = b.lock(&name).unwrap();
    let t1 = la.acquire(EVENT).unwrap();
    assert_eq!(lb.try_acquire().unwrap_err(), Error::WouldBlock);
    // Woken by NOTIFY, not by its timer (next due ~0.7 s after the release).
    let (lb, t2, _) = pg::woken_by_notify(&la, t1, lb, EVENT);
    assert_eq!(la.try_acquire().unwrap_err(), Error::WouldBlock);
    lb.release().unwrap();
    let t3 = la.acquire(EVENT).unwrap();
    assert!(t3 > t2, "{t3} after {t2}");
    la.release().unwrap();
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn keepalive_never_revives_an_expired_lease() {
    let s = pg::servers();
    let sql = Sql::connect(&s.url);
    let c = client(&s.url);
    let name = fresh("pg/revive");
    let lock = c.lock(&name).unwrap();
    let fenced = fences(&lock);
    let t1 = lock.acquire(EVENT).unwrap();
    let lease = lease_of(&sql, &name);
    expire(&sql, lease);
    // The next keepalive finds no live lease: fenced within one interval.
    let (_, t) = fenced
        .recv_timeout(INTERVAL + TIMEOUT + SLACK + Duration::from_secs(1))
        .expect("fenced after its lease expired on the server");
    assert_eq!(t, t1);
    let rows = sql
        .query(
            "SELECT expires_at > clock_timestamp() FROM dlock.leases WHERE id = $1",
            &[&lease],
        )
        .unwrap();
    assert!(
        rows.is_empty() || !rows[0].get::<_, bool>(0),
        "a keepalive revived the expired lease {lease}"
    );
    // Reacquired under a new lease with a higher token.
    watch::reacquired_above(&lock, t1, EVENT);
    assert_ne!(lease_of(&sql, &name), lease);
    lock.release().unwrap();
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn operator_delete_fences_within_one_round_trip() {
    let s = pg::servers();
    let sql = Sql::connect(&s.url);
    let c = client(&s.url);
    let name = fresh("pg/operator");
    let lock = c.lock(&name).unwrap();
    let fenced = fences(&lock);
    let t1 = lock.acquire(EVENT).unwrap();
    let took = pg::operator_delete_fences(&sql, &name, &fenced, t1, EVENT);
    println!(
        "FAULT|pg operator deletes the lock row|1|-|-|n/a|delete->fence {:.0}",
        took.as_secs_f64() * 1e3
    );
    watch::reacquired_above(&lock, t1, EVENT);
    lock.release().unwrap();
}

/// The point of this engine: the application's own transaction, guarded
/// by `dlock.guard`, holds off a takeover while it runs and is refused once
/// its token no longer holds.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn guard_refuses_a_stale_holder_in_its_own_transaction() {
    let s = pg::servers();
    let admin = Sql::connect(&s.url);
    admin
        .batch("CREATE TABLE IF NOT EXISTS guarded_jobs (name text PRIMARY KEY, writer bigint NOT NULL)")
        .unwrap();
    let name = fresh("pg/guard");
    let holder = pg::client(
        &s.url,
        Options {
            reacquire: false,
            ..dlock_testkit::backend_options()
        },
    );
    let h = holder.lock(&name).unwrap();
    let t1 = h.acquire(EVENT).unwrap();
    let old_app = Sql::connect(&s.url);
    let new_app = Sql::connect(&s.url);
    let write = |app: &Sql, token: Token| -> Result<(), tokio_postgres::Error> {
        app.batch("BEGIN")?;
        let r = app
            .query("SELECT dlock.guard($1, $2)", &[&name, &(token.get() as i64)])
            .and_then(|_| {
                app.query(
                    "INSERT INTO guarded_jobs VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET writer = excluded.writer",
                    &[&name, &(token.get() as i64)],
                )
            });
        match r {
            Ok(_) => app.batch("COMMIT"),
            Err(e) => {
                app.batch("ROLLBACK").unwrap();
                Err(e)
            }
        }
    };

    // 1. The holder's guarded transaction is open when its lease runs out
    // on the server: the contender waits until that transaction ends.
    old_app.batch("BEGIN").unwrap();
    old_app
        .query("SELECT dlock.guard($1, $2)", &[&name, &(t1.get() as i64)])
        .unwrap();
    expire(&admin, lease_of(&admin, &name));
    let contender = client(&s.url);
    let (tx, rx) = mpsc::channel();
    let n2 = name.clone();
    let waiter = thread::spawn(move || {
        let l = contender.lock(&n2).unwrap();
        let r = l.acquire(EVENT);
        tx.send(r.clone()).unwrap();
        (l, r, contender)
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(700)).is_err(),
        "a takeover while the holder's guarded transaction was open"
    );
    old_app
        .query(
            "INSERT INTO guarded_jobs VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET writer = excluded.writer",
            &[&name, &(t1.get() as i64)],
        )
        .unwrap();
    old_app.batch("COMMIT").unwrap();
    let t2 = rx
        .recv_timeout(EVENT)
        .expect("the contender acquires")
        .unwrap();
    assert!(t2 > t1);
    let (l2, _, _contender) = waiter.join().unwrap();

    // 2. The new holder writes; the old one, resuming, is refused.
    write(&new_app, t2).unwrap();
    let e = write(&old_app, t1).expect_err("a stale token's transaction committed");
    assert_eq!(
        e.code().map(|c| c.code()),
        Some(dlock::GUARD_SQLSTATE),
        "{e:?}"
    );
    let rows = admin
        .query("SELECT writer FROM guarded_jobs WHERE name = $1", &[&name])
        .unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), t2.get() as i64);
    l2.release().unwrap();
    drop(h);
}

/// A silent cut between the holder and the server: drain on the first
/// failed keepalive, fence at the deadline, at least about a margin before
/// the contender's token is issued; after the heal, acquired again higher.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn blackhole_drains_then_fences_before_the_contender() {
    let s = pg::servers();
    let runs: usize = std::env::var("DLOCK_FAULT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut drains = Vec::new();
    let mut leads = Vec::new();
    let mut broken = Vec::new();
    for run in 0..runs {
        let p = Proxy::start(pg::addr(&s.url));
        let holder = client(&pg::via(&s.url, p.addr()));
        let name = fresh("pg/blackhole");
        let h = holder.lock(&name).unwrap();
        let fenced = fences(&h);
        let (stx, srx) = mpsc::channel();
        h.on_state_change(move |c| {
            let _ = stx.send((Instant::now(), c.to));
        });
        let t1 = h.acquire(EVENT).unwrap();
        let (waiter, rx) = watch::contender(client(&s.url), &name, EVENT);
        thread::sleep(Duration::from_millis(200 + 300 * run as u64 % 800));
        let cut = Instant::now();
        p.set(Mode::Blackhole);
        let fence = fenced.recv_timeout(EVENT);
        let (acquired, r) = rx.recv_timeout(EVENT).expect("the contender acquires");
        p.set(Mode::Pass);
        waiter.join().unwrap();
        let drain = srx
            .try_iter()
            .find(|(t, st)| *t >= cut && *st == State::Draining)
            .map(|(t, _)| t - cut);
        match (&fence, &r) {
            (Ok((f, t)), Ok(t2)) => {
                assert_eq!(*t, t1);
                assert!(*t2 > t1);
                let lead = acquired.saturating_duration_since(*f);
                if acquired < *f {
                    broken.push(format!("run {run}: the contender acquired before on_fence"));
                } else if lead + SLACK < MARGIN {
                    broken.push(format!(
                        "run {run}: on_fence led the contender by {lead:?} only"
                    ));
                }
                leads.push(lead.as_secs_f64() * 1e3);
            }
            other => broken.push(format!("run {run}: fence/contender {other:?}")),
        }
        match drain {
            Some(d) if d <= INTERVAL + TIMEOUT + SLACK => drains.push(d.as_secs_f64() * 1e3),
            d => broken.push(format!("run {run}: drain {d:?} after the cut")),
        }
        let end = Instant::now() + EVENT;
        while h.token().is_none_or(|t| t <= t1) {
            if Instant::now() > end {
                broken.push(format!(
                    "run {run}: no reacquisition above {t1} after the heal"
                ));
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = h.release();
    }
    let lead = leads
        .iter()
        .copied()
        .min_by(f64::total_cmp)
        .map_or("n/a".into(), |l| format!("{l:.0}"));
    println!(
        "FAULT|pg blackhole|{runs}|{}|{}/{runs}|{lead}|",
        faults::spread(drains.clone()),
        drains.len()
    );
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn refuses_a_server_without_synchronous_replication() {
    let s = pg::servers();
    let connect = |url: &str| pg::connect(url, dlock_testkit::backend_options());
    match connect(&s.lone_url) {
        Err(Error::Backend(m)) => assert!(
            m.contains("synchronous") && m.contains("dlock_single_node"),
            "{m}"
        ),
        other => panic!(
            "a server without a standby was accepted: {:?}",
            other.map(|_| ())
        ),
    }
    match connect(&s.standby_url) {
        Err(Error::Backend(m)) => assert!(m.contains("standby"), "{m}"),
        other => panic!("a standby was accepted: {:?}", other.map(|_| ())),
    }
    // Declared a single node: accepted, and it works.
    let c = connect(&format!("{}?dlock_single_node=true", s.lone_url)).unwrap();
    let l = c.lock(&fresh("pg/single")).unwrap();
    l.acquire(EVENT).unwrap();
    l.release().unwrap();
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn bad_input_is_one_clear_error_before_anything_is_held() {
    let s = pg::servers();
    let connect = |url: &str| pg::connect(url, dlock_testkit::backend_options());
    match connect("postgres://127.0.0.1:notaport/db") {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("URL"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let wrong = s.url.replace(&s.password, "wrong-password");
    match connect(&wrong) {
        Err(Error::Backend(m)) => assert!(m.contains("password authentication failed"), "{m}"),
        other => panic!("a wrong password: {:?}", other.map(|_| ())),
    }
    match connect(&format!("{}?dlock_single_node=true", s.nocreate_url)) {
        Err(Error::Backend(m)) => assert!(
            m.contains("permission denied") && m.contains("CREATE on the database"),
            "{m}"
        ),
        other => panic!("a role without CREATE: {:?}", other.map(|_| ())),
    }
    match connect("postgres://dlock@127.0.0.1:1/dlock") {
        Err(Error::Backend(m)) => assert!(m.contains("127.0.0.1:1"), "{m}"),
        other => panic!("nothing listening: {:?}", other.map(|_| ())),
    }
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn from_env_picks_postgres_for_a_postgres_url() {
    let s = pg::servers();
    // SAFETY: this test binary reads DLOCK_ENDPOINTS nowhere else.
    unsafe { std::env::set_var("DLOCK_ENDPOINTS", &s.url) };
    let c =
        Client::connect(ClientConfig::from_env().with_options(dlock_testkit::backend_options()))
            .unwrap();
    unsafe { std::env::remove_var("DLOCK_ENDPOINTS") };
    let name = fresh("pg/env");
    let l = c.lock(&name).unwrap();
    l.acquire(EVENT).unwrap();
    let sql = Sql::connect(&s.url);
    lease_of(&sql, &name);
    l.release().unwrap();
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn tls_verifies_the_server_and_refuses_plaintext_and_a_wrong_ca() {
    let s = pg::servers();
    let (tls, ca, other) = (&s.tls_url, &s.ca, &s.other_ca);
    let connect = |url: String| pg::connect(&url, dlock_testkit::backend_options());
    // verify-full with the CA, SCRAM password: works, over TLS.
    let c = connect(format!(
        "{tls}?dlock_single_node=true&sslmode=verify-full&sslrootcert={ca}"
    ))
    .unwrap();
    let l = c.lock(&fresh("pg/tls")).unwrap();
    l.acquire(EVENT).unwrap();
    l.release().unwrap();
    // A CA that did not sign the server's certificate.
    match connect(format!(
        "{tls}?dlock_single_node=true&sslmode=verify-full&sslrootcert={other}"
    )) {
        Err(Error::Backend(m)) => assert!(m.to_lowercase().contains("certificate"), "{m}"),
        other => panic!("a wrong CA was accepted: {:?}", other.map(|_| ())),
    }
    // Plaintext to a server that takes this role over TLS only.
    match connect(format!("{tls}?dlock_single_node=true&sslmode=disable")) {
        Err(Error::Backend(m)) => assert!(m.contains("no encryption"), "{m}"),
        other => panic!("plaintext was accepted: {:?}", other.map(|_| ())),
    }
    // TLS without a CA file: refused before connecting.
    match connect(format!("{tls}?sslmode=require")) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("CA file"), "{m}"),
        other => panic!("TLS without a CA: {:?}", other.map(|_| ())),
    }
}

/// Issue 32, item 6: the guarded-write limits fit PostgreSQL: a key of
/// `MAX_KEY_LEN` bytes that does not compress (`dlock.kv`'s primary key, a
/// btree index whose rows hold at most 2,704 bytes) with a value of
/// `MAX_VALUE_LEN`, under the longest name, commits; one byte more of
/// either is refused `InvalidArgument`, naming the limit.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn guarded_writes_at_the_size_limits_commit_and_over_them_are_refused() {
    use dlock::MAX_KEY_LEN;
    use dlock::election::MAX_VALUE_LEN;
    let s = pg::servers();
    let prefix = fresh("pg/sized");
    let long = format!("{prefix}{}", "n".repeat(dlock::MAX_NAME_LEN - prefix.len()));
    let c = client(&s.url);
    let lock = c.lock(&long).unwrap();
    let token = lock.acquire(EVENT).unwrap();
    // Bytes that do not compress (an xorshift), so the index row is the
    // key's full size.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    let key: Vec<u8> = (0..MAX_KEY_LEN)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    lock.guarded_put(token, &key, &vec![b'v'; MAX_VALUE_LEN])
        .unwrap();
    lock.guarded_put(token, &key, b"again").unwrap();
    let mut longer = key.clone();
    longer.push(0);
    dlock_testkit::over_the_size_limits_refused(&lock, token, &key, &longer);
}

/// Holder identity (issue 31) on the primary: the lease row records it in
/// the same INSERT as the lease (column `holder`, schema version 3), and
/// another client's `holder()` reads it; a lease of an older library (no
/// holder) is reported with its key and lease only.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn holder_names_another_clients_identity() {
    let s = pg::servers();
    let config = dlock::PostgresConfig::parse(&s.url).unwrap();
    let a = Client::connect(
        ClientConfig::postgres(config)
            .with_options(dlock_testkit::backend_options())
            .with_description("pg batch 3"),
    )
    .unwrap();
    let b = client(&s.url);
    let name = fresh("pg/identity");
    let held = a.lock(&name).unwrap();
    let seen = b.lock(&name).unwrap();
    assert_eq!(seen.holder().unwrap(), None);
    let token = held.acquire(EVENT).unwrap();
    let h = seen.holder().unwrap().expect("held");
    let lease = held.session().lease().unwrap();
    assert_eq!((h.token, h.lease), (token, lease));
    assert_eq!(h.key, dlock::lock_key(&name, lease));
    let id = h.identity.expect("recorded with the lease");
    assert_eq!(Some(&*id), a.identity());
    assert_eq!(id.description.as_deref(), Some("pg batch 3"));
    assert_eq!(id.pid, std::process::id());

    // The row as a DBA sees it: the six fields, nothing else.
    let sql = Sql::connect(&s.url);
    let rows = sql
        .query(
            "SELECT (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(holder) k) \
             FROM dlock.leases WHERE id = $1",
            &[&lease],
        )
        .unwrap();
    let fields: Vec<String> = rows[0].get(0);
    assert_eq!(
        fields,
        ["description", "face", "host", "pid", "started", "version"]
    );
    // A lease without a holder (an older library's): key and lease only.
    sql.query(
        "UPDATE dlock.leases SET holder = NULL WHERE id = $1",
        &[&lease],
    )
    .unwrap();
    let h = seen.holder().unwrap().expect("held");
    assert_eq!((h.lease, h.identity), (lease, None));
    held.release().unwrap();
    assert_eq!(seen.holder().unwrap(), None);
}
